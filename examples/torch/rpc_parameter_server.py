"""A parameter server over shmcomm.rpc (the semantics of ``torch.distributed.rpc``): rank 0 holds
the weights; trainers pull them with ``rpc_sync``, push gradients with ``rpc_async``, and the
tensors travel through shared memory.

    shmrun -n 3 python examples/torch/rpc_parameter_server.py [--check]

``--check`` checks that the weights ended between the trainers' targets (each trainer pulls them
towards its own; where between depends on how the trainers' pushes interleaved).
"""

import os
import threading

import torch

from shmcomm import rpc
from _common import wants_check

_weights = torch.zeros(8)
_lock = threading.Lock()


def get_weights() -> torch.Tensor:
    with _lock:
        return _weights.clone()


def push_gradient(grad: torch.Tensor, lr: float) -> None:
    with _lock:
        _weights.sub_(lr * grad)


def target(trainer: int) -> torch.Tensor:
    return torch.arange(8.0) * (trainer + 1)


def main() -> None:
    check = wants_check(__doc__)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"worker{rank}")
    steps, lr = 20, 0.1
    if rank > 0:
        for _ in range(steps):
            w = rpc.rpc_sync("worker0", get_weights)
            grad = 2 * (w - target(rank))            # d/dw |w - target|^2
            rpc.rpc_async("worker0", push_gradient, args=(grad, lr)).wait()
    rpc.shutdown()  # waits for every worker: all pushes are in
    if rank == 0:
        print(f"parameter server after {steps} steps of {world - 1} trainers: {get_weights()[:4].tolist()}")
        if check:
            targets = torch.stack([target(t) for t in range(1, world)])
            w = get_weights()
            assert bool(((w >= targets.min(0).values - 0.05) & (w <= targets.max(0).values + 0.05)).all()), w
            print("parameter server: weights converged between the trainers' targets")


if __name__ == "__main__":
    main()
