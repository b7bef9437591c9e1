"""Data-parallel least squares over shared memory: the shmcomm demo.

Each rank holds its own shard of a synthetic regression problem. Gradient descent averages the
ranks' gradients with one all_reduce per step, so every rank ends with the same weights; then the
ranks all_gather their per-shard errors and rank 0 prints the fit next to the true weights.

Run it with the launcher (every rank is a process)::

    shmrun -n 4 python examples/data_parallel_regression.py --steps 200
"""

import argparse
import hashlib
import time

import numpy as np

import shmcomm as sc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--rows-per-rank", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    sc.init_process_group()
    rank, size = sc.get_rank(), sc.get_world_size()

    # Rank 0 draws the true weights and broadcasts them; every rank draws its own data shard.
    true_w = np.random.default_rng(0).standard_normal(args.features) if rank == 0 else np.empty(args.features)
    sc.broadcast(true_w, src=0)
    rng = np.random.default_rng(1 + rank)
    x = rng.standard_normal((args.rows_per_rank, args.features))
    y = x @ true_w + 0.01 * rng.standard_normal(args.rows_per_rank)

    w = np.zeros(args.features)
    grad = np.empty(args.features)
    start = time.perf_counter()
    for _ in range(args.steps):
        np.dot(x.T, x @ w - y, out=grad)
        grad /= args.rows_per_rank
        sc.all_reduce(grad, op=sc.ReduceOp.AVG)  # identical bits on every rank
        w -= args.lr * grad
    elapsed = time.perf_counter() - start

    shard_mse = np.array([np.mean((x @ w - y) ** 2)])
    all_mse = np.empty(size)
    sc.all_gather_into(all_mse, shard_mse)
    digests = [None] * size
    sc.all_gather_object(digests, hashlib.sha256(w.tobytes()).hexdigest())
    if rank == 0:
        print(f"{size} ranks x {args.rows_per_rank} rows, {args.features} features, {args.steps} steps "
              f"in {elapsed:.2f} s")
        print(f"max |w - true_w| = {np.abs(w - true_w).max():.2e}")
        print("per-rank MSE:", " ".join(f"{m:.2e}" for m in all_mse))
        print("weights identical on every rank:", len(set(digests)) == 1)
    sc.destroy_process_group()


if __name__ == "__main__":
    main()
