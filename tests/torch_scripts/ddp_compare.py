"""DDP on shmcomm and on gloo in one job: the parameters must agree to float32 tolerance.

Run under torchrun or shmrun; prints "rank R ddp ok" on success.
"""
import os
import sys

import torch.distributed as dist
from torch.testing import assert_close

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import train_ddp  # noqa: E402

dist.init_process_group("shmcomm")
gloo = dist.new_group(backend="gloo")
ours = train_ddp(dist.get_rank())
theirs = train_ddp(dist.get_rank(), group=gloo)
for a, b in zip(ours, theirs):
    assert_close(a, b, rtol=1e-5, atol=1e-6)
print(f"rank {dist.get_rank()} ddp ok", flush=True)
dist.destroy_process_group()
