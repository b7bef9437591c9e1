"""The reduction kernels at every SIMD level: the same bits as each other and as numpy, for every
dtype and op of the table, odd lengths (vector tails), every 16-bit float pattern, and through the
collectives with a level forced by SHMCOMM_SIMD; the dtype/op table as the Python side sees it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import numpy as np
import pytest

import shmcomm as sc
from shmcomm import _core
from harness import run_ranks
from reference import (BFLOAT16, DTYPES, FACTORS, KERNEL_OPS, OPS, assert_same_bits, bits, digest,
                       kernel_ops_for, make_input, ops_for,
                       reduce_reference)

LEVELS = _core.simd_levels()
# Tails and blocks: below, at and past one vector (8/16 lanes) and one 512-element block.
LENGTHS = [0, 1, 7, 8, 15, 16, 17, 31, 33, 511, 512, 513, 1031]


def _reduce(inputs, op, level):
    out = np.empty_like(inputs[0])
    _core.reduce_kernel(out, inputs, KERNEL_OPS.index(op), level, FACTORS[:len(inputs)])
    return out


def test_table_matches_numpy_and_the_spec():
    """The generated lists follow the C table: every dtype name is a numpy dtype of the C size,
    and the ops each dtype supports are exactly the spec's."""
    assert [m.name for m in sc.ReduceOp] == OPS == list(_core.OP_NAMES[:-1])
    assert [int(m) for m in sc.ReduceOp] == list(range(len(OPS)))
    assert _core.OP_NAMES[_core.PREMUL_SUM] == "PREMUL_SUM"
    stub = ast.parse(open(os.path.join(os.path.dirname(sc.__file__), "_core.pyi")).read())
    declared = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "ReduceOp")
    members = [(t.targets[0].id, t.value.value) for t in declared.body if isinstance(t, ast.Assign)]
    assert members == [(name, int(m)) for name, m in sc.ReduceOp.__members__.items()], \
        "_core.pyi's ReduceOp differs from the table (aliases included)"
    assert len(DTYPES) == len(_core.DTYPE_NAMES) - (BFLOAT16 is None)
    for dtype in DTYPES:
        for op in KERNEL_OPS:
            x = np.zeros(3, dtype)
            try:
                _core.reduce_kernel(x, [x, x], KERNEL_OPS.index(op), factors=[1.0, 1.0])
                supported = True
            except TypeError as exc:
                assert f"op {op} " in str(exc) and "dtype" in str(exc)
                supported = False
            assert supported == (op in kernel_ops_for(dtype)), (dtype, op)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_every_level_gives_numpys_bits(dtype):
    """Every op, length and source count: each level's output equals numpy's (reduced in rank order
    in the accumulate type, rounded once) bit for bit."""
    for op in kernel_ops_for(dtype):
        for count in LENGTHS:
            for n in (1, 2, 3, 4):
                inputs = [make_input(dtype, count, r, salt=count) for r in range(n)]
                expected = reduce_reference(inputs, op)
                for level in LEVELS:
                    got = _reduce(inputs, op, level)
                    assert_same_bits(got, expected, f"{level} {dtype.name} {op} n={n} count={count}")


@pytest.mark.parametrize("name", ["float32", "int8", "uint16", "float16"])
def test_output_may_be_any_source(name):
    """The collectives reduce in place (the output is one of the sources, often not the first):
    with the output as source k, for every k and one to four sources, over several blocks and a
    tail, every level still gives numpy's bits."""
    dtype = np.dtype(name)
    for op in kernel_ops_for(dtype):
        for n in (1, 2, 3, 4):
            for k in range(n):
                inputs = [make_input(dtype, 1537, r, salt=k) for r in range(n)]
                expected = reduce_reference(inputs, op)
                for level in LEVELS:
                    sources = [x.copy() for x in inputs]
                    _core.reduce_kernel(sources[k], sources, KERNEL_OPS.index(op), level,
                                        FACTORS[:n])
                    assert_same_bits(sources[k], expected, f"{level} {name} {op} n={n} out=source {k}")


