"""RPC latency and throughput: shmcomm.rpc against torch.distributed.rpc (TensorPipe) on one machine.

Two worker processes per backend; worker0 calls worker1. Cases:

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
import json
import multiprocessing as mp
import operator
import os
import socket
import statistics
import sys
import time
import uuid

CASES = ("sync_small", "sync_1MiB", "async_pipe")
GOALS = {"sync_small": 0.05, "sync_1MiB": 0.2, "async_pipe": 0.1}   # shmcomm / torch


def numel(t) -> int:
    """Callee of sync_1MiB: touches nothing, returns a small value."""
    return t.numel()


def _calls(case: str, args) -> int:
    return {"sync_small": args.calls, "sync_1MiB": max(20, args.calls // 10),
            "async_pipe": args.calls * 2}[case]


def _round(rpc, wait_all, case: str, n: int, tensor) -> float:
    """Run ``n`` calls of ``case``; microseconds per call."""
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


def _worker(backend: str, rank: int, job: str, port: int, conn) -> None:
    import torch

    torch.set_num_threads(1)
    try:
        if backend == "shmcomm":
            import shmcomm as sc
            from shmcomm import rpc

            rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, job=job, timeout=120.0)
            wait_all = sc.wait_all
        else:
            from torch.distributed import rpc

            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(port)
            opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=120)
            rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
            wait_all = torch.futures.wait_all
        conn.send(("ready", None))
        if rank == 0:
            tensor = torch.ones(1 << 18, dtype=torch.float32)   # 1 MiB
            while True:
                cmd = conn.recv()
                if cmd is None:
                    break
                case, n = cmd
                conn.send(("ok", _round(rpc, wait_all, case, n, tensor)))
        rpc.shutdown()
        conn.send(("done", None))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        import traceback

        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Backend:
    """Two spawned workers of one backend; rank 0 runs rounds on request."""

    def __init__(self, name: str, ctx, timeout: float):
        self.name, self.timeout = name, timeout
        job, port = f"bench-rpc-{uuid.uuid4().hex[:8]}", _free_port()
        self.conns, self.procs = [], []
        for rank in range(2):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(name, rank, job, port, child), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def _get(self, rank: int):
        if not self.conns[rank].poll(self.timeout):
            raise RuntimeError(f"{self.name}: worker{rank} did not answer within {self.timeout} s")
        status, value = self.conns[rank].recv()
        if status == "error":
            raise RuntimeError(f"{self.name}: worker{rank} failed:\n{value}")
        return value

    def ready(self) -> None:
        for rank in range(2):
            self._get(rank)

    def run(self, case: str, n: int) -> float:
        self.conns[0].send((case, n))
        return self._get(0)

    def close(self) -> None:
        try:
            self.conns[0].send(None)
            for rank in range(2):
                self._get(rank)
        finally:
            for p in self.procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join()


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
    ctx = mp.get_context("spawn")
    rounds = {name: {case: [] for case in CASES} for name in names}
    for phase in range(args.phases):
        for name in (names if phase % 2 == 0 else names[::-1]):
            b = _Backend(name, ctx, args.timeout)
            try:
                b.ready()
                for case in CASES:
                    n = _calls(case, args)
                    b.run(case, n)   # warm-up round, not counted
                    rounds[name][case] += [b.run(case, n) for _ in range(args.rounds)]
            finally:
                b.close()
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
