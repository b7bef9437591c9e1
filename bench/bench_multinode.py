"""all_reduce across two simulated nodes of two ranks: shmcomm's hierarchy against plain gloo.

Run:  python bench/bench_multinode.py [--per-node 2] [--nodes 2] [--sizes 8,1K,...,32M] [--rounds 5]
                                      [--collective all_reduce|reduce_scatter|all_gather]
                                      [--launcher torchrun|shmrun]

Starts the nodes (shmcomm/multinode/simulated.py: namespaces with their own hostname and /dev/shm,
sharing loopback, under torchrun), then on every rank joins a default group on "shmcomm" (shared
memory inside each node, gloo between nodes) and a second group on plain "gloo" over the same
ranks, and times float32 ``dist.all_reduce`` of each size (or ``reduce_scatter_single`` /
``all_gather_single``, FSDP's pair: the size is then the whole input or output), alternating
the backends in rounds.
Rank 0 prints, per size, the median over rounds of the per-round mean (best round in brackets)
and the ratio shmcomm / gloo (lower is better; the goal at 32 MiB is <= 0.6).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import checkout  # noqa: E402

checkout.use_checkout()  # this checkout where built in place, else the installed shmcomm

from shmcomm.bench.sizes import parse_size  # noqa: E402 - after the path is set

SIZES = "8,1K,64K,1M,8M,32M"


def _collective(name: str, count: int, dist):
    """``(call(group), check())`` for ``name`` on about ``count`` float32 elements: ``call`` runs
    it once; ``check`` runs it on the default (shmcomm) group and asserts the result."""
    import torch

    size, rank = dist.get_world_size(), dist.get_rank()
    # torch 2.13 renamed the single-tensor forms (the old names warn); older torch has only those
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if name == "all_reduce":
        t = torch.ones(count)

        def check():
            t.fill_(1.0)
            dist.all_reduce(t)
            assert torch.all(t == float(size)), "shmcomm's all_reduce gave a wrong result"
        return (lambda g: dist.all_reduce(t, group=g)), check
    piece = max(1, count // size)
    whole, part = torch.ones(piece * size), torch.empty(piece)
    if name == "reduce_scatter":
        def check():
            whole.copy_(torch.arange(piece * size, dtype=torch.float32))
            reduce_scatter(part, whole)
            want = torch.arange(rank * piece, (rank + 1) * piece, dtype=torch.float32) * size
            assert torch.equal(part, want), "shmcomm's reduce_scatter gave a wrong result"
        return (lambda g: reduce_scatter(part, whole, group=g)), check

    def check():
        part.fill_(float(rank))
        all_gather(whole, part)
        want = torch.arange(size, dtype=torch.float32).repeat_interleave(piece)
        assert torch.equal(whole, want), "shmcomm's all_gather gave a wrong result"
    return (lambda g: all_gather(whole, part, group=g)), check


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    import shmcomm.torch  # noqa: F401 - registers "shmcomm"

    torch.set_num_threads(1)
    dist.init_process_group("shmcomm")
    groups = {"shmcomm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rows = []
    for label in args.sizes.split(","):
        nbytes = parse_size(label)
        call, check = _collective(args.collective, max(1, nbytes // 4), dist)
        iters = max(3, min(200, (64 << 20) // max(nbytes, 1) // 8))
        times = {name: [] for name in groups}
        for name, g in groups.items():  # warm-up
            call(g)
        for _ in range(args.rounds):
            for name, g in groups.items():
                dist.barrier(group=g)
                start = time.perf_counter()
                for _ in range(iters):
                    call(g)
                times[name].append((time.perf_counter() - start) / iters)
        check()
        rows.append((label, times))
    if dist.get_rank() == 0:
        from shmcomm.multinode import HierarchicalGroup

        backend = groups["shmcomm"]._get_backend(torch.device("cpu"))
        nodes = backend._pg.topology.describe() if isinstance(backend._pg, HierarchicalGroup) else "one node"
        print(f"torch {torch.__version__}, {dist.get_world_size()} ranks ({nodes}), {os.cpu_count()} CPUs, "
              f"{args.rounds} rounds alternating the backends; float32 {args.collective}, ms per call; "
              f"{args.launcher}, THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')}")
        print(f"{'size':>6} {'shmcomm':>17} {'gloo':>17} {'ratio':>7}")
        for label, times in rows:
            ours, theirs = (statistics.median(times[n]) * 1e3 for n in ("shmcomm", "gloo"))
            best = {n: min(times[n]) * 1e3 for n in times}
            goal = "  goal <= 0.6" if label == "32M" and args.collective == "all_reduce" else ""
            print(f"{label:>6} {ours:8.3f} [{best['shmcomm']:6.3f}] {theirs:8.3f} [{best['gloo']:6.3f}] "
                  f"{ours / theirs:7.3f}{goal}", flush=True)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--per-node", type=int, default=2)
    parser.add_argument("--sizes", default=SIZES, help="comma list, e.g. 8,1K,1M,32M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--collective", default="all_reduce",
                        choices=["all_reduce", "reduce_scatter", "all_gather"])
    parser.add_argument("--launcher", default="torchrun", choices=["torchrun", "shmrun"],
                        help="what starts each node's ranks (shmrun also sets THP_MEM_ALLOC_ENABLE=1)")
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:  # a rank started by torchrun
        rank_main(args)
        return 0
    from shmcomm.multinode.simulated import finish, refusal, start_nodes

    why = refusal()
    if why:
        print(f"skipped: simulated nodes cannot run here ({why})")
        return 0
    nodes = start_nodes(os.path.abspath(__file__), [args.per_node] * args.nodes, *sys.argv[1:],
                        launcher=args.launcher)
    results = finish(nodes, 1800.0)
    for k, (rc, out) in enumerate(results):
        lines = [line for line in out.splitlines() if "Unable to resolve hostname" not in line
                 and not line.startswith(("W1", "*"))]
        if k == 0 or rc != 0:
            print("\n".join(lines))
        if rc != 0:
            print(f"node {k} failed with exit code {rc}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
