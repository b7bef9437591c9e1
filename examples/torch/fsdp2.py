"""FSDP2 (``fully_shard``) on shmcomm, with a gradient divide factor (PREMUL_SUM) and FSDP's
communication buffers served from shared memory.

    shmrun -n 2 python examples/torch/fsdp2.py [--check]
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from _common import wants_check, assert_same, mlp, sgd_steps


def train(mesh, divide_factor=None, shared_buffers=False, sum_then_divide=False, steps: int = 4) -> list:
    model = mlp()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in (*model, model):
        if divide_factor is not None:   # FSDP2 then reduce-scatters with ReduceOp.PREMUL_SUM
            module.set_gradient_divide_factor(divide_factor)
        if shared_buffers:              # all-gather/reduce-scatter buffers from the process group
            module.set_allocate_memory_from_process_group_for_comm(True)
        if sum_then_divide:             # what gloo needs: it has no PREMUL_SUM
            module.set_force_sum_reduction_for_comms(True)
    sgd_steps(model, steps)
    return [p.full_tensor() for p in model.parameters()]


if __name__ == "__main__":
    check = wants_check(__doc__)
    dist.init_process_group("shmcomm")
    world = dist.group.WORLD
    mesh = DeviceMesh.from_group(world, "cpu")
    plain = train(mesh)
    scaled = train(mesh, divide_factor=3.0)
    shared = train(mesh, shared_buffers=True)
    if dist.get_rank() == 0:
        print(f"FSDP2 on shmcomm: {len(plain)} parameters on {dist.get_world_size()} ranks; "
              f"{world._get_backend(torch.device('cpu'))._pool.created} shared buffers made")
    if check:
        gloo = DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")
        assert_same(plain, train(gloo), "FSDP2")
        # gloo has no PREMUL_SUM: there FSDP2 sums, then divides by the factor
        assert_same(scaled, train(gloo, divide_factor=3.0, sum_then_divide=True),
                    "FSDP2 with a gradient divide factor")
        assert_same(shared, plain, "FSDP2 with buffers in shared memory")
    dist.destroy_process_group()
