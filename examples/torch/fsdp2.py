"""FSDP2 (``fully_shard``) on shmcomm, with a gradient divide factor (PREMUL_SUM) and FSDP's
communication buffers served from shared memory.

    shmrun -n 2 python examples/torch/fsdp2.py [--check]
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from _common import wants_check, assert_same, mlp, sgd_steps


def train(mesh, divide_factor=None, shared_buffers=False, sum_then_divide=False, steps: int = 4,
          width: int = 64) -> list:
    model = mlp(width)
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
    sgd_steps(model, steps, width)
    return [p.full_tensor() for p in model.parameters()]


if __name__ == "__main__":
    check = wants_check(__doc__)
    dist.init_process_group("shmcomm")
    world = dist.group.WORLD
    mesh = DeviceMesh.from_group(world, "cpu")
    plain = train(mesh)
    scaled = train(mesh, divide_factor=3.0)
    # 512 wide: each rank's piece is large enough for the collectives to work on peers' buffers
    # in place (zero copy) rather than through the group's slots
    backend = world._get_backend(torch.device("cpu"))
    in_place_before = backend._comm.zero_copy_calls
    shared = train(mesh, shared_buffers=True, width=512)
    in_place = backend._comm.zero_copy_calls - in_place_before
    if dist.get_rank() == 0:
        print(f"FSDP2 on shmcomm: {len(plain)} parameters on {dist.get_world_size()} ranks; "
              f"{backend._pool.created} shared buffers made, {in_place} collectives on them in place")
    if check:
        gloo = DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")
        assert_same(plain, train(gloo), "FSDP2")
        # gloo has no PREMUL_SUM: there FSDP2 sums, then divides by the factor
        assert_same(scaled, train(gloo, divide_factor=3.0, sum_then_divide=True),
                    "FSDP2 with a gradient divide factor")
        assert in_place > 0, "FSDP2's buffers from the process group never took the zero-copy path"
        assert_same(shared, train(mesh, width=512), "FSDP2 with buffers in shared memory",
                    against="its own run with private buffers")
    dist.destroy_process_group()
