"""shmcomm-bench with a plot: all_reduce from 8 B to 4 MiB on 2 ranks, shmcomm against gloo
(when torch is installed), as a table and a PNG. Needs matplotlib (``pip install 'shmcomm[plot]'``).

    python examples/bench_with_plot.py --plot all_reduce.png

It is the same as typing::

    shmcomm-bench all_reduce -n 2 -b 8 -e 4M --backend shmcomm,gloo --plot all_reduce.png
"""

import argparse
import sys

from shmcomm.bench import main as shmcomm_bench

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", default="all_reduce.png")
    parser.add_argument("--max-bytes", default="4M")
    parser.add_argument("--iters", default="20")
    args = parser.parse_args()
    sys.exit(shmcomm_bench(["all_reduce", "-n", "2", "-b", "8", "-e", args.max_bytes,
                            "--iters", args.iters, "--backend", "shmcomm,gloo", "--plot", args.plot]))