def _all_patterns(dtype):
    """Every 16-bit pattern (NaNs, infinities, subnormals, both zeros) and a shuffled partner."""
    a = np.arange(1 << 16, dtype=np.uint16)
    b = np.random.default_rng(7).permutation(a)
    return a.view(dtype), b.view(dtype)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_precision_levels_agree_on_every_bit_pattern(name):
    """Conversions are exact at every level: every pattern against a shuffled one, every op, one
    to three sources; the levels agree byte for byte (NaN payloads included) and, away from NaNs,
    with numpy/ml_dtypes' own float32 round trip."""
    if name == "bfloat16" and BFLOAT16 is None:
        pytest.skip("needs ml_dtypes")
    dtype = BFLOAT16 if name == "bfloat16" else np.dtype(np.float16)
    a, b = _all_patterns(dtype)
    for op in kernel_ops_for(dtype):
        for inputs in ([a], [a, b], [b, a, a]):
            results = {level: _reduce(inputs, op, level) for level in LEVELS}
            for level, got in results.items():
                assert bits(got) == bits(results["baseline"]), f"{level} != baseline: {name} {op}"
            got = results["baseline"]
            with np.errstate(all="ignore"):
                expected = reduce_reference(inputs, op)
            nan = np.isnan(expected.astype(np.float32))
            assert np.array_equal(np.isnan(got.astype(np.float32)), nan), f"{name} {op}: NaN positions"
            assert bits(got[~nan]) == bits(expected[~nan]), f"{name} {op}: values"
    # A NaN keeps its sign and comes back quiet (as the hardware converters make it).
    nans = np.isnan(a.astype(np.float32))
    round_trip = _reduce([a], "SUM", LEVELS[-1]).view(np.uint16)[nans]
    quiet = 0x0200 if name == "float16" else 0x0040
    assert np.all(round_trip & quiet)
    assert np.array_equal(round_trip & 0x8000, a.view(np.uint16)[nans] & 0x8000)


def test_kernel_arguments_are_checked():
    x, y = np.zeros(4, np.float32), np.zeros(5, np.float32)
    with pytest.raises(ValueError, match=r"inputs\[1\] has 5 float32 elements; out has 4"):
        _core.reduce_kernel(x, [x, y], 0)
    with pytest.raises(ValueError, match="level must be auto or one of"):
        _core.reduce_kernel(x, [x], 0, "sse9")
    with pytest.raises(ValueError, match="at least one array"):
        _core.reduce_kernel(x, [], 0)
    with pytest.raises(TypeError, match="op BAND is not supported for dtype float32"):
        _core.reduce_kernel(x, [x], int(sc.ReduceOp.BAND))


def _run_python(code, **env):
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          timeout=60)


@pytest.mark.timeout(120)
def test_shmcomm_simd_forces_a_level_and_rejects_bad_ones():
    for level in LEVELS:
        out = _run_python("import shmcomm._core as c; print(c.simd_level())", SHMCOMM_SIMD=level)
        assert out.stdout.strip() == level, out.stderr
    out = _run_python("import shmcomm._core as c; print(c.simd_level())", SHMCOMM_SIMD="")
    assert out.stdout.strip() == LEVELS[-1]  # unset: the best this CPU runs
    missing = [level for level in _core.SIMD_LEVELS if level not in LEVELS]  # neon on x86, ...
    if not missing:
        pytest.skip("this CPU runs every level of the build")
    other = missing[0]
    # A level the CPU cannot run: import still works (torch loads the entry point), and creating a
    # group fails at once, naming the variable and the levels that would do.
    code = ("import shmcomm as sc\n"
            "try:\n    sc.init_process_group(rank=0, world_size=1, name='simd-check')\n"
            "except ValueError as e:\n    print('refused:', e)\n")
    out = _run_python(code, SHMCOMM_SIMD=other)
    assert "refused: SHMCOMM_SIMD=" + other in out.stdout, out.stdout + out.stderr
    assert "levels here: " + ", ".join(LEVELS) in out.stdout
    out = _run_python(code, SHMCOMM_SIMD="fastest")
    assert "refused: SHMCOMM_SIMD must be auto or one of" in out.stdout, out.stdout + out.stderr


