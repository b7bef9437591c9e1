"""DistributedDataParallel on shmcomm: an unchanged DDP script that names the backend.

    shmrun -n 2 python examples/torch/ddp.py [--check]

The only shmcomm-specific word is ``"shmcomm"`` in ``init_process_group``.
"""

import torch
import torch.distributed as dist

from _common import wants_check, assert_same, mlp, sgd_steps


def train(group=None, steps: int = 5) -> list:
    model = torch.nn.parallel.DistributedDataParallel(mlp(), process_group=group)
    sgd_steps(model, steps)
    return [p.detach().clone() for p in model.parameters()]


if __name__ == "__main__":
    check = wants_check(__doc__)
    dist.init_process_group("shmcomm")
    params = train()
    if dist.get_rank() == 0:
        print(f"DDP on shmcomm: {len(params)} parameter tensors trained on {dist.get_world_size()} ranks")
    if check:
        assert_same(params, train(dist.new_group(backend="gloo")), "DDP")
    dist.destroy_process_group()
