"""CPU burnt by a rank that waits for a late peer: rank 0 enters an 8-byte all_reduce at once,
rank 1 only after ``--late`` seconds; rank 0's CPU time (all its threads) over the wall time of the
call is reported as a percentage of one core. Open MPI (mpi4py under mpirun) is measured too when
installed: its shared-memory waits poll, so expect about 100 %::

    python bench/bench_blocked_cpu.py               # shmcomm, then MPI if available
    python bench/bench_blocked_cpu.py --late 5 --backend shmcomm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import checkout  # noqa: E402 - bench/checkout.py, beside this script

checkout.use_checkout()  # this checkout where built in place, else the installed shmcomm


def _blocked_call(rank: int, late: float, all_reduce, barrier) -> dict | None:
    """Both ranks sync, rank 1 sleeps ``late`` s; rank 0's (cpu, wall) seconds inside the call."""
    import numpy as np

    x = np.ones(2, np.float32)
    barrier()
    if rank == 1:
        time.sleep(late)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    all_reduce(x)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    assert x[0] == 2.0, x
    return {"cpu_s": cpu, "wall_s": wall, "core_percent": 100 * cpu / wall} if rank == 0 else None


def _shmcomm_rank(rank: int, size: int, late: float) -> dict | None:
    import shmcomm as sc

    return _blocked_call(rank, late, sc.all_reduce, sc.barrier)


def run_shmcomm(late: float) -> dict:
    import shmcomm as sc

    # The ranks import shmcomm afresh: make it this checkout's too.
    return sc.spawn(_shmcomm_rank, 2, args=(late,), timeout=late + 60)[0]


def _mpi_rank(late: float) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    result = _blocked_call(comm.Get_rank(), late, lambda x: comm.Allreduce(MPI.IN_PLACE, x), comm.Barrier)
    if result:
        print(json.dumps(result), flush=True)


def run_mpi(late: float) -> dict | str:
    """MPI's figure, or why it was skipped."""
    mpirun = shutil.which("mpirun")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "skipped: mpi4py is not installed"
    if mpirun is None:
        return "skipped: no mpirun on PATH"
    cmd = [mpirun, "-n", "2"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    proc = subprocess.run(cmd + [sys.executable, __file__, "--mpi-rank", "--late", str(late)],
                          capture_output=True, text=True, timeout=late + 120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else f"failed: {proc.stderr.strip()[-500:]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--late", type=float, default=2.0, help="seconds rank 1 arrives late (default 2)")
    p.add_argument("--backend", default="shmcomm,mpi", help="comma-separated: shmcomm,mpi")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--mpi-rank", action="store_true", help=argparse.SUPPRESS)  # one rank under mpirun
    args = p.parse_args(argv)
    if args.mpi_rank:
        _mpi_rank(args.late)
        return 0
    results = {}
    for backend in args.backend.split(","):
        results[backend] = run_shmcomm(args.late) if backend == "shmcomm" else run_mpi(args.late)
        r = results[backend]
        if isinstance(r, dict):
            print(f"{backend:<8} waited {r['wall_s']:.2f} s, used {r['cpu_s'] * 1000:.1f} ms of CPU: "
                  f"{r['core_percent']:.2f} % of a core")
        else:
            print(f"{backend:<8} {r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"late_s": args.late, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
