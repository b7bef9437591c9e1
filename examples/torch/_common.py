"""What the torch examples share: a small model, and a check against the same job on gloo.

Every example trains or runs with ``shmcomm`` and, with ``--check``, repeats the work on a gloo
group over the same ranks and asserts both give the same numbers (the tests run them so).
"""

import argparse

import torch
import torch.distributed as dist


def wants_check(doc: str) -> bool:
    """The example's one flag: ``--check`` repeats the work on gloo and compares."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="repeat on gloo and assert the same results")
    return parser.parse_args().check


def mlp(width: int = 64, layers: int = 3, seed: int = 0) -> torch.nn.Sequential:
    """``layers`` Linear+ReLU blocks of ``width``, seeded so every rank builds the same one."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())
                                 for _ in range(layers)])


def batch(rank: int, rows: int = 16, width: int = 64) -> torch.Tensor:
    """Rank ``rank``'s input: different on every rank, the same on every run."""
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(100 + rank))


def sgd_steps(model: torch.nn.Module, steps: int, width: int = 64) -> None:
    """``steps`` SGD steps of this rank's batch through ``model`` (mean square of the output)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = batch(dist.get_rank(), width=width)
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def assert_same(shm: list, reference: list, what: str, against: str = "gloo") -> None:
    """shmcomm's tensors agree with the reference run's to float32 rounding (reduction order
    may differ)."""
    for a, b in zip(shm, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if dist.get_rank() == 0:
        print(f"{what}: shmcomm matches {against} ({len(shm)} tensors)")
