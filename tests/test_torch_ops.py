"""``torch.ops.shmcomm`` (shmcomm/torch_ops): every op x dtype x size at 1-4 ranks and on a
sub-group against torch's own arithmetic, under every launcher, compiled with fullgraph=True, with
the errors a user can make, and a rank killed in the middle of a decode loop.

The value checks live in ``tests/torch_scripts/op_checks.py`` (shared with the launcher runs).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from harness import REPO, TORCH_SCRIPTS as SCRIPTS, import_torch_distributed, torch_ranks

torch, dist = import_torch_distributed()

import op_checks  # noqa: E402 - tests/torch_scripts, on the path from here on
import shmcomm as sc  # noqa: E402
from shmcomm.torch_ops import native  # noqa: E402


# ---- values ---------------------------------------------------------------------------------------
@pytest.mark.timeout(150)
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_every_op_dtype_and_size_matches_torch(size, tmp_path):
    """all_reduce_ (op, Python kernel, drop-in) over 14 dtypes x their reduce ops x sizes 0, 1,
    1001 and 300k (past a slot), and the data-movement ops, against torch in float64/int64, the
    same bits on every rank; at 3 and 4 ranks again on the sub-group of the first and last."""
    counts = torch_ranks(lambda r, n: op_checks.run_all(), size, tmp_path, timeout=140)
    per_rank = sum(len(op_checks.ops_for(d)) for d in op_checks.DTYPES) * len(op_checks.SIZES)
    assert min(counts) >= per_rank + 5 * len(op_checks.DTYPES), counts
    if size >= 3:  # the sub-group's members compared more
        assert counts[0] == counts[-1] > counts[1], counts


# ---- launchers ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), str(SCRIPTS)]))
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    for k in [k for k in env if k.startswith("SHMCOMM_")]:
        env.pop(k)  # a fresh shell's (pytest's process made a secret up)
    env.update(extra)
    return env


def _by_hand(size: int, env: dict, timeout: float) -> tuple[int, str]:
    """Ranks started one by one with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, as a user would."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "ops_script.py"], cwd=SCRIPTS, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=dict(env, RANK=str(r), WORLD_SIZE=str(size), LOCAL_RANK=str(r),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(size)]
    out, rc = "", 0
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out += text
        rc = rc or p.returncode
    return rc, out


@pytest.mark.timeout(200)
@pytest.mark.parametrize("launcher,native_setting", [("torchrun", "1"), ("shmrun", "1"), ("by_hand", "1"),
                                                     ("torchrun", "0")])
def test_launchers(launcher, native_setting):
    """The checks under torchrun, shmrun and ranks started by hand (3 ranks: the sub-group too);
    SHMCOMM_TORCH_NATIVE=0 gives the Python kernel, with the same results and no warning."""
    env = _env(SHMCOMM_TORCH_NATIVE=native_setting)
    size = 3
    if launcher == "by_hand":
        rc, out = _by_hand(size, env, 180)
    else:
        cmd = ([sys.executable, "-m", "shmcomm.launch", "-n", str(size), "--no-prefix"] if launcher == "shmrun"
               else [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(size)])
        proc = subprocess.run(cmd + ["ops_script.py"], cwd=SCRIPTS, env=env, capture_output=True, text=True,
                              timeout=180)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    assert rc == 0, out[-4000:]
    lines = re.findall(r"rank (\d) compared (\d+) native=(True|False)", out)  # lines may mix
    assert sorted(r for r, _, _ in lines) == [str(r) for r in range(size)], out[-4000:]
    expect_native = str(native_setting == "1" and native.load())
    assert {flag for _, _, flag in lines} == {expect_native}, out[-4000:]
    assert "RuntimeWarning" not in out, out[-4000:]


# ---- the native kernel ------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_native_kernels_serve_all_reduce_and_its_copying_twin(tmp_path):
    """Where a compiler is at hand the CPU kernels of all_reduce_ and all_reduce are the C++ ones
    (their registrations name the source file), and they reduce; elsewhere this says why not."""
    if not native.load():
        pytest.skip(f"the native kernel was not built here: {native.why_not()}")

    def fn(rank, size):
        cpu = [line for op in ("all_reduce_", "all_reduce")
               for line in torch._C._dispatch_dump(f"shmcomm::{op}").splitlines() if line.startswith("CPU")]
        t = torch.full((3,), float(rank + 1))
        torch.ops.shmcomm.all_reduce_(t, "sum", None)
        copy = torch.ops.shmcomm.all_reduce(torch.full((2, 2), float(rank)).t(), "max", None)
        return cpu, t.tolist(), copy.tolist(), copy.is_contiguous()

    for cpu, values, copy, contiguous in torch_ranks(fn, 2, tmp_path):
        assert len(cpu) == 2 and all("all_reduce.cpp" in line for line in cpu), cpu
        assert values == [3.0] * 3
        assert copy == [[1.0, 1.0], [1.0, 1.0]] and contiguous


