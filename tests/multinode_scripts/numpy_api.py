"""The numpy API across simulated nodes (run by tests/test_multinode.py under torchrun): every
collective against numpy references, several dtypes, ops and sizes, async too.

Prints "rank R numpy ok N" at the end; any failure raises (non-zero exit).
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import shmcomm as sc  # noqa: E402
from reference import assert_same_bits, make_input, reduce_reference  # noqa: E402



def close_or_same(got, expected, what):
    """Floats: across nodes the sum order is node by node, not one rank-order pass, and half
    types round between the two stages (values here are below 8: two float16 ulps there)."""
    if got.dtype.kind == "f":
        half = got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                                   rtol=2e-3 if half else 1e-5, atol=8e-3 if half else 1e-5, err_msg=what)
    else:
        assert_same_bits(got, expected, what)


pg = sc.init_process_group()
assert isinstance(pg, sc.multinode.HierarchicalGroup), pg
rank, size, checked = pg.rank, pg.size, 0
for dtype in map(np.dtype, (np.float32, np.float64, np.float16, np.int16, np.int64, np.uint32, np.bool_)):
    ops = ["SUM", "MAX", "MIN"] + (["AVG"] if dtype.kind == "f" else []) + \
          (["BXOR"] if dtype.kind in "iu" else [])
    for count in (0, 1, 7, 300_001):
        inputs = [make_input(dtype, count, r) for r in range(size)]
        for op in ops:
            x = inputs[rank].copy()
            sc.all_reduce(x, op=sc.ReduceOp[op])
            close_or_same(x, reduce_reference(inputs, op), f"all_reduce {dtype} {op} {count}")
            checked += 1
        everyone = np.empty(count * size, dtype)
        sc.all_gather_into(everyone, inputs[rank])
        assert_same_bits(everyone, np.concatenate(inputs), f"all_gather_into {dtype} {count}")
        b = inputs[rank].copy()
        sc.broadcast(b, src=size - 1)
        assert_same_bits(b, inputs[size - 1], f"broadcast {dtype} {count}")
        checked += 2
    whole = [make_input(dtype, 5 * size, r, salt=1) for r in range(size)]
    out = np.empty(5, dtype)
    op = "MAX" if dtype == np.bool_ else "SUM"
    sc.reduce_scatter_into(out, whole[rank], op=sc.ReduceOp[op])
    close_or_same(out, reduce_reference(whole, op)[rank * 5:(rank + 1) * 5], f"reduce_scatter {dtype}")
    checked += 1
# async, reduce (other ranks unchanged), barrier, all_to_all, gather/scatter, point to point
x = np.full(1000, rank + 1.0)
work = sc.all_reduce(x, async_op=True)
assert work.wait() and (x == size * (size + 1) / 2).all()
y = np.full(3, rank + 1.0)
sc.reduce(y, dst=1)
assert (y == (size * (size + 1) / 2 if rank == 1 else rank + 1.0)).all(), y
if rank == 0:
    time.sleep(0.3)
start = time.monotonic()
sc.barrier()  # holds every rank, on every node, until rank 0 arrives
assert rank == 0 or time.monotonic() - start >= 0.25, "barrier returned before rank 0 arrived"
outs = [np.empty(2, np.int32) for _ in range(size)]
sc.all_to_all(outs, [np.full(2, rank * 10 + q, np.int32) for q in range(size)])
assert all((o == q * 10 + rank).all() for q, o in enumerate(outs)), outs
g = [np.empty(1) for _ in range(size)] if rank == 0 else None
sc.gather(np.full(1, float(rank)), g, dst=0)
assert rank != 0 or [a[0] for a in g] == list(range(size))
if rank == 0:
    sc.send(np.arange(4.0), dst=size - 1, tag=5)
    sc.send(np.arange(3.0), dst=size - 1, tag=6)
elif rank == size - 1:
    buf = np.empty(4)
    assert sc.recv(buf, src=None, tag=5) == 0 and (buf == np.arange(4.0)).all()
    work = sc.irecv(np.empty(3), src=0, tag=6)  # a handle between nodes, waited as any Work
    assert sc.wait_any([work]) == 0
    [got] = sc.wait_all([work])
    assert (got[0] == np.arange(3.0)).all() and work.source_rank() == 0, got
# uneven counts across nodes: rank q holds q + 1 elements
counts = [q + 1 for q in range(size)]
packed = np.concatenate([np.full(q + 1, float(q)) for q in range(size)])
whole = np.empty(sum(counts))
sc.all_gather_v(whole, np.full(rank + 1, float(rank)), counts)
assert (whole == packed).all(), whole
lists = [np.empty(q + 1) for q in range(size)]
sc.all_gather(lists, np.full(rank + 1, float(rank)))
assert all((o == q).all() for q, o in enumerate(lists)), lists
g = np.empty(sum(counts)) if rank == size - 1 else None
sc.gather_v(np.full(rank + 1, float(rank)), g, counts, dst=size - 1)
assert rank != size - 1 or (g == packed).all(), g
mine = np.empty(rank + 1)
sc.scatter_v(mine, packed * 2 if rank == 1 else None, counts, src=1)
assert (mine == 2.0 * rank).all(), mine
mine = np.empty(rank + 1, np.float32)
sc.reduce_scatter_v(mine, np.arange(sum(counts), dtype=np.float32) * (rank + 1), counts)
lo = sum(counts[:rank])
assert (mine == np.arange(lo, lo + rank + 1) * size * (size + 1) / 2).all(), mine
sc.reduce_scatter(mine, [np.ones(q + 1, np.float32) for q in range(size)], op=sc.ReduceOp.MAX)
assert (mine == 1).all(), mine
objs = [None] * size
sc.all_gather_object(objs, {"rank": rank})
assert objs == [{"rank": r} for r in range(size)]
checked += 14
# sub-groups: one across nodes (hierarchical or, one rank per node, gloo), one inside a node
# (pure shared memory), group ranks as in MPI
across = sc.new_group([0, size - 1])
within = sc.new_group([0, 1]) if len(pg.topology.nodes[0]) > 1 else None
if rank in (0, size - 1):
    x = np.full(3, rank + 1.0)
    sc.all_reduce(x, group=across)
    assert (x == size + 1.0).all(), x
    b = np.full(2, float(rank))
    sc.broadcast(b, src=1, group=across)  # group rank 1 is rank size - 1
    assert (b == size - 1.0).all(), b
else:
    assert across is None
if within is not None and rank in (0, 1):
    assert getattr(within, "topology", None) is None, "a sub-group inside one node left shared memory"
    y = np.full(4, rank + 1.0)
    sc.all_reduce(y, group=within)
    assert (y == 3.0).all(), y
    checked += 1
rail = sc.split(rank % 2, key=rank)  # one rank of every node: a group across nodes
z = np.full(2, float(rank))
sc.all_reduce(z, group=rail)
assert (z == float(sum(r for r in range(size) if r % 2 == rank % 2))).all(), z
checked += 3
for dtype in map(np.dtype, (np.float64, np.int32)):  # MPI's prefix reductions across nodes
    inputs = [make_input(dtype, 1001, r, salt=9) for r in range(size)]
    x, y = inputs[rank].copy(), inputs[rank].copy()
    sc.scan(x, op="max")
    assert_same_bits(x, reduce_reference(inputs[:rank + 1], "MAX"), f"scan {dtype}")
    sc.exscan(y, async_op=True).wait()
    close_or_same(y, reduce_reference(inputs[:rank], "SUM") if rank else np.zeros_like(inputs[0]), f"exscan {dtype}")  # rank 0: SUM's identity
    checked += 2
print(f"rank {rank} numpy ok {checked} on {len(pg.topology.nodes)} nodes", flush=True)
sc.destroy_process_group()
