"""Ranks started from plain Python with ``sc.spawn`` (no launcher): a Monte Carlo estimate of pi,
each rank drawing its own samples and the counts summed with ``all_reduce``.

    python examples/spawn_monte_carlo.py --ranks 4

The same works in a notebook: ``sc.spawn`` ships the function by value, so one defined in a cell
runs on every rank.
"""

import argparse

import numpy as np

import shmcomm as sc


def estimate_pi(rank: int, nprocs: int, samples: int) -> float:
    """Rank ``rank``'s share of the samples; returns the estimate every rank agrees on."""
    rng = np.random.default_rng(1234 + rank)
    points = rng.random((samples, 2))
    hits = np.array([np.count_nonzero((points ** 2).sum(axis=1) <= 1.0)], dtype=np.int64)
    sc.all_reduce(hits)  # the total over every rank, on every rank
    return 4.0 * float(hits[0]) / (samples * nprocs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--samples", type=int, default=1_000_000, help="per rank")
    args = parser.parse_args()
    estimates = sc.spawn(estimate_pi, args.ranks, args=(args.samples,))
    assert len(set(estimates)) == 1, estimates  # every rank computed the same total
    print(f"pi ~ {estimates[0]:.5f} from {args.ranks} ranks x {args.samples} samples "
          f"(error {abs(estimates[0] - np.pi):.1e})")
