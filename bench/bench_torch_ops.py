"""The cost of one all_reduce called as a torch op, against every other way of calling one from
torch, measured in one run on the same processes (alternated rounds, medians).

Run:  python bench/bench_torch_ops.py [-n 2] [--sizes 8,1024,16384,65536,262144,1048576]
                                      [--dtypes float32,bfloat16] [--rounds 7] [--seconds 0.2]

  op          ``torch.ops.shmcomm.all_reduce_(t)`` (native kernel where built; "sum" and the
              default group are the defaults: DeepSpeed's call shape)
  op, shared  the op on a tensor from the group's shared memory (``pg.allocate_tensor``, as a
              decoder whose projections write into such a buffer would pass): zero copy from 4 KiB
  drop-in     ``shmcomm.torch_ops.all_reduce_(t)`` (eager: the core, no dispatcher)
  sc          ``shmcomm.all_reduce(t)`` on the same tensor, through the numpy-level API
  dist        ``dist.all_reduce(t)`` on the shmcomm backend
  DeepSpeed   ``torch.ops.deepspeed.inference_all_reduce_(t)`` where DeepSpeed is installed
              (``pip install deepspeed``; its bfloat16 kernel needs AVX-512BW)

Rank 0 prints microseconds per call and the ratios the README quotes: op / DeepSpeed, op / sc and
op, shared / DeepSpeed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import checkout  # noqa: E402 - bench/checkout.py, beside this script

checkout.use_checkout()
BENCH = os.path.dirname(os.path.abspath(__file__))


def _per_call(fn, seconds: float) -> float:
    """Seconds per call of ``fn()``, over a count of calls every rank agrees on (a rank that
    stopped early would leave its peer waiting)."""
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    for _ in range(20):  # the same count on every rank: calls are collectives
        fn()
    estimate = (time.perf_counter() - start) / 20
    count = torch.tensor([max(20, int(seconds / estimate))])
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    start = time.perf_counter()
    for _ in range(int(count)):
        fn()
    return (time.perf_counter() - start) / int(count)


def rank_main(rank: int, size: int, args) -> dict | None:
    import torch
    import torch.distributed as dist

    import shmcomm as sc
    import shmcomm.torch  # noqa: F401
    from shmcomm.torch_ops import all_reduce_, native

    sys.path.insert(0, BENCH)  # a rank runs this function only, not the script
    from bench_tp_decode import _start_deepspeed  # the same peer, started the same way

    torch.set_num_threads(1)
    dist.init_process_group("shmcomm")  # sc.spawn made shmcomm's own default group already
    ds_note = _start_deepspeed(size)
    have_ds = "deepspeed" in sys.modules
    rows, notes = [], {"native kernel": "yes" if native.load() else f"no ({native.why_not()})"}
    if not have_ds:
        notes["DeepSpeed"] = ds_note
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for nbytes in [int(b) for b in args.sizes.split(",")]:
            t = torch.ones(max(1, nbytes // dtype.itemsize), dtype=dtype)
            shared = dist.group.WORLD.allocate_tensor(t.numel(), dtype=dtype)  # collective
            ways = {"op": lambda: torch.ops.shmcomm.all_reduce_(t),
                    "op, shared": lambda: torch.ops.shmcomm.all_reduce_(shared),
                    "drop-in": lambda: all_reduce_(t),
                    "sc": lambda: sc.all_reduce(t),
                    "dist": lambda: dist.all_reduce(t)}
            if have_ds and not (dtype == torch.bfloat16 and ds_note):
                ways["DeepSpeed"] = lambda: torch.ops.deepspeed.inference_all_reduce_(t)
            times = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, fn in ways.items():
                    t.fill_(1)
                    shared.fill_(1)
                    times[name].append(_per_call(fn, args.seconds))
            if rank == 0:
                rows.append((dtype_name, nbytes, {k: statistics.median(v) for k, v in times.items()}))
    dist.destroy_process_group()
    return {"rows": rows, "notes": notes} if rank == 0 else None


def report(result: dict, args) -> None:
    import torch

    names = ["op", "op, shared", "drop-in", "sc", "dist", "DeepSpeed"]
    print(f"torch {torch.__version__}, {args.n} ranks, {os.cpu_count()} CPUs; us per call, medians of "
          f"{args.rounds} alternated rounds")
    print(f"{'dtype':9} {'bytes':>8} " + " ".join(f"{n:>10}" for n in names)
          + f" {'op/DS':>7} {'op/sc':>7} {'shared/DS':>9}")
    for dtype, nbytes, med in result["rows"]:
        cells = " ".join(f"{med[n] * 1e6:10.2f}" if n in med else f"{'-':>10}" for n in names)
        ds = f"{med['op'] / med['DeepSpeed']:7.2f}" if "DeepSpeed" in med else f"{'-':>7}"
        shared_ds = f"{med['op, shared'] / med['DeepSpeed']:9.2f}" if "DeepSpeed" in med else f"{'-':>9}"
        print(f"{dtype:9} {nbytes:8d} {cells} {ds} {med['op'] / med['sc']:7.2f} {shared_ds}")
    for what, note in result["notes"].items():
        print(f"{what}: {note}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2)
    parser.add_argument("--sizes", default="8,1024,16384,65536,262144,1048576", help="bytes per rank")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.2, help="per way, size and round")
    args = parser.parse_args(argv)
    sys.path.insert(0, BENCH)
    from bench_tp_decode import spawn_and_report

    spawn_and_report(rank_main, report, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
