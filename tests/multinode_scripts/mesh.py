"""DeviceMesh dimensions and new_group across 2 nodes x 2 ranks on the shmcomm backend: groups
whose ranks share a node stay pure shared memory, groups across nodes are hierarchical, and
every dimension's all_reduce gives the right sums."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from shmcomm.multinode import HierarchicalGroup


def kind(group) -> str:
    pg = group._get_backend(torch.device("cpu"))._pg
    return "hierarchical" if isinstance(pg, HierarchicalGroup) else "shared memory"


dist.init_process_group("shmcomm")
rank, size = dist.get_rank(), dist.get_world_size()
assert size == 4, size
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("node", "local"))
across, within = mesh.get_group("node"), mesh.get_group("local")
assert kind(dist.group.WORLD) == "hierarchical"
assert kind(within) == "shared memory", "a mesh dimension inside one node left shared memory"
assert kind(across) == "hierarchical"
for group, members in ((within, [rank // 2 * 2, rank // 2 * 2 + 1]), (across, [rank % 2, rank % 2 + 2])):
    t = torch.tensor([float(rank), 1.0], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    assert t.tolist() == [float(sum(members)), 2.0], (kind(group), members, t)
on_node0 = dist.new_group([0, 1])
if rank in (0, 1):
    assert kind(on_node0) == "shared memory", "new_group on one node is not pure shared memory"
    t = torch.ones(3)
    dist.all_reduce(t, group=on_node0)
    assert t.tolist() == [2.0] * 3, t
print(f"rank {rank} mesh ok", flush=True)
dist.destroy_process_group()
