"""Every torch.distributed operation on the shmcomm backend, checked for values; run under a
launcher (torchrun or shmrun), unchanged from what a user would write.

Prints "rank R ok N checks" at the end; any failure raises (non-zero exit).
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import run_all  # noqa: E402

dist.init_process_group(os.environ.get("TORCH_BACKEND", "shmcomm"))
assert dist.get_backend() == os.environ.get("TORCH_BACKEND", "shmcomm"), dist.get_backend()
count = run_all(dist.get_rank(), dist.get_world_size())
rank = dist.get_rank()
dist.destroy_process_group()

if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
    # A second incarnation on the same store (torchrun's agent store outlives the group): the
    # default group gets the same name again and must still get a segment of its own. (With a
    # plain env:// store, re-initializing races the old store server torch tears down.)
    dist.init_process_group(os.environ.get("TORCH_BACKEND", "shmcomm"))
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(dist.get_world_size()))), t
    count += 1
    dist.destroy_process_group()
print(f"rank {rank} ok {count} checks", flush=True)
