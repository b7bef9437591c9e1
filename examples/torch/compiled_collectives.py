"""Functional collectives inside ``torch.compile(fullgraph=True)`` on shmcomm.

    shmrun -n 2 python examples/torch/compiled_collectives.py [--check]

The compiled graph calls the collectives as ops (``_c10d_functional``); the backend serves them
like any other call. ``--check`` compares with the same function run eagerly on gloo.
"""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from _common import wants_check, assert_same


def step(x: torch.Tensor, group) -> list:
    total = funcol.all_reduce(x, "sum", group)
    mean = funcol.all_reduce(x * 2, "avg", group)
    gathered = funcol.all_gather_tensor(x, 0, group)
    scattered = funcol.reduce_scatter_tensor(gathered * 3, "sum", 0, group)
    swapped = funcol.all_to_all_single(gathered, None, None, group)
    return [total + 1, mean, gathered, scattered, swapped]


if __name__ == "__main__":
    check = wants_check(__doc__)
    dist.init_process_group("shmcomm")
    x = torch.arange(8.0) + dist.get_rank()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    results = [funcol.wait_tensor(t) for t in compiled(x, dist.group.WORLD)]
    if dist.get_rank() == 0:
        print(f"compiled functional collectives on {dist.get_world_size()} ranks: total {results[0].tolist()}")
    if check:
        gloo = dist.new_group(backend="gloo")
        assert_same(results, [funcol.wait_tensor(t) for t in step(x, gloo)], "compiled collectives")
    dist.destroy_process_group()