def _reader_cases() -> dict:
    """Tensors the core must read as they are, and tensors it must copy or refuse."""
    z = torch.tensor([1 + 2j, 3 - 1j])
    base = torch.arange(2000.0)
    direct = {f"{dt}-{n}": op_checks.value(1, n, dt) for dt in op_checks.DTYPES for n in (0, 1, 1001)}
    direct.update({"uint16": torch.arange(7).to(torch.uint16), "uint64": torch.arange(5).to(torch.uint64),
                   "slice at an offset": base[3:1004], "2-d": torch.ones(3, 5), "0-d": torch.tensor(2.5),
                   "a row of a 2-d view": base.view(40, 50)[7]})
    other = {"transposed": torch.ones(4, 4).t(), "strided": base[::2], "expanded": torch.ones(1).expand(6),
             "conj view": z.conj(), "neg view": torch._neg_view(torch.ones(3)),
             "complex32": torch.zeros(2, dtype=torch.complex32), "parameter": torch.nn.Parameter(torch.ones(2)),
             "sparse": torch.ones(3).to_sparse(), "numpy": np.ones(2), "list": [1.0]}
    return {"direct": direct, "other": other}


def _doubled_by_the_core(t):
    """``t`` reduced with itself by the core's kernel (SUM; BOR for bool), read as the core reads
    it; or the error the core raised."""
    out = torch.empty(t.shape, dtype=t.dtype)
    op = sc.ReduceOp.BOR if t.dtype == torch.bool else sc.ReduceOp.SUM
    try:
        sc._core.reduce_kernel(out, [t, t], int(op))
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return out


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_the_native_tensor_reader_reads_what_the_python_reads_read():
    """The core reads a tensor through the native library's reader (one C call) once it is
    loaded: it must give each tensor's own pointer (an offset slice's too), count and dtype, decline
    every tensor the Python reads copy or refuse (those then say why), and leave every result and
    error as it was without it."""
    if not native.load():
        pytest.skip(f"the native library was not built here: {native.why_not()}")
    assert sc._core.tensor_reader_in_use()
    cases = _reader_cases()
    for name, t in cases["direct"].items():
        dtype_name = str(t.dtype).removeprefix("torch.")
        assert sc._core.native_tensor_view(t) == (t.data_ptr(), t.numel(), dtype_name), name
    for name, t in cases["other"].items():
        assert sc._core.native_tensor_view(t) is None, name
    every = {**cases["direct"], **cases["other"]}
    torch_only = {k: t for k, t in every.items() if isinstance(t, torch.Tensor) and t.layout == torch.strided}
    with_reader = {k: (sc._core.tensor_is_direct(t), _doubled_by_the_core(t)) for k, t in torch_only.items()}
    sc._core.use_tensor_reader(0)
    try:
        assert not sc._core.tensor_reader_in_use()
        without = {k: (sc._core.tensor_is_direct(t), _doubled_by_the_core(t)) for k, t in torch_only.items()}
    finally:
        sc._core.use_tensor_reader(native._STATE["reader"])
    for k, t in torch_only.items():
        (direct_on, out_on), (direct_off, out_off) = with_reader[k], without[k]
        assert direct_on == direct_off == (k in cases["direct"]), k
        if isinstance(out_off, str):
            assert out_on == out_off, k
            continue
        expect = t | t if t.dtype == torch.bool else (t.to(torch.complex128 if t.is_complex() else torch.float64) * 2).to(t.dtype)
        assert torch.equal(out_on, expect) and torch.equal(out_off, expect), k


def _fake_build_directory(monkeypatch, directory):
    """native.load() on an empty state, with torch's build directory at ``directory`` and its
    build replaced by a recorder of the calls (each noting whether torch's lock file was there
    and whether the build flock was held); returns the list of those calls."""
    from torch.utils import cpp_extension

    calls = []

    def fake_load(**kwargs):
        other = os.open(directory / "shmcomm.flock", os.O_RDWR)
        try:
            import fcntl

            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = False
        except BlockingIOError:
            held = True
        finally:
            os.close(other)
        calls.append({"lock": (directory / "lock").exists(), "flock held": held})

    directory.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(directory))
    monkeypatch.setattr(cpp_extension, "load", fake_load)
    return calls


@pytest.mark.timeout(30)
def test_a_build_lock_left_by_a_killed_build_is_removed_not_waited_for(tmp_path, monkeypatch, capfd):
    """torch waits for its build lock file for as long as it exists; one left by a build that was
    killed would hang every later job in init_process_group. shmcomm builds under an flock of its
    own, so a lock file found while holding it is stale: removed, then the build runs."""
    directory = tmp_path / "build"
    calls = _fake_build_directory(monkeypatch, directory)
    (directory / "lock").write_text("")
    assert native.load() is True
    assert calls == [{"lock": False, "flock held": True}]
    assert "left by a build of the native kernel that was stopped" in capfd.readouterr().err


