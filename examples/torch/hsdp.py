"""HSDP on a 2-D mesh (replicate x shard), every dimension on shmcomm, or mixed with gloo by
DeviceMesh's ``backend_override``.

    shmrun -n 4 python examples/torch/hsdp.py [--check]
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from _common import wants_check, assert_same, mlp, sgd_steps


def train(mesh, steps: int = 3) -> list:
    model = mlp()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sgd_steps(model, steps)
    return [p.full_tensor() for p in model.parameters()]


if __name__ == "__main__":
    check = wants_check(__doc__)
    dist.init_process_group("shmcomm")
    shape, names = (2, dist.get_world_size() // 2), ("replicate", "shard")
    params = train(init_device_mesh("cpu", shape, mesh_dim_names=names))
    mixed = train(init_device_mesh("cpu", shape, mesh_dim_names=names, backend_override={"replicate": "gloo"}))
    if dist.get_rank() == 0:
        print(f"HSDP on a {shape[0]}x{shape[1]} shmcomm mesh: {len(params)} parameters")
    if check:
        gloo = init_device_mesh("cpu", shape, mesh_dim_names=names,
                                backend_override={"replicate": "gloo", "shard": "gloo"})
        assert_same(params, train(gloo), "HSDP")
        assert_same(mixed, params, "HSDP with gloo across replicas, shmcomm within",
                    against="all-shmcomm HSDP")
    dist.destroy_process_group()
