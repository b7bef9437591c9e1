"""Two commits of shmcomm, measured in alternated launches: did a change make a size faster or
slower?

The machine this project is measured on (a 2-core VM) moves between states 2-6x apart every few
seconds, so two runs one after the other compare the states, not the code. This script builds
each commit in a worktree of its own (once; later runs reuse it), then launches the same
measurement (2 ranks, or ``-n``) from each in turn, ``--launches`` times, starting with the
other tree every second time. Each launch reports, per collective and size, the median of 5 rounds of a tight loop; the
table gives the median over launches and every launch's figure, so pairs taken in the same
state can be read side by side.

Run from the repository root::

    python bench/bench_before_after.py HEAD~1                  # against the working tree
    python bench/bench_before_after.py 5565d10~1 5565d10 --kinds all_reduce,broadcast \\
        --sizes 4K,16K,64K,128K --launches 6

Output (us per call; ratio = after / before)::

    kind       bytes    before     after  ratio  per launch before | after
    all_reduce 131072    19.74     11.33   0.57  [19.4, 19.4, 20.1, 27.0] | [11.0, 11.7, 10.8, 12.2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # this checkout's shmcomm.bench, for its size parser

from shmcomm.bench.sizes import parse_size  # noqa: E402 - shmcomm-bench's: K/M/G (x1024)

TREES = os.path.join(REPO, "build", "before_after")

# One launch: N ranks (sc.spawn), each kind and size timed in a tight loop; rank 0 prints JSON.
LAUNCH = r'''
import json, statistics, sys, time
import numpy as np
import shmcomm as sc

SIZES = [int(x) for x in sys.argv[1].split(",")]
KINDS = sys.argv[2].split(",")


def calls(kind, nbytes, world):
    a = np.ones(max(nbytes // 4, 1), np.float32)
    if kind == "all_reduce":
        return lambda: sc.all_reduce(a)
    if kind == "broadcast":
        return lambda: sc.broadcast(a, src=0)
    if kind == "all_gather":
        out = np.empty(a.size * world, np.float32)
        return lambda: sc.all_gather_into(out, a)
    if kind == "reduce_scatter":
        whole = np.ones(a.size * world, np.float32)
        return lambda: sc.reduce_scatter_into(a, whole)
    if kind == "scatter":
        parts = [np.ones(a.size, np.float32) for _ in range(world)] if sc.get_rank() == 0 else None
        return lambda: sc.scatter(a, parts, src=0)
    if kind == "barrier":
        return sc.barrier
    raise SystemExit(f"unknown kind {kind!r}")


def rank(r, world):
    out = {}
    for kind in KINDS:
        for nbytes in SIZES:
            call = calls(kind, nbytes, world)
            reps = max(20, int(2e5 / (nbytes / 1024 + 4)))
            for _ in range(reps // 4):
                call()
            rounds = []
            for _ in range(5):
                sc.barrier()
                t = time.perf_counter()
                for _ in range(reps // 5):
                    call()
                rounds.append((time.perf_counter() - t) / (reps // 5) * 1e6)
            out[f"{kind} {nbytes}"] = statistics.median(rounds)
    return out


print(json.dumps(sc.spawn(rank, int(sys.argv[3]))[0]))
'''


def tree(ref: str | None) -> str:
    """A directory holding ``ref`` built in place (None: this working tree, as it is)."""
    if ref is None:
        return REPO
    found = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", "--quiet", ref + "^{commit}"],
                           capture_output=True, text=True)
    if found.returncode:
        raise SystemExit(f"bench_before_after: {ref!r} names no commit of this repository")
    sha = found.stdout.strip()
    path = os.path.join(TREES, sha[:12])
    if not os.path.isdir(path):
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", path, sha], check=True,
                       stdout=subprocess.DEVNULL)
    built = os.path.join(path, ".built")
    if not os.path.exists(built):
        print(f"building {ref} ({sha[:12]}) in {os.path.relpath(path, REPO)} ...", file=sys.stderr)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=path,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open(built, "w").close()
    return path


def launch(path: str, sizes: str, kinds: str, ranks: int = 2) -> dict:
    env = dict(os.environ, PYTHONPATH=path)
    done = subprocess.run([sys.executable, "-c", LAUNCH, sizes, kinds, str(ranks)], env=env, cwd=path,
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"a launch from {path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="commit measured first (a git ref)")
    parser.add_argument("after", nargs="?", help="commit measured second (default: the working tree)")
    parser.add_argument("--sizes", default="8,4K,16K,64K,128K,1M", help="comma list, K/M/G (x1024)")
    parser.add_argument("--kinds", default="all_reduce",
                        help="comma list of all_reduce, broadcast, all_gather, reduce_scatter, barrier")
    parser.add_argument("--launches", type=int, default=6, help="launches of each tree (default 6)")
    parser.add_argument("-n", "--ranks", type=int, default=2, help="ranks (default 2)")
    args = parser.parse_args(argv)
    sizes = ",".join(str(parse_size(s)) for s in args.sizes.split(","))
    paths = {"before": tree(args.before), "after": tree(args.after)}
    results: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(args.launches):
        for which in (("before", "after") if i % 2 == 0 else ("after", "before")):
            results[which].append(launch(paths[which], sizes, args.kinds, args.ranks))
    print(f"# before {args.before}, after {args.after or 'the working tree'}: {args.ranks} ranks, {args.launches} "
          f"alternated launches each; us per call (each launch: the median of 5 rounds)")
    print(f"{'kind':<15}{'bytes':>10}{'before':>10}{'after':>10}{'ratio':>7}  per launch before | after")
    for key in results["before"][0]:
        kind, nbytes = key.split()
        b = [r[key] for r in results["before"]]
        a = [r[key] for r in results["after"]]
        print(f"{kind:<15}{nbytes:>10}{statistics.median(b):>10.2f}{statistics.median(a):>10.2f}"
              f"{statistics.median(a) / statistics.median(b):>7.2f}  "
              f"{[round(x, 2) for x in b]} | {[round(x, 2) for x in a]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