def _half_all_reduces(rank, size, counts):
    """float16/bfloat16 all_reduce and reduce_scatter on private arrays and on sc.empty, every op:
    checked against numpy here, digested so levels can be compared."""
    results = []
    for dtype in [d for d in DTYPES if d.name in ("float16", "bfloat16")]:
        for op in ops_for(dtype):
            for count in counts:
                inputs = [make_input(dtype, count, r, salt=3) for r in range(size)]
                expected = reduce_reference(inputs, op)
                x = inputs[rank].copy()
                sc.all_reduce(x, op=sc.ReduceOp[op])
                assert_same_bits(x, expected, f"all_reduce {dtype.name} {op} count={count}")
                shared = sc.empty(count, dtype)
                shared[...] = inputs[rank]
                sc.all_reduce(shared, op=sc.ReduceOp[op])
                assert_same_bits(shared, expected, f"zero-copy all_reduce {dtype.name} {op} count={count}")
                results += [x, shared.copy()]
                del shared
    return digest(results)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", ["one-shot+pipelined", "single-copy"])
def test_collectives_give_the_same_bits_at_every_forced_level(path):
    """Every path that reduces (one-shot, pipelined past the segment, single copy, zero copy)
    calls the same kernels: forcing each level with SHMCOMM_SIMD changes no bit."""
    if path == "single-copy":
        env, counts = {"SHMCOMM_CMA_BYTES": 1024, "SHMCOMM_SMALL_BYTES": 512}, [9, 70001]
    else:
        env, counts = {"SHMCOMM_SLOT_BYTES": 8192}, [1, 17, 3000, 20011]
    digests = {}
    for level in LEVELS:
        results = run_ranks(_half_all_reduces, 3, counts, timeout=120, env={**env, "SHMCOMM_SIMD": level})
        assert len(set(results)) == 1
        digests[level] = results[0]
    assert len(set(digests.values())) == 1, digests


_CHECK_SOURCE = os.path.join(os.path.dirname(__file__), "c", "kernels_check.c")
_INCLUDE = os.path.join(os.path.dirname(__file__), os.pardir, "src_cython")
_KERNELS = os.path.join(_INCLUDE, "reduce_kernels.c")
_FLAGS = ["-O3", "-fno-strict-aliasing", "-ffp-contract=off", "-Wall", "-Werror", f"-I{_INCLUDE}"]


def _kernel_hashes(compiler, tmp_path, name, runner=(), static=False):
    exe = tmp_path / name
    subprocess.run([compiler, *_FLAGS, *(["-static"] if static else []), _CHECK_SOURCE, _KERNELS, "-o", str(exe)],
                   check=True, capture_output=True, timeout=300)
    out = subprocess.run([*runner, str(exe)], check=True, capture_output=True, text=True, timeout=300)
    hashes = {}
    for line in out.stdout.splitlines():
        level, dtype, op, value = line.split()
        hashes.setdefault((dtype, op), {})[level] = value
    return hashes


@pytest.mark.timeout(600)
def test_kernels_build_for_aarch64_and_give_the_same_bits_there(tmp_path):
    """The kernels compile for AArch64 (NEON level included) with Debian's cross compiler; under
    qemu every AArch64 level gives the bits every level gives here (long double aside)."""
    import shutil

    host_cc = shutil.which("gcc") or shutil.which("cc")
    cross = shutil.which("aarch64-linux-gnu-gcc")
    if host_cc is None or cross is None:
        pytest.skip("needs gcc and Debian's gcc-aarch64-linux-gnu (.ci/run installs them where apt-get works)")
    here = _kernel_hashes(host_cc, tmp_path, "kernels_host")
    for key, by_level in here.items():
        assert len(set(by_level.values())) == 1, f"levels disagree here on {key}: {by_level}"
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if qemu is None:
        subprocess.run([cross, *_FLAGS, "-c", _KERNELS, "-o", str(tmp_path / "kernels_arm.o")],
                       check=True, capture_output=True, timeout=300)
        pytest.skip("built for AArch64; running it needs qemu-user (Debian's qemu-user)")
    arm = _kernel_hashes(cross, tmp_path, "kernels_arm", runner=[qemu], static=True)
    assert set(arm) == set(here)
    for key, by_level in arm.items():
        assert set(by_level) == {"baseline", "neon"}
        assert len(set(by_level.values())) == 1, f"AArch64 levels disagree on {key}: {by_level}"
        if "longdouble" not in key[0]:
            assert set(by_level.values()) == set(here[key].values()), f"AArch64 != this machine on {key}"
