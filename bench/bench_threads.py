"""all_reduce split over each rank's own threads (shmcomm/hierarchy/threads.py) against one thread
a rank, at sizes from 64 KiB: the tensor-parallel inference layout, few ranks that own many cores
each (one rank per socket or NUMA node; unbound ranks each take their share of the cores).

Each round runs the same job twice, ``SHMCOMM_RANK_THREADS=1`` (one thread a rank, the flat
paths) and ``=T`` with ``SHMCOMM_THREADS_BYTES=1`` (every size split, so the table shows where
splitting wins and where ``SHMCOMM_THREADS_BYTES``'s default, 1 MiB, should sit), alternating
which goes first; a cell is the median over rounds of the slowest rank's mean time per call, and
the last column is split / one thread (below 1 the threads win). Private float32 arrays, sum
(``--zero-copy``: ``sc.empty`` ones, which the lanes reduce in place); sizes are each rank's
array.

On this 2-core VM two ranks own a core each, so T threads a rank only take turns on it: the
table measures what splitting costs, never what it gains. DeepSpeed's op, the peer that uses
every core of a rank, is ``shmcomm-bench all_reduce -n 2 --backends shmcomm,deepspeed``.

Examples::

    python bench/bench_threads.py -n 2 --threads 8              # 16 cores: 8 a rank
    python bench/bench_threads.py -n 2 --threads 8 --bind-to numa  # a rank per NUMA node
    python bench/bench_threads.py -n 2 --threads 2 --rounds 1 --sizes 1M   # the cost alone, here
"""

from __future__ import annotations

import argparse
import os

from bench_numa import alternate, parse_size, print_table, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--nranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=max(2, (os.cpu_count() or 2) // 2),
                        help="threads a rank (SHMCOMM_RANK_THREADS) in the split runs")
    parser.add_argument("--sizes", default="64K,256K,1M,4M,16M,32M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bind-to", default="none", choices=["none", "numa", "socket"])
    parser.add_argument("--zero-copy", action="store_true",
                        help="sc.empty arrays (each lane's piece zero copy) instead of private ones")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    print(f"# all_reduce, {args.nranks} ranks, {os.cpu_count()} CPUs, shmrun --bind-to {args.bind_to}; "
          f"{args.threads} threads a rank split every size; "
          f"{'sc.empty arrays (zero copy)' if args.zero_copy else 'private arrays'}")
    arrays = {"BENCH_ZERO_COPY": "1"} if args.zero_copy else {}
    ways = [("one thread", {"SHMCOMM_RANK_THREADS": "1", **arrays}),
            ("split", {"SHMCOMM_RANK_THREADS": str(args.threads), "SHMCOMM_THREADS_BYTES": "1", **arrays})]
    times, last = alternate(args.rounds, ways,
                            lambda env: run(args.nranks, sizes,
                                            dict(env, SHMCOMM_NUMA_BYTES="0"), "all_reduce",
                                            ["--bind-to", args.bind_to]))
    print(f"# threads a rank in the split runs: {last['split']['threads']} "
          f"(calls split: {last['split']['composed_calls']})")
    print_table(sizes, times, "one thread", "split", f"{args.threads} threads a rank")


if __name__ == "__main__":
    main()
