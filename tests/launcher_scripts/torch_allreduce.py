"""An unchanged torch.distributed script: env:// rendezvous, gloo, one all_reduce."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():g}")
dist.destroy_process_group()
