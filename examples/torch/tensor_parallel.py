"""DTensor tensor parallelism on shmcomm: a column- then row-parallel MLP, and redistributions
between shardings (all-gather, reduce-scatter, all-to-all under the hood).

    shmrun -n 2 python examples/torch/tensor_parallel.py [--check]
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from _common import wants_check, assert_same, batch


def run(mesh) -> list:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = batch(0)  # tensor parallelism: every rank feeds the same batch
    out = model(x)
    out.square().mean().backward()
    grads = [p.grad.full_tensor() for p in model.parameters()]
    t = distribute_tensor(torch.arange(48.0).reshape(6, 8), mesh, [Shard(0)])
    moved = [t.redistribute(mesh, [Replicate()]).to_local(),
             t.redistribute(mesh, [Shard(1)]).full_tensor(),          # shard dim 0 -> 1: all-to-all
             t.redistribute(mesh, [Replicate()]).redistribute(mesh, [Shard(1)]).to_local()]
    partial = torch.distributed.tensor.DTensor.from_local(torch.full((4,), dist.get_rank() + 1.0), mesh,
                                                          [Partial("avg")])
    return [out.detach(), *grads, *moved, partial.redistribute(mesh, [Replicate()]).to_local()]


if __name__ == "__main__":
    check = wants_check(__doc__)
    dist.init_process_group("shmcomm")
    results = run(DeviceMesh.from_group(dist.group.WORLD, "cpu"))
    if dist.get_rank() == 0:
        print(f"tensor-parallel MLP on {dist.get_world_size()} ranks: output {tuple(results[0].shape)}")
    if check:
        assert_same(results, run(DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")), "DTensor")
    dist.destroy_process_group()
