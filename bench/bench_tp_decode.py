"""Tensor-parallel decoding of a Llama-style model on CPU ranks: per-token latency and the cost of
each all_reduce, for every way a decoder can all-reduce, measured in one run on the same processes.

Run:  python bench/bench_tp_decode.py [-n 2] [--dtypes bfloat16,float32] [--modes eager,compiled]
                                      [--layers 8] [--hidden 512] [--batch 8] [--tokens 32] [--rounds 5]

The model (built in code, random weights, no download): ``--layers`` blocks of RMSNorm, attention
(``--heads`` heads, a fixed-size KV cache so that shapes never change) and a SwiGLU MLP
(``--hidden`` x ``4*hidden*2/3``), sharded Megatron-style over the ranks: QKV and gate/up split by
columns, the attention output and down projections by rows, each followed by an all_reduce of
``batch x hidden`` values (8 KiB in bfloat16 at the defaults): two per layer per token, as vLLM,
SGLang and DeepSpeed AutoTP decode. The default model is small, so that the all_reduces are a
visible part of a token (on a real model the matrix products dwarf them; ``--hidden 4096``). The ways to all-reduce (each skipped with the reason when it
cannot run here):

  shmcomm op        ``torch.ops.shmcomm.all_reduce_(t, "sum", group_name)``
  shmcomm drop-in   ``shmcomm.torch_ops.all_reduce_(t, group)`` (eager: the core with no dispatcher)
  dist (shmcomm)    ``dist.all_reduce(t)`` on the shmcomm group; compiled, torch turns it into its
                    functional collectives (funcol over shmcomm)
  DeepSpeed op      ``torch.ops.deepspeed.inference_all_reduce_(t)`` (``pip install deepspeed``;
                    its bfloat16 kernel needs AVX-512BW)
  gloo              ``dist.all_reduce(t)`` on a gloo group
  no comm           the same sharded model with the all_reduce skipped (wrong values; the compute
                    alone, so that per-token minus this over the calls is the cost of one call)

Each rank runs every way in turn, ``--rounds`` times alternated, ``--tokens`` tokens each; rank 0
prints medians. Every way's output is compared with the unsharded model on rank 0 (the largest
difference over the largest value: bfloat16 rounds partial sums differently when sharded).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import checkout  # noqa: E402 - bench/checkout.py, beside this script

checkout.use_checkout()  # this checkout where built in place, else the installed shmcomm


# ---- the model ----------------------------------------------------------------------------------------
def make_weights(layers: int, hidden: int, heads: int, dtype, seed: int = 0) -> list[dict]:
    """The full (unsharded) weights of every layer, identical on every rank (one seed)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    inter = (hidden * 8 // 3 + 63) // 64 * 64

    def w(rows, cols):
        return (torch.randn(rows, cols, generator=gen) / cols ** 0.5).to(dtype)

    return [{"qkv": w(3 * hidden, hidden), "o": w(hidden, hidden), "gate": w(inter, hidden),
             "up": w(inter, hidden), "down": w(hidden, inter),
             "n1": torch.ones(hidden, dtype=dtype), "n2": torch.ones(hidden, dtype=dtype)}
            for _ in range(layers)]


def shard(weights: list[dict], rank: int, size: int, heads: int) -> list[dict]:
    """Rank ``rank``'s part: its heads of QKV and O, its columns of gate/up, its rows of down."""
    out = []
    for layer in weights:
        hidden = layer["o"].shape[0]
        hd = hidden // heads
        mine = slice(rank * heads // size * hd, (rank + 1) * heads // size * hd)
        q, k, v = layer["qkv"].chunk(3)
        inter = layer["gate"].shape[0]
        cols = slice(rank * inter // size, (rank + 1) * inter // size)
        out.append({"qkv": __import__("torch").cat([q[mine], k[mine], v[mine]]).contiguous(),
                    "o": layer["o"][:, mine].contiguous(), "gate": layer["gate"][cols].contiguous(),
                    "up": layer["up"][cols].contiguous(), "down": layer["down"][:, cols].contiguous(),
                    "n1": layer["n1"], "n2": layer["n2"]})
    return out


def decoder(weights: list[dict], heads_here: int, all_reduce, max_len: int):
    """``step(x, caches, pos) -> x``: one token through every layer; ``all_reduce(t) -> t``
    after each row-parallel projection (None on the unsharded model)."""
    import torch

    def rms(x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w

    def step(x, caches, pos):
        batch = x.shape[0]
        seen = (torch.arange(max_len) <= pos).view(1, 1, max_len)
        for layer, (kc, vc) in zip(weights, caches):
            h = rms(x, layer["n1"])
            q, k, v = (h @ layer["qkv"].t()).view(batch, 3, heads_here, -1).unbind(1)
            kc.index_copy_(2, pos.view(1), k.unsqueeze(2))
            vc.index_copy_(2, pos.view(1), v.unsqueeze(2))
            scores = (q.unsqueeze(2) @ kc.transpose(-1, -2)).squeeze(2) / q.shape[-1] ** 0.5
            probs = torch.softmax(scores.float().masked_fill(~seen, float("-inf")), -1).to(x.dtype)
            att = (probs.unsqueeze(2) @ vc).squeeze(2).reshape(batch, -1)
            o = att @ layer["o"].t()
            x = x + (all_reduce(o) if all_reduce else o)
            h = rms(x, layer["n2"])
            m = (torch.nn.functional.silu(h @ layer["gate"].t()) * (h @ layer["up"].t())) @ layer["down"].t()
            x = x + (all_reduce(m) if all_reduce else m)
        return x

    return step


def new_caches(layers: int, batch: int, heads_here: int, head_dim: int, max_len: int, dtype) -> list:
    import torch

    return [(torch.zeros(batch, heads_here, max_len, head_dim, dtype=dtype),
             torch.zeros(batch, heads_here, max_len, head_dim, dtype=dtype)) for _ in range(layers)]


def _timed(fn):
    """``fn`` that adds the seconds of each call to ``total[0]``; returns (wrapper, total)."""
    total = [0.0]
    clock = time.perf_counter

    def timed(t):
        start = clock()
        out = fn(t)
        total[0] += clock() - start
        return out

    return timed, total


def decode(step, caches, x0, tokens: int):
    """Run ``tokens`` steps from ``x0``; returns (seconds per token, the last output)."""
    import torch

    x = x0
    start = time.perf_counter()
    for pos in range(tokens):
        x = step(x, caches, torch.tensor(pos))
    return (time.perf_counter() - start) / tokens, x


# ---- the ways to all-reduce ----------------------------------------------------------------------------
def comm_ways(args, size: int) -> tuple[dict, dict]:
    """``{name: all_reduce callable}`` of the ways that can run here, and ``{name: why not}``."""
    import torch
    import torch.distributed as dist

    from shmcomm.torch_ops import all_reduce_, native

    world = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    ways, skipped = {}, {}
    ways["shmcomm op"] = lambda t: torch.ops.shmcomm.all_reduce_(t, "sum", None)
    ways["shmcomm drop-in"] = lambda t: all_reduce_(t, world)
    ways["dist (shmcomm)"] = lambda t: (dist.all_reduce(t, group=world), t)[1]
    if "deepspeed" in sys.modules:
        ways["DeepSpeed op"] = lambda t: torch.ops.deepspeed.inference_all_reduce_(t)
    else:
        skipped["DeepSpeed op"] = _deepspeed_missing
    ways["gloo"] = lambda t: (dist.all_reduce(t, group=gloo), t)[1]
    ways["no comm"] = lambda t: t
    if not native.load():
        skipped["(native kernel)"] = f"shmcomm op ran its Python kernel: {native.why_not()}"
    return ways, skipped


_deepspeed_missing = "not installed (pip install deepspeed; DS_ACCELERATOR=cpu)"


def _start_deepspeed(size: int) -> str | None:
    """DeepSpeed's shared-memory op on the world group, or why not. It reads LOCAL_SIZE (it
    crashes without it) and builds its kernel on first use."""
    global _deepspeed_missing
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ["LOCAL_SIZE"] = str(size)
    try:
        import deepspeed
        import torch
    except ImportError:
        return _deepspeed_missing
    try:
        deepspeed.init_distributed(dist_backend="gloo")  # the torch group exists: reused
        level = deepspeed.comm.comm.cdb.shm_vector_kernel_level if hasattr(deepspeed.comm.comm.cdb, "shm_vector_kernel_level") else None
        if not hasattr(torch.ops, "deepspeed") or not hasattr(torch.ops.deepspeed, "inference_all_reduce_"):
            raise RuntimeError("its shared-memory op did not build")
    except Exception as exc:  # noqa: BLE001 - a peer that cannot start is reported, not fatal
        sys.modules.pop("deepspeed", None)
        _deepspeed_missing = f"could not start: {exc}"
        return _deepspeed_missing
    return None if level is None or level >= 2 else "its bfloat16 kernel needs AVX-512BW (float32 only)"


# ---- one rank ---------------------------------------------------------------------------------------------
def rank_main(rank: int, size: int, args) -> dict | None:
    import torch
    import torch.distributed as dist

    import shmcomm.torch  # noqa: F401 - registers "shmcomm" even with entry points disabled

    torch.set_num_threads(args.threads)
    for knob in ("cache_size_limit", "recompile_limit"):  # one compiled step per way x dtype
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    dist.init_process_group("shmcomm")
    ds_note = _start_deepspeed(size) if not args.no_deepspeed else "left out (--no-deepspeed)"
    ways, skipped = comm_ways(args, size)
    if ds_note and "DeepSpeed op" in ways:
        skipped["DeepSpeed op (bfloat16)"] = ds_note
    heads_here, head_dim = args.heads // size, args.hidden // args.heads
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        full = make_weights(args.layers, args.hidden, args.heads, dtype)
        mine = shard(full, rank, size, args.heads)
        x0 = torch.randn(args.batch, args.hidden, generator=torch.Generator().manual_seed(1)).to(dtype)
        reference = None
        if rank == 0:
            ref_step = decoder(full, args.heads, None, args.tokens)
            _, reference = decode(ref_step, new_caches(args.layers, args.batch, args.heads, head_dim, args.tokens, dtype),
                                  x0, args.tokens)
        for mode in args.modes.split(","):
            runnable, in_calls = {}, {}
            for name, fn in ways.items():
                if name == "DeepSpeed op" and dtype == torch.bfloat16 and ds_note:
                    continue
                if name == "shmcomm drop-in" and mode == "compiled":
                    continue  # traced, it is the op itself
                if mode == "eager":  # time each call where it is made (compiled code cannot)
                    fn, in_calls[name] = _timed(fn)
                step = decoder(mine, heads_here, fn, args.tokens)
                if mode == "compiled":
                    step = torch.compile(step, fullgraph=True, dynamic=False)
                runnable[name] = step
            times = {name: [] for name in runnable}
            per_call = {name: [] for name in runnable}
            outputs = {}
            for rnd in range(args.rounds + 1):  # round 0 warms up (and compiles)
                for name, step in runnable.items():
                    dist.barrier()
                    caches = new_caches(args.layers, args.batch, heads_here, head_dim, args.tokens, dtype)
                    if name in in_calls:
                        in_calls[name][0] = 0.0
                    with torch.no_grad():
                        seconds, out = decode(step, caches, x0, args.tokens)
                    if rnd:
                        times[name].append(seconds)
                        if name in in_calls:
                            per_call[name].append(in_calls[name][0] / (args.tokens * 2 * args.layers))
                    outputs[name] = out
            if rank == 0:
                bare = statistics.median(times["no comm"])
                for name in runnable:
                    err = float((outputs[name].float() - reference.float()).abs().max()
                                / reference.float().abs().max())
                    med = statistics.median(times[name])
                    call = (statistics.median(per_call[name]) if per_call[name]
                            else (med - bare) / (2 * args.layers))
                    rows.append((dtype_name, mode, name, med, min(times[name]), call, err))
    dist.destroy_process_group()
    if rank != 0:
        return None
    return {"rows": rows, "skipped": skipped, "calls": 2 * args.layers,
            "bytes": {d: args.batch * args.hidden * getattr(torch, d).itemsize for d in args.dtypes.split(",")}}


def report(result: dict, args) -> None:
    import torch

    print(f"torch {torch.__version__}, {args.n} ranks, {os.cpu_count()} CPUs, {args.threads} torch thread(s) "
          f"per rank; {args.layers} layers, hidden {args.hidden}, {args.heads} heads, batch {args.batch}, "
          f"{args.tokens} tokens; medians of {args.rounds} alternated rounds [best]")
    print(f"{result['calls']} all_reduces per token of {', '.join(f'{b} B ({d})' for d, b in result['bytes'].items())}")
    print("us/all_reduce: timed around each call (eager); compiled: (ms/token - no comm's) / calls")
    print(f"{'dtype':9} {'mode':9} {'all_reduce by':18} {'ms/token':>15} {'us/all_reduce':>14} {'max rel err':>11}")
    for dtype, mode, name, med, best, call, err in result["rows"]:
        per_call = "" if name == "no comm" else f"{call * 1e6:14.1f}"
        note = "  (wrong values: no all_reduce)" if name == "no comm" else ""
        print(f"{dtype:9} {mode:9} {name:18} {med * 1e3:8.3f} [{best * 1e3:5.3f}] {per_call:>14} {err:11.2e}{note}")
    for name, why in result["skipped"].items():
        print(f"skipped {name}: {why}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--modes", default="eager,compiled", help="eager and/or compiled (fullgraph)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    parser.add_argument("--no-deepspeed", action="store_true", help="leave DeepSpeed's op out")
    args = parser.parse_args(argv)
    if args.heads % args.n or args.hidden % args.heads:
        parser.error("--heads must divide by -n, and --hidden by --heads")
    spawn_and_report(rank_main, report, args, args.threads)
    return 0


def spawn_and_report(rank_main, report, args, threads: int = 1) -> None:
    """Run ``rank_main(rank, size, args)`` on ``args.n`` ranks (sc.spawn, ``threads`` OpenMP
    threads each) and print ``report(rank 0's result, args)``; what DeepSpeed's op left in
    /dev/shm is removed, and said."""
    import shmcomm as sc
    from shmcomm.bench.peers import deepspeed_leftovers, remove_deepspeed_buffers

    os.environ["OMP_NUM_THREADS"] = str(threads)
    before = deepspeed_leftovers()
    try:
        result = sc.spawn(rank_main, args.n, args=(args,))[0]
    finally:  # DeepSpeed's op never removes its /dev/shm buffers, even when a rank failed
        note = remove_deepspeed_buffers(before)
    report(result, args)
    if note:
        print(f"# {note}")


if __name__ == "__main__":
    sys.exit(main())
