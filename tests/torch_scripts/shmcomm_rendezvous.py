"""A torch job that meets with init_method="shmcomm://" (shmcomm/torch_rendezvous.py): an
all_reduce and a new_group (which uses the store the rendezvous made), checked against the sum
the ranks' values must give. ``python shmcomm_rendezvous.py`` under a launcher; ``... RANK SIZE
JOB``: the rank, size and job as arguments (torch's rank=/world_size=, the URL's job=)."""
import sys

import torch
import torch.distributed as dist

if len(sys.argv) > 1:
    rank, size, job = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("shmcomm", init_method=f"shmcomm://?job={job}", rank=rank, world_size=size)
else:
    dist.init_process_group("shmcomm", init_method="shmcomm://")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((5,), float(rank + 1))
dist.all_reduce(t)
assert t.tolist() == [size * (size + 1) / 2] * 5, t
pair = dist.new_group([0, size - 1])
u = torch.full((3,), float(rank))
if rank in (0, size - 1):
    dist.all_reduce(u, group=pair)
    assert u.tolist() == [float(size - 1)] * 3, u
dist.destroy_process_group()
print(f"rendezvous ok rank {rank} of {size}", flush=True)
