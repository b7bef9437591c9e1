"""all_reduce (or ``--collective`` reduce_scatter, all_gather) composed inside each NUMA node first
(shmcomm/hierarchy/numa.py) against the flat paths, on ranks that ``shmrun --bind-to numa`` binds round
robin to the machine's NUMA nodes. Sizes are all ranks' data together.

Each round runs the same job twice, ``SHMCOMM_NUMA_BYTES=0`` (flat) and ``=1`` (every size
composed, so the table shows where the composition wins), alternating which goes first; a cell is
the median over rounds of the slowest rank's mean time per call. The table's last column is
composed / flat: below 1 the composition wins, and ``SHMCOMM_NUMA_BYTES``'s default (1 MiB) should
sit where it starts to.

On a machine with one NUMA node nothing composes (the script says so); ``--simulate K`` then
makes K blocks of ranks act as NUMA nodes, unbound, which measures only what the composition
costs, never what it saves. Private (not ``sc.empty``) float32 arrays, sum.

On a two-socket server the flat paths make every rank read about half its data from the other
socket; the composition only 1/L of it (L ranks per socket), for about one more pass through
each socket's own memory: it should win for large messages there. Until it is measured there,
that is a model, not a result.

Examples::

    python bench/bench_numa.py -n 32                    # a two-socket server: 16 ranks per node
    python bench/bench_numa.py -n 32 --collective reduce_scatter
    python bench/bench_numa.py -n 4 --simulate 2 --rounds 1 --sizes 1M,16M   # cost alone, here
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r"""
import json, os, statistics, sys, time
import numpy as np
import shmcomm as sc
from shmcomm import world

sc.init_process_group()
comm = world.default_group()._comm
rows = []
collective, n = sys.argv[2], sc.get_world_size()
for nbytes in map(int, sys.argv[1].split(",")):
    x = np.ones(max(n, nbytes // 4) // n * n, np.float32)  # all ranks' data: nbytes
    if os.environ.get("BENCH_ZERO_COPY"):  # the group's shared memory (sc.empty): zero copy
        x = sc.empty(x.size, np.float32)
        x[...] = 1.0
    piece = np.ones(x.size // n, np.float32)
    call = {"all_reduce": lambda: sc.all_reduce(x),
            "reduce_scatter": lambda: sc.reduce_scatter_into(piece, x),
            "all_gather": lambda: sc.all_gather_into(x, piece)}[collective]
    for _ in range(3):
        call()
    iters = max(3, min(200, int(0.2 / max(1e-6, 4e-10 * nbytes * sc.get_world_size()))))
    reps = []
    for _ in range(5):
        sc.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            call()
        took = np.array([(time.perf_counter() - t) / iters])
        sc.all_reduce(took, op="max")
        reps.append(float(took[0]))
    rows.append([nbytes, statistics.median(reps) * 1e6])
if sc.get_rank() == 0:
    levels = {type(level).__name__: level for level in comm.levels}
    numa, threads = levels.get("NumaLevel"), levels.get("ThreadsLevel")
    print("RESULT " + json.dumps({"rows": rows, "nodes": None if numa is None else numa.topology.nodes,
                                  "threads": 0 if threads is None else threads.threads,
                                  "composed_calls": sum(level.calls for level in comm.levels)}), flush=True)
sc.destroy_process_group()
"""


def parse_size(text: str) -> int:
    """``64K`` -> 65536."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale != 1 else text) * scale


def run(nranks: int, sizes: list[int], env: dict, collective: str, launch_args=()) -> dict:
    """One job of ``WORKER`` under shmrun with ``env`` added (and ``launch_args`` for shmrun):
    its rank 0's RESULT line."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **env)
    cmd = [sys.executable, "-m", "shmcomm.launch", "-n", str(nranks), *launch_args,
           sys.executable, "-c", WORKER, ",".join(map(str, sizes)), collective]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in done.stdout.splitlines():  # shmrun prefixes each line with "[rank] "
        if "RESULT " in line:
            return json.loads(line.partition("RESULT ")[2])
    raise SystemExit(f"the job failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


def alternate(rounds: int, ways: list[tuple[str, dict]], job) -> tuple[dict, dict]:
    """``rounds`` rounds of ``job(env)`` once per way (name, env), the order reversed every other
    round (a machine that drifts hurts both alike): each way's rows of times, and its last result."""
    times: dict[str, list[list[float]]] = {name: [] for name, _ in ways}
    last: dict[str, dict] = {}
    for r in range(rounds):
        for name, env in (ways if r % 2 == 0 else ways[::-1]):
            last[name] = job(env)
            times[name].append([t for _, t in last[name]["rows"]])
    return times, last


def print_table(sizes: list[int], times: dict, base: str, other: str, heading: str) -> None:
    """The medians over rounds of ``base`` and ``other`` per size, and their ratio."""
    print(f"| bytes | {base} us | {heading} us | ratio |")
    print("|---|---|---|---|")
    for i, nbytes in enumerate(sizes):
        a = statistics.median(row[i] for row in times[base])
        b = statistics.median(row[i] for row in times[other])
        print(f"| {nbytes} | {a:.1f} | {b:.1f} | {b / a:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--nranks", type=int, default=os.cpu_count())
    parser.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--collective", default="all_reduce",
                        choices=["all_reduce", "reduce_scatter", "all_gather"])
    parser.add_argument("--simulate", type=int, default=1, metavar="K",
                        help="K blocks of ranks act as NUMA nodes (unbound): the cost alone")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    from shmcomm.cpus import machine_numa_nodes

    print(f"# {args.collective}, {args.nranks} ranks, {os.cpu_count()} CPUs, {machine_numa_nodes()} NUMA node(s); "
          + (f"simulated: {args.simulate} blocks, unbound" if args.simulate > 1 else "shmrun --bind-to numa"))
    env, launch = {}, ["--bind-to", "numa"]
    if args.simulate > 1:
        env, launch = {"SHMCOMM_SIMULATE_NUMA": str(args.simulate)}, []
    ways = [("flat", dict(env, SHMCOMM_NUMA_BYTES="0")), ("numa", dict(env, SHMCOMM_NUMA_BYTES="1"))]
    times, last = alternate(args.rounds, ways,
                            lambda e: run(args.nranks, sizes, dict(e, SHMCOMM_RANK_THREADS="1"),
                                          args.collective, launch))
    nodes = last["numa"]["nodes"]
    if nodes is None:
        print("# nothing composed: the ranks are not bound to several NUMA nodes in nodes of equal "
              "size (two ranks or more each); try --simulate 2 to measure the cost alone")
    else:
        print(f"# NUMA nodes' ranks: {nodes}")
    print_table(sizes, times, "flat", "numa", "inside NUMA nodes first")


if __name__ == "__main__":
    main()
