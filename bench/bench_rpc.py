"""RPC latency and throughput: shmcomm.rpc against torch.distributed.rpc (TensorPipe) on one machine.

Two worker processes per backend (started by ``sc.spawn``); worker0 calls worker1. Cases:

* ``sync_small``   rpc_sync of a small call (operator.add of two ints), per call
* ``sync_1MiB``    rpc_sync with a 1 MiB float32 tensor argument (returns its element count)
* ``async_pipe``   many rpc_async small calls issued back to back, then waited for; per call

The backends run in alternating phases (shmcomm, torch, shmcomm, torch, ... ``--phases`` each),
never at the same time: idle TensorPipe workers busy-poll a whole core each, which would slow
the other backend down. Every phase starts fresh workers, runs one uncounted warm-up round and
``--rounds`` counted rounds per case; the median of all counted rounds is reported, so a burst of
load from other processes on a shared machine does not decide the result::

    python bench/bench_rpc.py                      # both backends
    python bench/bench_rpc.py --backend shmcomm --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import operator
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.path.splitext(os.path.basename(__file__))[0]
CASES = ("sync_small", "sync_1MiB", "async_pipe")
GOALS = {"sync_small": 0.05, "sync_1MiB": 0.2, "async_pipe": 0.1}   # shmcomm / torch


def numel(t) -> int:
    """Callee of sync_1MiB: touches nothing, returns a small value."""
    return t.numel()


def _calls(case: str, args) -> int:
    return {"sync_small": args.calls, "sync_1MiB": max(20, args.calls // 10),
            "async_pipe": args.calls * 2}[case]


def _round(rpc, wait_all, numel, case: str, n: int, tensor) -> float:
    """Run ``n`` calls of ``case`` (``numel``: the callee of sync_1MiB); microseconds per call."""
    t0 = time.perf_counter()
    if case == "sync_small":
        for _ in range(n):
            rpc.rpc_sync("worker1", operator.add, args=(1, 2))
    elif case == "sync_1MiB":
        for _ in range(n):
            rpc.rpc_sync("worker1", numel, args=(tensor,))
    else:
        wait_all([rpc.rpc_async("worker1", operator.add, args=(1, 2)) for _ in range(n)])
    return (time.perf_counter() - t0) / n * 1e6


def _phase(rank: int, size: int, backend: str, plan: list, rounds: int) -> dict | None:
    """One worker of one phase (started by sc.spawn): join ``backend``'s RPC group; worker0 runs,
    for each ``(case, calls)`` of ``plan``, one warm-up round and ``rounds`` counted rounds and
    returns {case: [microseconds per call, one per counted round]}; worker1 serves (None)."""
    import torch

    torch.set_num_threads(1)
    # Both RPC backends pickle a function by reference (module and name): the callee must be
    # importable on both workers, so take it from this script imported as a module, not from the
    # copy of it that came with this function.
    sys.path.insert(0, HERE)
    numel = importlib.import_module(MODULE).numel
    if backend == "shmcomm":
        import shmcomm as sc
        from shmcomm import rpc

        rpc.init_rpc(f"worker{rank}", timeout=120.0)   # rank, world size, job: the launcher's
        wait_all = sc.wait_all
    else:
        from torch.distributed import rpc

        # env:// rendezvous on the launcher's MASTER_ADDR and MASTER_PORT
        opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=120)
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=size, rpc_backend_options=opts)
        wait_all = torch.futures.wait_all
    result = None
    if rank == 0:
        tensor = torch.ones(1 << 18, dtype=torch.float32)   # 1 MiB
        result = {}
        for case, n in plan:
            _round(rpc, wait_all, numel, case, n, tensor)   # warm-up round, not counted
            result[case] = [_round(rpc, wait_all, numel, case, n, tensor) for _ in range(rounds)]
    rpc.shutdown()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="shmcomm,torch", help="comma list: shmcomm, torch")
    parser.add_argument("--calls", type=int, default=2000, help="calls per round (sync_small)")
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds per case and phase")
    parser.add_argument("--phases", type=int, default=3, help="phases per backend, alternating")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    names = []
    for name in (b.strip() for b in args.backend.split(",") if b.strip()):
        if name == "torch":
            try:
                import torch.distributed.rpc as trpc

                if not trpc.is_available():
                    raise ImportError("torch.distributed.rpc is not available in this build")
            except ImportError as exc:
                print(f"torch: skipped ({exc})")
                continue
        elif name != "shmcomm":
            parser.error(f"unknown backend {name!r}")
        names.append(name)
    import shmcomm as sc

    plan = [(case, _calls(case, args)) for case in CASES]
    rounds = {name: {case: [] for case in CASES} for name in names}
    for phase in range(args.phases):
        for name in (names if phase % 2 == 0 else names[::-1]):
            got = sc.spawn(_phase, 2, args=(name, plan, args.rounds), timeout=args.timeout)[0]
            for case in CASES:
                rounds[name][case] += got[case]
            print(f"# phase {phase + 1} {name}: " + ", ".join(
                f"{case} {statistics.median(rounds[name][case][-args.rounds:]):.1f} us"
                for case in CASES), flush=True)
    results = {name: {case: {"median_us": statistics.median(v), "rounds_us": v,
                             "calls_per_round": _calls(case, args)}
                      for case, v in per.items()} for name, per in rounds.items()}
    both = {"shmcomm", "torch"} <= set(results)
    print(f"\n{'case':<12} " + " ".join(f"{name + ' (us)':>16}" for name in results) +
          ("   ratio   goal" if both else ""))
    for case in CASES:
        row = f"{case:<12} " + " ".join(f"{results[name][case]['median_us']:>16.1f}" for name in results)
        if both:
            ratio = results["shmcomm"][case]["median_us"] / results["torch"][case]["median_us"]
            row += f"   {ratio:5.3f}x  <= {GOALS[case]}x {'met' if ratio <= GOALS[case] else 'MISSED'}"
        print(row)
    print(f"\n(median of {args.phases} x {args.rounds} rounds per case; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
