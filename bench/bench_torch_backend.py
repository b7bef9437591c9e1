"""torch.distributed on the shmcomm backend vs gloo, measured in one run on the same processes.

Run:  python bench/bench_torch_backend.py [-n 2] [--iters 7000] [--steps 70] [--batch 32] [--rounds 7]
                                         [--pin] [--large-count 8388608] [--large-iters 10]
                                         [--dtypes float32,float16,bfloat16]

Starts ``n`` ranks (env:// rendezvous on a free port), each joining a default group on "shmcomm"
and a second group on "gloo" over the same ranks, then measures, alternating between the two
backends in rounds so that machine noise hits both alike:

  all_reduce(2 x float32)   ``dist.all_reduce`` of a 2-element tensor: microseconds per call
  functional all_reduce     ``funcol.all_reduce`` of 8 KiB + ``wait_tensor`` (eager), and the same
                            two ``_c10d_functional`` ops called as a compiled graph calls them
  FSDP2 step                forward + backward + SGD step of a 5-layer 512-wide MLP, each layer and
                            the root ``fully_shard``-ed
  TP forward                a 256-1024-256 MLP, column- then row-parallel (DTensor), batch 8
  DDP step                  forward + backward + SGD step of a ~1.3M-parameter MLP wrapped in
                            ``DistributedDataParallel`` (default buckets): milliseconds per step
  all_reduce(8M x dtype)    ``dist.all_reduce`` of a large tensor of each ``--dtypes`` dtype
                            (half precision is what CPU training reduces): milliseconds per call

Each figure is the median over rounds of the per-round mean (the best round in brackets); rank 0
prints them with the ratio of medians shmcomm / gloo (lower is better) and the goals from the
issue (<= 0.05 and <= 0.77). On a busy machine the medians move a lot between runs: a rank that
loses its CPU stalls its peer, which costs a shared-memory backend more than a socket one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


import checkout  # noqa: E402 - bench/checkout.py, beside this script

checkout.use_checkout()  # this checkout where built in place, else the installed shmcomm


def _mlp():
    import torch

    torch.manual_seed(0)
    # 1024*1024 + 1024 + 1024*256 + 256 + 256*16 + 16 = 1,316,112 parameters
    return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256),
                               torch.nn.ReLU(), torch.nn.Linear(256, 16))


def _time_allreduce(dist, group, iters: int) -> float:
    import torch

    t = torch.ones(2)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - start) / iters


def _time_large(dist, group, t, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - start) / iters


def _agreement(ours, theirs, world: int) -> str:
    """How close two backends' results are, said so that a reader knows what to expect: the same
    bits at two ranks (both add the two values in one order); at three or more, gloo sums in ring
    order and shmcomm in rank order, so the last bits may differ (floating-point addition is not
    associative), and the largest difference shows whether that is all it is."""
    import torch

    if all(torch.equal(a, b) for a, b in zip(ours, theirs)):
        return "identical bits"
    ours, theirs = [a.detach() for a in ours], [b.detach() for b in theirs]
    abs_diff = max(float((a.double() - b.double()).abs().max()) for a, b in zip(ours, theirs))
    rel_diff = max(float(((a.double() - b.double()).abs() / b.double().abs().clamp_min(1e-30)).max())
                   for a, b in zip(ours, theirs))
    why = ("expected at 3+ ranks: gloo reduces in ring order, shmcomm in rank order"
           if world >= 3 else "NOT expected at 2 ranks: report it")
    return f"differ by at most {abs_diff:.3g} (relative {rel_diff:.3g}); {why}"


def _time_ddp(ddp, opt, batch, steps: int) -> float:
    import torch

    x, y = batch
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return (time.perf_counter() - start) / steps


_NULL_GROUP = None


def _null_backend_group(dist):
    """A group (made once, by every rank) on a backend whose all_reduce does nothing and returns
    one completed Work: what ``dist.all_reduce`` and the functional ops cost with no backend
    work at all, torch's own layers (the floor under any backend written in Python, shmcomm's
    included)."""
    global _NULL_GROUP
    if _NULL_GROUP is not None:
        return _NULL_GROUP

    class NullWork(dist.Work):
        def wait(self, timeout=None):
            return True

    class NullGroup(dist.ProcessGroup):
        def __init__(self, rank, size):
            super().__init__(rank, size)
            self._done, self._name = NullWork(), ""

        def getBackendName(self):  # noqa: N802 - torch's names
            return "benchnull"

        def getGroupName(self):  # noqa: N802 - the functional ops find the group by its name
            return self._name

        def setGroupName(self, name):  # noqa: N802
            self._name = name

        def allreduce(self, tensors, opts=None):
            return self._done

        # FSDP2's collectives (all_gather_into_tensor, reduce_scatter_tensor): its step on this
        # backend is its compute and FSDP2's own work, with no communication
        def all_gather_single(self, output, input, opts=None):  # noqa: A002 - torch's names
            return self._done

        def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
            return self._done

        # the names torch before 2.10 calls them by
        _allgather_base, _reduce_scatter_base = all_gather_single, reduce_scatter_single

        def barrier(self, opts=None):  # _measure's, between rounds: nothing to wait for
            return self._done

    if "BENCHNULL" not in dist.Backend._plugins:
        dist.Backend.register_backend("benchnull", lambda store, rank, size, timeout: NullGroup(rank, size),
                                      devices=["cpu"])
    _NULL_GROUP = dist.new_group(backend="benchnull")
    return _NULL_GROUP


def _time_funcol(funcol, group, t, iters: int) -> float:
    """A functional all_reduce waited at once, as compiled and DTensor code issues it."""
    start = time.perf_counter()
    for _ in range(iters):
        out = funcol.all_reduce(t, "sum", group)
        funcol.wait_tensor(out)
    return (time.perf_counter() - start) / iters


def _time_funcol_ops(group, t, iters: int) -> float:
    """The ``_c10d_functional`` ops a compiled graph calls, without funcol's eager Python wrapper
    (AsyncCollectiveTensor, group resolution)."""
    import torch

    ops, name = torch.ops._c10d_functional, group.group_name
    start = time.perf_counter()
    for _ in range(iters):
        ops.wait_tensor(ops.all_reduce(t, "sum", name))
    return (time.perf_counter() - start) / iters


def _fsdp_model(mesh, width: int, layers: int, shared: bool = False):
    """An MLP of ``layers`` width x width layers, each layer and the root sharded by FSDP2
    (``shared``: FSDP2's communication buffers from the process group, shmcomm's shared memory;
    gloo has none and FSDP2 falls back to torch.empty there)."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())
                                  for _ in range(layers)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in (*model, model):
        module.set_allocate_memory_from_process_group_for_comm(shared)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _time_fsdp(model, opt, x, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    return (time.perf_counter() - start) / steps


def _tp_model(mesh):
    """256 -> 1024 -> 256 MLP, column- then row-parallel (DTensor tensor parallelism)."""
    import torch
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def _time_tp(model, x, iters: int) -> float:
    """Forward passes, each waited: the row-parallel layer's all_reduce is a functional
    collective whose output (an AsyncCollectiveTensor) would otherwise never be waited."""
    import torch
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(iters):
            out = model(x)
            if isinstance(out, AsyncCollectiveTensor):
                out.wait()
        return (time.perf_counter() - start) / iters


def _measure(groups, rounds: int, run) -> dict:
    """``run(name, group)`` -> seconds, alternated between the backends for ``rounds`` rounds."""
    import torch.distributed as dist

    times = {name: [] for name in groups}
    for _ in range(rounds):
        for name, g in groups.items():
            dist.barrier(group=g)  # g None: the default group
            times[name].append(run(name, g))
    return times


def rank_main(rank: int, size: int, args) -> dict | None:
    """One rank (started by sc.spawn): join both groups and measure; rank 0 returns the table's
    contents (the others None)."""
    import torch
    import torch.distributed as dist

    import shmcomm.torch  # noqa: F401 - registers "shmcomm" even with entry points disabled

    torch.set_num_threads(1)
    if args.pin:  # rank r on CPU r, as `shmrun --bind-to core` does
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    dist.init_process_group("shmcomm")  # env://: RANK, WORLD_SIZE, MASTER_* from the launcher
    groups = {"shmcomm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rounds = args.rounds
    sections = set(args.only.split(",")) if args.only else {"latency", "ddp", "large", "funcol",
                                                               "fsdp", "tp"}
    rows = []  # (label, {backend: [seconds per round]}, scale, goal)
    extra = []
    world = dist.get_world_size()

    if "latency" in sections:  # ---- 2-element all_reduce latency
        for g in groups.values():
            _time_allreduce(dist, g, max(args.iters // 10, 50))
        lat = _measure(groups, rounds, lambda name, g: _time_allreduce(dist, g, args.iters // rounds))
        rows.append(("all_reduce 2 x float32 (us)", lat, 1e6, 0.05))
        # the same call through shmcomm's own API in these processes: what torch's layers add
        import shmcomm as sc

        own = _measure({"sc": None}, rounds, lambda name, g: _time_allreduce(sc, None, args.iters // rounds))
        null = _null_backend_group(dist)
        floor = _measure({"null": null}, rounds, lambda name, g: _time_allreduce(dist, g, args.iters // rounds))
        torch_us, own_us = statistics.median(lat["shmcomm"]) * 1e6, statistics.median(own["sc"]) * 1e6
        null_us = statistics.median(floor["null"]) * 1e6
        extra.append(f"dist.all_reduce of 2 floats {torch_us:.2f} us, sc.all_reduce in the same "
                     f"processes {own_us:.2f} us: {torch_us / own_us:.1f}x (goal <= 3x at 2 ranks)")
        split = (f"a backend adding nothing to sc.all_reduce would be at {(null_us + own_us) / own_us:.1f}x; "
                 f"shmcomm's adds {torch_us - null_us - own_us:.2f} us")
        if world > len(os.sched_getaffinity(0)):
            # Each call then waits for ranks the scheduler has taken off the cores: a longer
            # call between two collectives waits longer, and the parts no longer add up.
            split = "more ranks than cores here, so the costs do not add up (each call waits for descheduled ranks)"
        extra.append(f"  torch's own layer (dist.all_reduce on a backend that does nothing) {null_us:.2f} us: {split}")

    if "funcol" in sections:  # ---- functional all_reduce of 8 KiB, waited at once
        import torch.distributed._functional_collectives as funcol

        t8k = torch.ones(2048)
        for g in groups.values():
            _time_funcol(funcol, g, t8k, 50)
        fc = _measure(groups, rounds, lambda name, g: _time_funcol(funcol, g, t8k, args.iters // rounds))
        rows.append(("functional all_reduce 8 KiB (us)", fc, 1e6, 0.03))
        for g in groups.values():
            _time_funcol_ops(g, t8k, 50)
        ops = _measure(groups, rounds, lambda name, g: _time_funcol_ops(g, t8k, args.iters // rounds))
        rows.append(("  the same as compiled code calls it (us)", ops, 1e6, 0.03))
        null = _null_backend_group(dist)
        floor = _measure({"null": null}, rounds, lambda name, g: _time_funcol_ops(g, t8k, args.iters // rounds))
        extra.append(f"the compiled-code functional all_reduce on a backend that does nothing (torch's own "
                     f"part: clone, dispatch, work registry): {statistics.median(floor['null']) * 1e6:.2f} us "
                     f"of shmcomm's {statistics.median(ops['shmcomm']) * 1e6:.2f} us")

    if "ddp" in sections:  # ---- DDP step
        gen = torch.Generator().manual_seed(rank)
        batch = (torch.randn(args.batch, 1024, generator=gen), torch.randn(args.batch, 16, generator=gen))
        models = {}
        for name, g in groups.items():
            model = _mlp()
            ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=g)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            _time_ddp(ddp, opt, batch, 3)
            models[name] = (ddp, opt)
        params = sum(p.numel() for p in models["shmcomm"][0].parameters())
        step = _measure(groups, rounds, lambda name, g: _time_ddp(*models[name], batch,
                                                                  max(args.steps // rounds, 1)))
        rows.append((f"DDP step {params / 1e6:.2f}M params b{args.batch} (ms)", step, 1e3, 0.77))
        extra.append("DDP replicas on both backends: " + _agreement(
            list(models["shmcomm"][0].parameters()), list(models["gloo"][0].parameters()), world))

    if "fsdp" in sections:  # ---- FSDP2 step: 5-layer 512-wide MLP
        from torch.distributed.device_mesh import DeviceMesh

        x = torch.randn(args.batch, 512, generator=torch.Generator().manual_seed(rank))
        # with a third model on a backend that does nothing, alternated with the other two: the
        # step's compute and FSDP2's own work, the floor under any backend
        with_null = {**groups, "null": _null_backend_group(dist)}
        fsdp = {name: _fsdp_model(DeviceMesh.from_group(g, "cpu"), 512, 5) for name, g in with_null.items()}
        for name in with_null:
            _time_fsdp(*fsdp[name], x, 2)
        times = _measure(with_null, rounds, lambda name, g: _time_fsdp(*fsdp[name], x,
                                                                       max(args.steps // rounds, 1)))
        rows.append((f"FSDP2 step 5x512 MLP b{args.batch} (ms)", times, 1e3, 0.35))
        shared = {name: _fsdp_model(DeviceMesh.from_group(g, "cpu"), 512, 5, shared=True)
                  for name, g in groups.items()}
        for name in groups:
            _time_fsdp(*shared[name], x, 2)
        shared_times = _measure(groups, rounds, lambda name, g: _time_fsdp(*shared[name], x,
                                                                           max(args.steps // rounds, 1)))
        rows.append(("  buffers from the process group (ms)", shared_times, 1e3, 0.35))
        step_ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        extra.append(f"the FSDP2 step on a backend that does nothing (its compute and FSDP2's own work): "
                     f"{step_ms['null']:.2f} ms, {step_ms['null'] / step_ms['gloo']:.3f} of gloo's step; "
                     f"beyond it shmcomm {step_ms['shmcomm'] - step_ms['null']:.2f} ms, "
                     f"gloo {step_ms['gloo'] - step_ms['null']:.2f} ms")
        extra.append("FSDP2 models on both backends: " + _agreement(
            [p.full_tensor() for p in fsdp["shmcomm"][0].parameters()],
            [p.full_tensor() for p in fsdp["gloo"][0].parameters()], world))

    if "tp" in sections:  # ---- tensor-parallel MLP forward (DTensor)
        from torch.distributed.device_mesh import DeviceMesh

        x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
        tp = {name: _tp_model(DeviceMesh.from_group(g, "cpu")) for name, g in groups.items()}
        for name in groups:
            _time_tp(tp[name], x, 20)
        times = _measure(groups, rounds, lambda name, g: _time_tp(tp[name], x, args.iters // rounds // 10))
        rows.append(("TP MLP forward b8 256-1024-256 (us)", times, 1e6, 0.3))
        with torch.no_grad():
            extra.append("TP forward outputs on both backends: " + _agreement(
                [tp["shmcomm"](x)], [tp["gloo"](x)], world))

    if "large" in sections:  # ---- large all_reduce per dtype (each call sums ones into a fresh copy)
        for dtname in args.dtypes.split(","):
            dtype = getattr(torch, dtname)
            source = torch.ones(args.large_count, dtype=dtype)
            tensors = {name: source.clone() for name in groups}
            for name, g in groups.items():
                _time_large(dist, g, tensors[name], 2)

            def one_round(name, g):
                tensors[name].copy_(source)
                dist.barrier(group=g)
                return _time_large(dist, g, tensors[name], args.large_iters)
            goal = 0.25 if dtname in ("float16", "bfloat16") else None
            rows.append((f"all_reduce {args.large_count / 2**20:g}M x {dtname} (ms)",
                         _measure(groups, rounds, one_round), 1e3, goal))

    dist.destroy_process_group()
    # A gloo worker thread destroys a finished Work (decref'ing its tensors, which takes the GIL)
    # a little after the Work completed. One still doing so when the interpreter finalizes is
    # ended inside that destructor and aborts the rank ("terminate called without an active
    # exception"; gdb: ProcessGroupGloo::runLoop -> ~AsyncBarrierWork -> gil_scoped_acquire ->
    # PyThread_exit_thread; about 1 run in 30). Let it finish while this rank still runs.
    time.sleep(0.1)
    if rank != 0:
        return None
    return {"torch": torch.__version__, "world": world, "cpus": os.cpu_count(), "rows": rows,
            "extra": extra}


def report(result: dict, args) -> None:
    """Print rank 0's figures: a header, one line per benchmark, then the equality checks."""
    print(f"torch {result['torch']}, world size {result['world']}, {result['cpus']} CPUs"
          f"{' (rank r pinned to CPU r)' if args.pin else ''}, torch threads per rank 1, "
          f"{args.rounds} rounds alternating the backends")
    print(f"{'benchmark':<38}{'shmcomm':>18}{'gloo':>18}{'ratio':>8}{'goal':>9}")
    for name, times, scale, goal in result["rows"]:
        med = {k: statistics.median(v) * scale for k, v in times.items()}
        best = {k: min(v) * scale for k, v in times.items()}
        cells = "".join(f"{med[k]:>10.2f} [{best[k]:>5.4g}]" for k in ("shmcomm", "gloo"))
        ratio = med["shmcomm"] / med["gloo"]
        verdict = "" if goal is None else f"{'<= ' + str(goal):>9}  {'met' if ratio <= goal else 'MISSED'}"
        print(f"{name:<38}{cells}{ratio:>8.3f}{verdict}")
    for line in result["extra"]:
        print(line)


def main(argv=None) -> int:
    """Run the ranks (sc.spawn) and print rank 0's figures; returns 0 (a failing rank's
    exception is raised here).

    Example::

        python bench/bench_torch_backend.py -n 2 --iters 5000
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--iters", type=int, default=7000, help="all_reduce calls in total per backend")
    parser.add_argument("--steps", type=int, default=70, help="DDP steps in total per backend")
    parser.add_argument("--batch", type=int, default=32, help="DDP batch size per rank (default 32)")
    parser.add_argument("--rounds", type=int, default=7, help="alternations between the backends")
    parser.add_argument("--pin", action="store_true", help="pin rank r to CPU r (both backends)")
    parser.add_argument("--large-count", type=int, default=8 << 20, help="elements of the large all_reduce")
    parser.add_argument("--large-iters", type=int, default=10, help="large all_reduces per round")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16", help="dtypes of the large all_reduce")
    parser.add_argument("--only", default="", help="comma list of sections: latency,funcol,ddp,fsdp,tp,large")
    args = parser.parse_args(argv)
    import shmcomm as sc

    # The ranks import shmcomm afresh: make it this checkout's too; one thread each, as before.
    os.environ["OMP_NUM_THREADS"] = "1"
    report(sc.spawn(rank_main, args.n, args=(args,))[0], args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