@pytest.mark.timeout(30)
def test_a_built_kernel_that_does_not_load_is_built_again(tmp_path, monkeypatch):
    """A library cut short (a build killed while linking) fails to load: built again, under the
    flock, not used."""
    directory = tmp_path / "build"
    calls = _fake_build_directory(monkeypatch, directory)
    (directory / f"{native._module_name()}.so").write_bytes(b"\x7fELF cut short")
    assert native.load() is True
    assert calls == [{"lock": False, "flock held": True}]


@pytest.mark.timeout(30)
def test_a_build_held_too_long_gives_the_python_kernel_not_a_hang(tmp_path, monkeypatch):
    """Another process holding the build flock past BUILD_WAIT_S (a compiler that hangs): the
    Python kernel serves, with a warning naming the file; nothing is built."""
    import fcntl

    directory = tmp_path / "build"
    calls = _fake_build_directory(monkeypatch, directory)
    monkeypatch.setattr(native, "BUILD_WAIT_S", 0.3)
    holder = os.open(directory / "shmcomm.flock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.warns(RuntimeWarning, match="shmcomm.flock"):
            assert native.load() is False
    finally:
        os.close(holder)
    assert calls == [] and "shmcomm.flock" in native.why_not()


@pytest.mark.timeout(200)
def test_without_a_compiler_the_python_kernel_serves_and_says_so_once(tmp_path):
    """A machine without a working C++ compiler (CXX=false, an empty extension cache): the ops
    give the same results through their Python kernels, and each rank warns once, saying why."""
    env = _env(CXX="false", TORCH_EXTENSIONS_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           "2", "ops_script.py"], cwd=SCRIPTS, env=env, capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert sorted(re.findall(r"rank (\d) compared \d+ native=False", out)) == ["0", "1"], out[-4000:]
    assert out.count("runs its Python kernel") == 2, out[-4000:]  # once per rank


# ---- errors -------------------------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_errors_name_the_problem(tmp_path):
    """Each mistake raises on the caller, with a message that names it; a dtype that differs
    between ranks raises CollectiveMismatchError on every rank (its type kept through the
    native kernel), and the group goes on working."""

    def fn(rank, size):
        gloo = dist.new_group(backend="gloo")
        said = {}
        cases = {
            "op": lambda: torch.ops.shmcomm.all_reduce_(torch.ones(2), "median", None),
            "premul": lambda: torch.ops.shmcomm.all_reduce_(torch.ones(2), "premul_sum", None),
            "name": lambda: torch.ops.shmcomm.all_reduce_(torch.ones(2), "sum", "no-such-group"),
            "gloo": lambda: torch.ops.shmcomm.all_reduce_(torch.ones(2), "sum", gloo.group_name),
            "size": lambda: torch.ops.shmcomm.all_gather_into_tensor(torch.ones(2), size + 1, None),
            "src": lambda: torch.ops.shmcomm.broadcast_(torch.ones(2), size, None),
            "blocks": lambda: torch.ops.shmcomm.reduce_scatter_tensor(torch.ones(3), "sum", size, None),
            "dtype": lambda: torch.ops.shmcomm.all_reduce_(torch.ones(2, dtype=torch.complex64), "max", None),
            "group type": lambda: op_checks.drop_in_all_reduce_(torch.ones(2), 3.5),
        }
        for key, call in cases.items():
            try:
                call()
                said[key] = "no error"
            except Exception as exc:  # noqa: BLE001 - what each raised is the result
                said[key] = f"{type(exc).__name__}: {exc}"
        from shmcomm.errors import CollectiveMismatchError
        try:
            torch.ops.shmcomm.all_reduce_(torch.ones(4, dtype=torch.float32 if rank else torch.float64), "sum", None)
            said["mismatch"] = "no error"
        except CollectiveMismatchError as exc:
            said["mismatch"] = f"CollectiveMismatchError: {exc}"
        t = torch.ones(2)
        torch.ops.shmcomm.all_reduce_(t, "sum", None)
        said["after"] = t.tolist()
        return said

    for rank, said in enumerate(torch_ranks(fn, 2, tmp_path)):
        assert re.match(r"ValueError: reduce_op must be one of .*'median'", said["op"]), said
        assert "PREMUL_SUM needs its factor" in said["premul"], said
        assert re.match(r"ValueError: no process group is named 'no-such-group'", said["name"]), said
        assert re.match(r"ValueError: process group '\d+' uses backend 'gloo', not 'shmcomm'", said["gloo"]), said
        assert re.match(r"ValueError: all_gather_into_tensor: group_size=3 but the group has 2 ranks", said["size"]), said
        assert re.match(r"ValueError: broadcast_: src must be a group rank in \[0, 2\), got 2", said["src"]), said
        assert re.match(r"ValueError: reduce_scatter_tensor: dim 0 .* group_size=2 equal blocks", said["blocks"]), said
        assert re.match(r"TypeError: .*MAX.*complex64", said["dtype"]), said
        assert re.match(r"TypeError: group must be a torch process group", said["group type"]), said
        assert said["mismatch"].startswith("CollectiveMismatchError:") and "dtype" in said["mismatch"], said
        assert said["after"] == [2.0, 2.0], said


# ---- torch.compile ---------------------------------------------------------------------------------
def _tp_block(rank, size):
    """A column- then row-parallel MLP whose row-parallel output is all-reduced: the layer every
    tensor-parallel decoder repeats. Returns (sharded forward, unsharded reference forward)."""
    torch.manual_seed(0)
    w1, w2 = torch.randn(32, 16) / 4, torch.randn(16, 32) / 4
    rows = 32 // size
    w1_mine, w2_mine = w1[rank * rows:(rank + 1) * rows], w2[:, rank * rows:(rank + 1) * rows]

    def sharded(x, all_reduce):
        y = torch.relu(x @ w1_mine.t()) @ w2_mine.t()
        return all_reduce(y)

    def whole(x):
        return torch.relu(x @ w1.t()) @ w2.t()

    return sharded, whole


@pytest.mark.timeout(240)
def test_compiled_with_fullgraph_and_no_graph_break(tmp_path):
    """A TP block calling each op compiles with fullgraph=True: one graph, no break (torch's
    own counters), the compiled result equal to the eager one and close to the unsharded model."""

    def fn(rank, size):
        import torch._dynamo.utils as dynamo_utils
        from shmcomm.torch_ops import all_reduce_

        sharded, whole = _tp_block(rank, size)
        world = dist.group.WORLD

        def step(x):
            y = sharded(x, lambda t: torch.ops.shmcomm.all_reduce_(t, "sum", None))
            y = sharded(y, lambda t: all_reduce_(t, world))          # the drop-in, traced
            g = torch.ops.shmcomm.all_gather_into_tensor(y, size, None)
            r = torch.ops.shmcomm.reduce_scatter_tensor(g, "avg", size, None)
            a = torch.ops.shmcomm.all_to_all_single(r, [], [], None)
            return torch.ops.shmcomm.broadcast_(a, 0, None) * 1.0

        dynamo_utils.counters.clear()
        compiled = torch.compile(step, fullgraph=True)
        x = torch.randn(size * 2, 16, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            eager, got = step(x.clone()), compiled(x.clone())
            got2 = compiled(x.clone())  # the second call runs the compiled code only
        breaks = dict(dynamo_utils.counters["graph_break"])
        graphs = dynamo_utils.counters["stats"]["unique_graphs"]
        # every rank holds the same y = whole(whole(x)) after the two blocks; the gather, the
        # average of identical blocks and the exchange leave rank 0 with y's first 2 rows from
        # each rank, which the broadcast gives everyone
        reference = whole(whole(x))[:2].repeat(size, 1)
        return breaks, graphs, torch.equal(eager, got) and torch.equal(got, got2), \
            float((eager - reference).abs().max())

    for breaks, graphs, same, err in torch_ranks(fn, 2, tmp_path, timeout=230):
        assert breaks == {} and graphs == 1, (breaks, graphs)
        assert same
        assert err < 1e-4, err


# ---- a rank killed mid-decode ------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_rank_killed_mid_decode_raises_on_every_survivor(tmp_path):
    """Three ranks decode (all_reduce_ after every layer); rank 2 is SIGKILLed after 40 steps.
    Both survivors raise PeerFailureError naming it, in seconds (the group's timeout is 60 s)."""

    def fn(rank, size):
        from shmcomm.errors import PeerFailureError

        h = torch.ones(2048, dtype=torch.bfloat16)
        start = None
        try:
            for step in range(10_000):
                if step == 40:
                    start = time.monotonic()
                    if rank == 2:
                        os.kill(os.getpid(), signal.SIGKILL)
                torch.ops.shmcomm.all_reduce_(h.mul_(0.5), "sum", None)
        except PeerFailureError as exc:
            return "PeerFailureError", str(exc), time.monotonic() - start
        return "no error", "", 0.0

    results = torch_ranks(fn, 3, tmp_path, expect_dead=(2,), timeout=80)
    for kind, message, waited in results[:2]:
        assert kind == "PeerFailureError" and "rank 2" in message, (kind, message)
        assert waited < 20, waited
