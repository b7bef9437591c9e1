"""all_reduce in a loop on the torch backend across nodes, until a node is killed (run by
tests/test_multinode.py): prints "looping" once every rank has finished a first round."""
import time

import torch
import torch.distributed as dist

dist.init_process_group("shmcomm")
t = torch.ones(1 << 16)
deadline = time.monotonic() + 120
for i in range(1_000_000):
    dist.all_reduce(t)
    t.fill_(1.0)
    if i == 20:
        dist.barrier()
        print("looping", flush=True)
    if time.monotonic() > deadline:
        break
    time.sleep(0.01)
dist.destroy_process_group()
