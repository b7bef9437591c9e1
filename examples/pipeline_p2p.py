"""A pipeline over point-to-point messages: rank 0 feeds micro-batches, every middle rank is a
stage, the last rank collects, and each result is checked against numpy on the last rank.

Stages overlap: a stage posts the receive of micro-batch k+1 (``irecv``) before it works on
micro-batch k, and sends without waiting (``isend``) while it goes on::

    shmrun -n 4 python examples/pipeline_p2p.py --micro-batches 16
"""

import argparse

import numpy as np

import shmcomm as sc


def stage(x: np.ndarray, index: int) -> np.ndarray:
    """Stage ``index``'s work: a small, exactly checkable transform."""
    return np.tanh(x * (index + 1.0)) + index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=16)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()

    sc.init_process_group()
    rank, size = sc.get_rank(), sc.get_world_size()
    if size < 2:
        raise SystemExit("a pipeline needs at least 2 ranks: shmrun -n 4 ...")
    shape, n = (args.rows, args.width), args.micro_batches
    inputs = [np.random.default_rng(k).standard_normal(shape) for k in range(n)]

    if rank == 0:  # the feeder: sends every micro-batch without waiting for the stage
        sends = [sc.isend(x, dst=1, tag=k) for k, x in enumerate(inputs)]
        for w in sends:
            w.wait()
    else:
        buffers = [np.empty(shape), np.empty(shape)]
        pending = sc.irecv(buffers[0], src=rank - 1, tag=0)
        sends, results = [], []
        for k in range(n):
            pending.wait()
            current = buffers[k % 2]
            if k + 1 < n:  # the next receive runs while this micro-batch is worked on
                pending = sc.irecv(buffers[(k + 1) % 2], src=rank - 1, tag=k + 1)
            y = stage(current, rank)
            if rank < size - 1:
                sends.append(sc.isend(y, dst=rank + 1, tag=k))
                if len(sends) > 2:  # bounded: at most two sends in flight
                    sends.pop(0).wait()
            else:
                results.append(y)
        for w in sends:
            w.wait()
        if rank == size - 1:
            for k, (x, got) in enumerate(zip(inputs, results)):
                want = x
                for s in range(1, size):
                    want = stage(want, s)
                np.testing.assert_allclose(got, want, rtol=0, atol=0, err_msg=f"micro-batch {k}")
            print(f"pipeline: {n} micro-batches of {args.rows}x{args.width} through {size - 1} "
                  f"stage(s); every result equals numpy's")
    sc.destroy_process_group()


if __name__ == "__main__":
    main()
