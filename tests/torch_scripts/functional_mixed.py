"""Functional collectives of four kinds in flight together, checked against values computed here.

The async-engine issue's reproducer: this crashed the heap ("double free or corruption", SIGSEGV)
in 10 runs of 10 when every call wrote its pointer tables on the shared communicator. Run under a
launcher: ``shmrun -n 2 python functional_mixed.py [iterations]``. Prints "rank R ok N" at the end.
"""
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

dist.init_process_group("shmcomm")
r, ws = dist.get_rank(), dist.get_world_size()
g = dist.group.WORLD
iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 50
for i in range(iterations):
    x = torch.arange(8, dtype=torch.float32) + r + i
    a = fc.all_reduce(x, "sum", g)
    b = fc.all_gather_tensor(x, 0, g)
    c = fc.reduce_scatter_tensor(torch.ones(8 * ws) * (i + 1), "sum", 0, g)
    d = fc.all_to_all_single(torch.arange(ws * 2, dtype=torch.float32) + 100 * r, None, None, g)
    base = torch.arange(8, dtype=torch.float32) + i
    assert torch.equal(fc.wait_tensor(a), base * ws + sum(range(ws))), (i, a)
    assert torch.equal(fc.wait_tensor(b), torch.cat([base + q for q in range(ws)])), (i, b)
    assert torch.equal(fc.wait_tensor(c), torch.full((8,), float(ws * (i + 1)))), (i, c)
    want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * q for q in range(ws)])
    assert torch.equal(fc.wait_tensor(d), want), (i, d)
dist.destroy_process_group()
print(f"rank {r} ok {iterations}")
