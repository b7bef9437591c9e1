"""Tests of ``shmcomm-bench`` (shmcomm/bench/): its own code paths, not the speed it measures.

Sweeps are tiny (-n 2 or 3, a couple of sizes, a few iterations) because the machine has two cores
and other suites run beside this one; nothing here asserts a time.
"""

from __future__ import annotations

import csv
import doctest
import importlib
import io
import json
import math
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import shmcomm
from shmcomm import bench, segments
from shmcomm.bench import dtypes, verify
from shmcomm.bench.cases import Case

TINY = ["-b", "8", "-e", "64", "-f", "8", "--iters", "3", "--warmup", "1", "-q"]


def run_main(capsys, *argv):
    """Run the tool in this process; returns (exit status, stdout, stderr)."""
    status = bench.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def bench_segments() -> set[str]:
    """This user's segments of benchmark jobs that no live process holds (other tests and suites
    of the same user may be running benchmarks beside)."""
    return {s.name for s in segments.list_segments() if ".bench-" in s.name and s.stale}


def table_rows(text: str) -> list[list[str]]:
    """The data lines of the printed tables (every line that does not start with '#'), split."""
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


# ---- pure helpers ---------------------------------------------------------------------------
@pytest.mark.timeout(10)
def test_parse_size_units_and_errors():
    assert bench.parse_size("8") == 8
    assert bench.parse_size("32K") == 32 << 10
    assert bench.parse_size("64M") == 64 << 20
    assert bench.parse_size("1g") == 1 << 30
    assert bench.parse_size("2KiB") == 2048
    assert bench.parse_size("16B") == 16
    assert bench.parse_size("1.5K") == 1536
    for bad in ("12Q", "M", "", "-8", "1.3", "8 MQ"):
        with pytest.raises(ValueError, match="invalid size"):
            bench.parse_size(bad)


@pytest.mark.timeout(10)
def test_sweep_and_collective_sizes():
    assert bench.sweep_sizes(8, 32 << 20, 8) == [8, 64, 512, 4096, 32768, 262144, 2097152, 16777216]
    assert bench.sweep_sizes(8, 8, 2) == [8]
    assert bench.sweep_sizes(10, 13, 1.1) == [10, 11, 12, 13]  # a small factor still advances
    with pytest.raises(ValueError):
        bench.sweep_sizes(64, 8, 2)
    # size is the total over ranks for the per-rank collectives; tiny sizes round up to 1 per rank
    assert bench.collective_sizes("all_gather", [8, 64], 4, 4) == [(4, 1), (16, 4)]
    assert bench.collective_sizes("all_reduce", [8, 64], 4, 4) == [(2, 2), (16, 16)]
    assert bench.collective_sizes("reduce_scatter", [4, 8], 2, 4) == [(2, 1)]  # deduplicated
    assert bench.collective_sizes("barrier", [8, 64], 2, 4) == [(0, 0)]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_busbw_factors_follow_the_spec(n):
    assert bench.busbw_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for coll in ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all"):
        assert bench.busbw_factor(coll, n) == pytest.approx((n - 1) / n)
    for coll in ("broadcast", "reduce", "send_recv"):
        assert bench.busbw_factor(coll, n) == 1.0
    with pytest.raises(ValueError):
        bench.busbw_factor("nope", n)


def _record(backend, coll, size, variant, time_us, spread=(1.0, 1.0), dtype="float32"):
    """A record as the tool makes them; ``spread``: (min, p90) as factors of the median."""
    return {"backend": backend, "collective": coll, "size": size, "count": size // 4, "type": dtype,
            "redop": "sum", "root": -1, "variant": variant, "time_us": time_us,
            "min_us": time_us * spread[0], "p90_us": time_us * spread[1], "busbw_factor": 1.0,
            "algbw_GBps": size / time_us / 1e3, "busbw_GBps": size / time_us / 1e3, "wrong": None}


@pytest.mark.timeout(10)
def test_format_table_has_spread_columns_and_says_why_a_variant_is_missing():
    recs = [_record("shmcomm", "all_reduce", 8, "in-place", 2.0, (0.5, 3.0)),
            _record("shmcomm", "all_reduce", 1024, "in-place", 4.0)]
    text = bench.format_table(recs, "shmcomm", "all_reduce")
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert "out-of-place" in head[0] and "in-place" in head[0]
    per_variant = ["time", "min", "p90", "algbw", "busbw", "#wrong"]
    assert head[1].split()[1:] == ["size", "count", "type", "redop", "root"] + per_variant * 2
    assert head[2].split()[1:3] == ["(B)", "(elements)"]
    rows = table_rows(text)
    assert [r[:5] for r in rows] == [["8", "2", "float32", "sum", "-1"], ["1024", "256", "float32", "sum", "-1"]]
    assert rows[0][5:11] == ["-"] * 6  # out of place: not in shmcomm's API ...
    assert "# - out-of-place: all_reduce is in place only in shmcomm's API" in text  # ... and why
    assert "n/a" not in text
    assert rows[0][11:] == ["2.00", "1.00", "6.00", "0.00", "0.00", "N/A"]  # N/A: not checked
    # every column of a row ends where its heading ends (right-aligned under the title)
    names = head[1]
    data = [line for line in text.splitlines() if line.startswith(" ")][1]
    assert names.index("size") + len("size") == data.index("1024") + len("1024")
    assert names.rindex("time") + len("time") == data.index("4.00") + len("4.00")


@pytest.mark.timeout(10)
def test_format_ratios_uses_medians_of_the_variant_both_measured_with_their_range():
    recs = [_record("shmcomm", "all_reduce", 8, "in-place", 2.0, (0.5, 2.0)),
            _record("mpi", "all_reduce", 8, "out-of-place", 1.0),
            _record("mpi", "all_reduce", 8, "in-place", 4.0, (0.5, 1.0)),
            _record("shmcomm", "all_reduce", 64, "in-place", 3.0),
            _record("mpi", "all_reduce", 64, "in-place", 1.0)]
    text = bench.format_ratios(recs, ["all_reduce"], ["gloo", "mpi"])
    assert "of the medians" in text.splitlines()[0]
    lines = {(line.split()[0], line.split()[4]): line for line in text.splitlines()
             if not line.startswith("#") and "geomean" not in line}
    # 2 / 4 (in-place), not 2 / 1; the range: 1 / 4 to 4 / 2
    assert lines[("all_reduce", "8")].split()[5:] == ["-", "0.5", "[0.25,", "2]", "ip"]  # gloo did not run
    assert lines[("all_reduce", "64")].split()[6:] == ["3", "[3,", "3]", "ip"]
    (geo,) = [line.split() for line in text.splitlines() if "geomean" in line]
    assert geo[:4] == ["all_reduce", "float32", "sum", "geomean"]
    assert float(geo[-3]) == pytest.approx(math.sqrt(0.5 * 3), rel=1e-2)


# ---- command line errors --------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv, message", [
    (["allreduce_typo", "-n", "2"], "unknown collective 'allreduce_typo'"),
    (["all_reduce", "-n", "2", "-b", "1M", "-e", "8K"],
     "-b/--minbytes (1 MiB) must not exceed -e/--maxbytes (8 KiB)"),
    (["all_reduce", "-n", "2", "-e", "64Q"], "invalid size '64Q'"),
    (["all_reduce", "-n", "0"], "expected a positive integer"),
    (["all_reduce"], "-n/--nranks"),
    (["all_reduce", "-n", "2", "--backend", "shmcomm,nccl"], "unknown backend(s) nccl"),
    (["all_reduce", "-n", "2", "--dtype", "float128"], "unknown dtype 'float128'"),
    (["all_reduce", "-n", "2", "--op", "band", "--dtype", "int32,float32"],
     "--op band does not apply to --dtype float32: bitwise ops need an integer or bool dtype"),
    (["reduce", "-n", "2", "--op", "max", "--dtype", "complex64"], "complex numbers have no order"),
    (["all_reduce", "-n", "2", "--op", "avg", "--dtype", "bool"], "bool has no average"),
    (["all_reduce", "-n", "2", "--op", "nope"], "unknown op 'nope'"),
    (["broadcast", "-n", "2", "--root", "2"], "--root 2 is not a rank of 2"),
    (["broadcast", "-n", "2", "--root", "x"], "expected ranks"),
    (["send_recv", "-n", "1"], "send_recv needs at least 2 ranks"),
    (["all_reduce", "-n", "2", "-f", "1"], "-f/--stepfactor must be greater than 1"),
])
def test_bad_arguments_exit_2_with_a_clear_message(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("usage: shmcomm-bench")


@pytest.mark.timeout(60)
def test_python_dash_m_reports_bad_size_and_help():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    bad = subprocess.run([sys.executable, "-m", "shmcomm.bench", "all_reduce", "-n", "2", "-b", "8X"],
                         capture_output=True, text=True, timeout=50, env=env)
    assert bad.returncode == 2
    assert "invalid size '8X'" in bad.stderr
    ok = subprocess.run([sys.executable, "-m", "shmcomm.bench", "--help"], capture_output=True, text=True,
                        timeout=50, env=env)
    assert ok.returncode == 0
    for option in ("--zero-copy", "--check", "--backend", "--json", "--csv", "--plot", "--iters", "--warmup",
                   "--dtype", "--op", "--root"):
        assert option in ok.stdout


# ---- real sweeps on the shmcomm backend -----------------------------------------------------
@pytest.mark.timeout(120)
def test_table_json_and_csv_of_a_small_sweep(capsys, tmp_path):
    js, cs = tmp_path / "r.json", tmp_path / "r.csv"
    status, out, err = run_main(capsys, "all_gather", "-n", "2", *TINY, "--check", "--json", str(js),
                                "--csv", str(cs))
    assert status == 0, out + err
    rows = table_rows(out)
    assert [r[:5] for r in rows] == [["8", "2", "float32", "none", "-1"],
                                     ["64", "16", "float32", "none", "-1"]]
    assert all(len(r) == 17 and r[10] == "0" and r[16] == "0" for r in rows)  # both variants checked
    for r in rows:  # time (the median), min, p90 of each variant
        for at in (5, 11):
            assert float(r[at + 1]) <= float(r[at]) <= float(r[at + 2]), r
    assert "# Out of bounds values : 0 OK" in out
    assert "'time' is the median over iterations" in out

    doc = json.loads(js.read_text())
    assert doc["meta"]["nranks"] == 2 and doc["meta"]["collectives"] == ["all_gather"]
    assert doc["backends"]["shmcomm"]["status"] == "ok"
    recs = doc["rows"]
    assert sorted((r["size"], r["variant"]) for r in recs) == [
        (8, "in-place"), (8, "out-of-place"), (64, "in-place"), (64, "out-of-place")]
    for r in recs:
        assert r["backend"] == "shmcomm" and r["collective"] == "all_gather" and r["type"] == "float32"
        assert r["count"] == r["size"] // 4 and r["iters"] == 3 and r["warmup"] == 1
        assert r["busbw_factor"] == pytest.approx(0.5)
        assert r["algbw_GBps"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 0.5)
        assert r["wrong"] == 0 and len(r["rank_times_us"]) == 2
        assert 0 < r["min_us"] <= r["time_us"] <= r["p90_us"]
        assert r["min_us"] <= r["mean_us"]
        # per iteration the slowest rank: its median is at least every rank's own median
        assert r["time_us"] >= max(r["rank_times_us"]) * (1 - 1e-9)
    assert doc["meta"]["version"] == shmcomm.__version__ and "median" in doc["meta"]["time"]

    with open(cs, newline="") as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == len(recs)
    assert list(lines[0]) == list(bench.report._CSV_FIELDS)
    for line, rec in zip(lines, recs):
        assert line["size"] == str(rec["size"]) and line["variant"] == rec["variant"]
        assert float(line["busbw_GBps"]) == pytest.approx(rec["busbw_GBps"])
        assert float(line["min_us"]) <= float(line["time_us"]) <= float(line["p90_us"])
        assert line["wrong"] == "0"


@pytest.mark.timeout(120)
def test_check_finds_no_wrong_element_in_any_collective(capsys, tmp_path):
    js = tmp_path / "all.json"
    status, out, err = run_main(capsys, "all", "-n", "2", "-b", "8", "-e", "4K", "-f", "512", "--iters", "2",
                                "--warmup", "1", "--check", "--json", str(js))
    assert status == 0, out + err
    recs = json.loads(js.read_text())["rows"]
    assert {r["collective"] for r in recs} == set(bench.COLLECTIVES)
    assert [r for r in recs if r["wrong"] != 0] == []
    factors = {r["collective"]: r["busbw_factor"] for r in recs}
    assert factors["all_reduce"] == 1.0 and factors["scatter"] == 0.5 and factors["send_recv"] == 1.0


@pytest.mark.timeout(120)
def test_check_on_three_ranks_zero_copy(capsys, tmp_path):
    js = tmp_path / "zc.json"
    status, out, err = run_main(capsys, "reduce_scatter", "-n", "3", "-b", "12", "-e", "3K", "-f", "16",
                                "--iters", "2", "--warmup", "0", "--dtype", "float16,int8,float64",
                                "--op", "max,prod,avg", "--zero-copy", "--check", "-q", "--json", str(js))
    assert status == 0, out + err
    recs = json.loads(js.read_text())["rows"]
    assert {(r["type"], r["redop"]) for r in recs} == {(d, o) for d in ("float16", "int8", "float64")
                                                       for o in ("max", "prod", "avg")}
    assert all(r["wrong"] == 0 and r["zero_copy"] for r in recs)
    assert "zero-copy (sc.empty)" in out


@pytest.mark.timeout(60)
def test_dtype_all_op_all_sweep_checks_every_pair_and_skips_invalid_ones_with_reasons(capsys, tmp_path):
    js = tmp_path / "all.json"
    status, out, err = run_main(capsys, "all_reduce", "-n", "2", "-b", "64", "-e", "64", "--iters", "1",
                                "--warmup", "0", "--dtype", "all", "--op", "all", "--check", "-q",
                                "--json", str(js))
    assert status == 0, out + err
    doc = json.loads(js.read_text())
    ran = {(r["type"], r["redop"]) for r in doc["rows"]}
    skipped = {(s["dtype"], s["op"]): s["reason"] for s in doc["skipped"]}
    for name in dtypes.NAMES:
        for op in bench.cases.OPS:
            assert ((name, op) in ran) != ((name, op) in skipped), (name, op)  # one or the other
    assert {"bool", "int16", "uint64", "float16", "bfloat16", "complex64", "complex128"} <= {t for t, _ in ran}
    assert {("int16", "band"), ("bool", "bxor"), ("uint8", "avg"), ("complex128", "prod")} <= ran
    assert skipped[("float32", "bor")] == "bitwise ops need an integer or bool dtype"
    assert skipped[("complex64", "min")] == "complex numbers have no order (no min/max)"
    assert skipped[("bool", "avg")] == "bool has no average"
    assert all(r["wrong"] == 0 for r in doc["rows"])
    assert "# skipped op band, bor, bxor on float16, bfloat16, float32" in out
    assert ": bitwise ops need an integer or bool dtype" in out and "# Out of bounds values : 0 OK" in out


@pytest.mark.timeout(60)
def test_root_all_covers_every_rooted_collective_and_checks(capsys, tmp_path):
    js = tmp_path / "roots.json"
    status, out, err = run_main(capsys, "all", "-n", "3", "-b", "24", "-e", "24", "--iters", "1",
                                "--warmup", "0", "--root", "all", "--dtype", "int32", "--op", "max",
                                "--check", "-q", "--json", str(js))
    assert status == 0, out + err
    recs = json.loads(js.read_text())["rows"]
    for coll in ("broadcast", "reduce", "gather", "scatter"):
        assert {r["root"] for r in recs if r["collective"] == coll} == {0, 1, 2}, coll
    assert {r["root"] for r in recs if r["collective"] == "all_reduce"} == {-1}
    assert {r["redop"] for r in recs if r["collective"] == "reduce"} == {"max"}
    assert {r["redop"] for r in recs if r["collective"] == "gather"} == {"none"}
    assert all(r["wrong"] == 0 for r in recs)


@pytest.mark.timeout(60)
def test_progress_off_a_terminal_is_one_start_and_one_finish_line(capsys):
    status, out, err = run_main(capsys, "broadcast", "-n", "2", "-b", "8", "-e", "512", "-f", "4",
                                "--iters", "2")
    assert status == 0, out + err
    # a machine busy with other work (another test) adds a load warning: not a progress line
    lines = [line for line in err.splitlines() if not line.startswith("shmcomm-bench: WARNING: load average")]
    assert len(lines) == 2, err  # no line per size (stderr is not a terminal here)
    assert lines[0].startswith("shmcomm-bench: measuring broadcast on shmcomm: 4 steps")
    assert re.match(r"shmcomm-bench: 4 of 4 steps in [\d.]+ s$", lines[1])
    assert "\r" not in err and "shmcomm-bench:" not in out


def test_progress_off_a_terminal_says_where_it_is_every_so_often(monkeypatch):
    monkeypatch.setattr(bench.progress, "LOG_EVERY", 0.0)  # a line at every step but the last
    stream = io.StringIO()
    progress = bench.progress.Progress(3, stream=stream)
    progress.start("all_reduce on shmcomm")
    for size in (8, 64, 512):
        progress("shmcomm", {"collective": "all_reduce", "size": size, "results": {}})
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert [re.sub(r"in [\d.]+ s", "in T s", line) for line in lines[1:]] == [
        "shmcomm-bench: 1 of 3 steps in T s (last: shmcomm all_reduce 8 B)",
        "shmcomm-bench: 2 of 3 steps in T s (last: shmcomm all_reduce 64 B)",
        "shmcomm-bench: 3 of 3 steps in T s"], lines


@pytest.mark.timeout(60)
def test_a_busy_machine_is_warned_about_and_unsteady_rows_are_flagged(capsys, monkeypatch):
    from shmcomm.bench import cli

    monkeypatch.setattr(cli, "_loadavg", lambda: 82.0)
    status, out, err = run_main(capsys, "barrier", "-n", "2", "--iters", "2", "-q")
    assert status == 0, out + err
    cores = len(os.sched_getaffinity(0))
    warning = (f"WARNING: load average 82.0 before the run on {cores} cores: other work is running, "
               "and every time here is slower than this machine can do (the peers' too, unevenly)")
    assert f"shmcomm-bench: {warning}" in err and f"# {warning}" in out
    rows = [{"backend": "shmcomm", "collective": "all_reduce", "size": 1 << 20, "variant": "in-place",
             "min_us": 100.0, "p90_us": 1240.0},
            {"backend": "shmcomm", "collective": "all_reduce", "size": 8, "variant": "in-place",
             "min_us": 1.0, "p90_us": 1.5}]
    assert cli._unsteady_rows(rows, "shmcomm", "all_reduce") == (
        "# unsteady (p90/min > 3: something else ran, or the machine changed state): 1 MiB ip (p90/min 12.4)")
    assert cli._unsteady_rows(rows[1:], "shmcomm", "all_reduce") is None


@pytest.mark.timeout(10)
def test_progress_on_a_terminal_is_one_live_line():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    progress = bench.progress.Progress(2, stream=stream)
    progress.start("all_reduce on shmcomm")
    for size in (8, 64):
        progress("shmcomm", {"collective": "all_reduce", "dtype": "int16", "op": "bxor", "root": -1,
                             "size": size, "results": {"in-place": {"time_us": 1.5}}})
    assert stream.getvalue().count("\r") == 2 and "\n" not in stream.getvalue()
    assert "2/2 [shmcomm] all_reduce int16 bxor 64 B: ip 1.5 us" in stream.getvalue()
    progress.finish()
    assert stream.getvalue().endswith("\n")
    quiet = Tty()
    bench.progress.Progress(2, enabled=False, stream=quiet).finish()
    assert quiet.getvalue() == ""


# ---- peers ----------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_missing_peers_are_reported_as_skipped(capsys, tmp_path, monkeypatch):
    real = bench.backend_available
    monkeypatch.setattr(bench.runner, "backend_available",
                        lambda name: (False, "torch is not installed") if name == "gloo" else real(name))
    monkeypatch.setenv("SHMCOMM_BENCH_UNAVAILABLE", "mpi")
    js = tmp_path / "s.json"
    status, out, err = run_main(capsys, "barrier", "-n", "2", "--iters", "2", "-q", "--backend",
                                "shmcomm,gloo,mpi", "--json", str(js))
    assert status == 0, out + err
    assert "# backend gloo: skipped (torch is not installed)" in out
    assert "# backend mpi: skipped (marked unavailable by SHMCOMM_BENCH_UNAVAILABLE)" in out
    assert "peer time" not in out  # no ratio without a peer that ran
    doc = json.loads(js.read_text())
    assert doc["backends"]["gloo"] == {**doc["backends"]["gloo"], "status": "skipped",
                                       "reason": "torch is not installed"}
    assert doc["backends"]["mpi"]["status"] == "skipped"
    assert {r["backend"] for r in doc["rows"]} == {"shmcomm"}


@pytest.mark.timeout(30)
def test_peer_that_cannot_do_the_dtype_is_skipped_with_the_reason(capsys):
    pytest.importorskip("mpi4py")  # without it the reason given is that mpi4py is missing
    status, out, err = run_main(capsys, "all_reduce", "-n", "2", *TINY, "--dtype", "float16",
                                "--backend", "mpi")
    assert status == 0
    assert "# backend mpi: skipped (MPI has no standard float16 datatype)" in out
    assert table_rows(out) == []


@pytest.mark.timeout(120)
@pytest.mark.skipif(not bench.backend_available("mpi")[0], reason="mpi4py or mpirun missing")
def test_ratio_summary_against_mpi(capsys, tmp_path):
    js = tmp_path / "m.json"
    status, out, err = run_main(capsys, "reduce", "-n", "2", *TINY, "--check", "--backend", "shmcomm,mpi",
                                "--json", str(js))
    assert status == 0, out + err
    doc = json.loads(js.read_text())
    assert doc["backends"]["mpi"]["status"] == "ok" and "mpi4py" in doc["backends"]["mpi"]["versions"]
    mpi = [r for r in doc["rows"] if r["backend"] == "mpi"]
    assert sorted((r["size"], r["variant"]) for r in mpi) == [
        (8, "in-place"), (8, "out-of-place"), (64, "in-place"), (64, "out-of-place")]
    assert all(r["wrong"] == 0 for r in doc["rows"])
    summary = out[out.index("# shmcomm time / peer time"):]
    ratio_rows = [line.split() for line in summary.splitlines()
                  if line.startswith("  reduce ") and "geomean" not in line]
    assert [r[4] for r in ratio_rows] == ["8", "64"]
    assert all(r[-1] == "ip" and float(r[5]) > 0 for r in ratio_rows)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("peer", ["gloo", "mpi", "impi"])
def test_peers_run_every_collective_and_check_clean(capsys, tmp_path, peer):
    if not bench.backend_available(peer)[0]:
        pytest.skip(bench.backend_available(peer)[1])
    js = tmp_path / "peer.json"
    status, out, err = run_main(capsys, "all", "-n", "2", "-b", "8", "-e", "8", "--iters", "2",
                                "--warmup", "0", "--check", "-q", "--backend", peer, "--json", str(js))
    assert status == 0, out + err
    doc = json.loads(js.read_text())
    assert doc["backends"][peer]["status"] == "ok"
    recs = doc["rows"]
    # (torch.distributed has no scan: skipped with that reason, the others run it against MPI_Scan)
    assert {r["collective"] for r in recs} == set(bench.COLLECTIVES) - ({"scan"} if peer == "gloo" else set())
    if peer == "gloo":
        assert "torch.distributed has no scan" in out
    assert [r for r in recs if r["wrong"] != 0] == []
    variants = {(r["collective"], r["variant"]) for r in recs}
    if peer in ("mpi", "impi"):  # MPI.IN_PLACE forms exist for every collective but broadcast/send_recv/barrier
        assert ("all_reduce", "out-of-place") in variants and ("all_to_all", "in-place") in variants
    else:  # torch.distributed reduces in place only
        assert ("all_reduce", "out-of-place") not in variants and ("all_reduce", "in-place") in variants


@pytest.mark.timeout(30)
def test_intel_mpi_is_found_by_its_prefix_and_a_wrong_one_is_named(tmp_path, monkeypatch):
    pytest.importorskip("mpi4py")  # without it the reason given is that mpi4py is missing
    from shmcomm.bench.peers import intel_mpi

    monkeypatch.setenv("SHMCOMM_BENCH_IMPI", str(tmp_path))
    assert intel_mpi().reason == (f"SHMCOMM_BENCH_IMPI={tmp_path} holds no Intel MPI "
                                  "(bin/mpiexec, bin/impi_info and lib/libmpi.so.12)")
    assert bench.backend_available("impi") == (False, intel_mpi().reason)
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "bin" / "mpiexec").write_text("#!/bin/sh\n")
    (tmp_path / "lib" / "libmpi.so.12").write_text("")
    assert intel_mpi().reason, "MPICH's layout (no impi_info) taken for Intel MPI"
    (tmp_path / "bin" / "mpiexec").chmod(0o755)
    (tmp_path / "bin" / "impi_info").write_text("")
    found = intel_mpi()
    assert (found.mpiexec, found.libmpi, found.reason) == (
        str(tmp_path / "bin" / "mpiexec"), str(tmp_path / "lib" / "libmpi.so.12"), "")
    assert found.environment() == {"MPI4PY_LIBMPI": found.libmpi, "I_MPI_FABRICS": "shm"}


def test_deepspeed_peer_skips_what_its_op_cannot_do():
    from shmcomm.bench.cases import peer_skip
    from shmcomm.bench.peers import deepspeed_half_missing

    assert peer_skip("deepspeed", Case("broadcast", "float32", "none", 0)) == \
        "DeepSpeed's shared-memory op is an all_reduce only"
    assert peer_skip("deepspeed", Case("all_reduce", "float32", "max", -1)) == \
        "DeepSpeed's shared-memory op sums only"
    assert peer_skip("deepspeed", Case("all_reduce", "int32", "sum", -1)) == \
        "DeepSpeed's shared-memory op takes float32, bfloat16 and float16 only"
    assert peer_skip("deepspeed", Case("all_reduce", "float32", "sum", -1)) is None
    assert peer_skip("deepspeed", Case("all_reduce", "bfloat16", "sum", -1)) == deepspeed_half_missing()
    assert peer_skip("impi", Case("all_reduce", "float16", "sum", -1)) == "MPI has no standard float16 datatype"


@pytest.mark.timeout(300)
def test_deepspeed_peer_runs_its_all_reduce_and_leaves_nothing_in_dev_shm(capsys, tmp_path):
    if not bench.backend_available("deepspeed")[0]:
        pytest.skip(bench.backend_available("deepspeed")[1])
    from shmcomm.bench.peers import deepspeed_leftovers

    before = deepspeed_leftovers()
    js = tmp_path / "ds.json"
    status, out, err = run_main(capsys, "all_reduce", "-n", "2", "-b", "8", "-e", "64K", "-f", "64",
                                "--iters", "5", "--warmup", "1", "--check", "-q", "--dtype",
                                "float32,int32", "--backend", "shmcomm,deepspeed", "--json", str(js))
    assert status == 0, out + err
    doc = json.loads(js.read_text())
    assert doc["backends"]["deepspeed"]["status"] == "ok", doc["backends"]["deepspeed"]
    rows = [r for r in doc["rows"] if r["backend"] == "deepspeed"]
    assert {(r["type"], r["variant"]) for r in rows} == {("float32", "in-place")}
    assert sorted(r["size"] for r in rows) == [8, 512, 32768] and all(r["wrong"] == 0 for r in rows)
    assert "DeepSpeed's shared-memory op takes float32, bfloat16 and float16 only" in out
    assert deepspeed_leftovers() == before


@pytest.mark.timeout(60)
def test_a_failing_worker_is_reported_and_leaves_nothing_behind():
    cfg = {"cases": [Case("all_reduce", "float32", "no-such-op", -1)], "sizes": [8], "iters": 1,
           "warmup": 0, "target_time": 0.01, "zero_copy": False, "check": False, "timeout": 20}
    before = bench_segments()
    res = bench.run_backend("shmcomm", 2, cfg, timeout=40)
    assert res.status == "failed"
    assert re.search(r"rank [01] \(pid \d+\) ended with exit code 1", res.reason), res.reason
    assert "NO-SUCH-OP" in res.reason
    assert bench_segments() <= before


# ---- plot -----------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_plot_file_is_written(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    png = tmp_path / "p.png"
    status, out, err = run_main(capsys, "all_reduce", "-n", "2", *TINY, "--plot", str(png))
    assert status == 0, out + err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(60)
def test_plot_has_bands_labels_an_outside_legend_and_the_facts(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at
    recs = [dict(_record(b, "all_reduce", s, "in-place", t * s / 8 + 1, (0.5, 2.0)), busbw_factor=1.0)
            for b, t in (("shmcomm", 1.0), ("gloo", 3.0)) for s in (8, 64, 512, 4096)]
    png = tmp_path / "p.png"
    bench.write_plot(str(png), recs, ["all_reduce"], "all_reduce, 2 ranks", "shmcomm 9.9 | 2 cores, 2 ranks")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = figures
    fig.canvas.draw()
    assert "shmcomm 9.9" in fig._suptitle.get_text() and "2 cores" in fig._suptitle.get_text()
    ax_t, ax_b = fig.axes
    assert [t.get_text() for t in ax_t.get_xticklabels()][0] == "8"  # the first size is labelled
    for ax in (ax_t, ax_b):  # a min-p90 band per backend
        assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 2
    legend = ax_b.get_legend()
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in (ax_t, ax_b))
    assert {t.get_text() for t in legend.get_texts()} == {"shmcomm in-place", "gloo in-place"}
    # no blank band between the title and the panels
    title_bottom = fig._suptitle.get_window_extent(renderer).y0
    panels_top = max(ax.get_tightbbox(renderer).y1 for ax in (ax_t, ax_b))
    assert 0 <= title_bottom - panels_top < 0.05 * fig.bbox.height
    monkeypatch.undo()
    plt.close(fig)


@pytest.mark.timeout(30)
def test_plot_without_matplotlib_is_a_clear_error_naming_the_plot_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(SystemExit) as exc:
        bench.main(["all_reduce", "-n", "2", "--plot", "x.png"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and "pip install 'shmcomm[plot]'" in err
    assert "shmcomm[bench]" not in err  # that extra pulls in torch and mpi4py too
    assert "measuring" not in err  # refused before sweeping


@pytest.mark.timeout(120)
def test_automatic_iteration_count_is_bounded_and_shared(capsys, tmp_path):
    js = tmp_path / "auto.json"
    status, out, err = run_main(capsys, "all_reduce", "-n", "2", "-b", "8", "-e", "1M", "-f", "128",
                                "--target-time", "0.002", "-q", "--json", str(js))
    assert status == 0, out + err
    recs = json.loads(js.read_text())["rows"]
    assert [r["size"] for r in recs] == [8, 1024, 131072]
    for r in recs:
        assert 5 <= r["iters"] <= 20000
        assert r["warmup"] == max(1, min(r["iters"] // 10, 1000))
    assert "# load average (1 min) before:" in out


@pytest.mark.timeout(30)
def test_a_silent_worker_is_stopped_after_the_timeout(tmp_path):
    log = tmp_path / "w.log"
    log.write_text("still thinking\n")
    quiet = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE)
    res = bench.BackendResult("shmcomm", "failed")
    run = bench.runner._Running(res, [quiet], [str(log)], None, None, timeout=0.5)
    try:
        assert run.next("row") is None and not run.live
        assert "no progress for 0.5 s" in res.reason and "still thinking" in res.reason
    finally:
        run.finish()
    assert quiet.returncode is not None and res.status == "failed"


# ---- turns: backends run at once and take turns size by size ---------------------------------
@pytest.mark.timeout(10)
def test_gate_blocks_until_opened_and_stops_the_worker_when_closed(tmp_path):
    gates = bench.turns.Gates(str(tmp_path), "shmcomm", 2)
    workers = [bench.turns.Gate(gates.template, r) for r in range(2)]
    passed = []
    thread = threading.Thread(target=lambda: (workers[1].wait(), passed.append(1)))
    thread.start()
    thread.join(0.3)
    assert thread.is_alive() and not passed  # nobody opened the gate yet
    gates.open()
    thread.join(5)
    assert passed == [1]
    workers[0].wait()  # rank 0's byte is waiting for it
    gates.close()
    for w in workers:
        with pytest.raises(bench.turns.GateClosed):
            w.wait()
        w.close()
    bench.turns.Gate(None, 0).wait()  # a worker started without gates never waits


@pytest.mark.timeout(10)
def test_best_of_rounds_keeps_the_fastest_round_and_every_time():
    def row(size, rnd, t, wrong):
        return {"collective": "all_reduce", "dtype": "float32", "op": "sum", "root": -1, "size": size,
                "round": rnd, "results": {"in-place": {"time_us": t, "rank_times_us": [t, t / 2], "wrong": wrong}}}
    merged = bench.report._best_of_rounds([row(8, 0, 3.0, 0), row(64, 0, 9.0, 0), row(8, 1, 2.0, 1),
                                           row(64, 1, 10.0, 0), row(8, 2, 4.0, 0)])
    assert [(r["size"], r["results"]["in-place"]["time_us"]) for r in merged] == [(8, 2.0), (64, 9.0)]
    best8 = merged[0]["results"]["in-place"]
    assert best8["round_times_us"] == [3.0, 2.0, 4.0] and best8["rank_times_us"] == [2.0, 1.0]
    assert best8["wrong"] == 1  # a wrong element in any round counts
    unchecked = bench.report._best_of_rounds([row(8, 0, 3.0, None), row(8, 1, 2.0, None)])
    assert unchecked[0]["results"]["in-place"]["wrong"] is None


@pytest.mark.timeout(180)
def test_backends_take_turns_step_by_step_with_rounds_and_skipped_cases(tmp_path):
    pytest.importorskip("torch")
    # gloo has no int16: shmcomm measures it alone, and the turns of the other steps stay paired
    cases = [Case("all_reduce", "float32", "sum", -1), Case("all_reduce", "int16", "sum", -1),
             Case("all_reduce", "float32", "max", -1)]
    cfg = {"cases": cases, "sizes": [8, 64], "iters": 3, "warmup": 1, "target_time": 0.01, "zero_copy": False,
           "check": True, "timeout": 60, "rounds": 2}
    done = []
    shm, gloo = bench.run_backends(["shmcomm", "gloo"], 2, cfg,
                                   lambda backend, row: done.append((backend, row["dtype"], row["op"], row["size"])))
    assert shm.status == gloo.status == "ok", shm.reason + gloo.reason
    assert [(c.dtype, why) for c, why in gloo.skipped] == [("int16", "torch.distributed gloo has no int16")]
    expected, turn = [], 0
    for case in cases:  # each step: every backend that runs it, the order alternating, per round
        for size in (8, 64):
            for _ in range(2):
                order = ["shmcomm", "gloo"] if turn % 2 == 0 else ["gloo", "shmcomm"]
                expected += [(b, case.dtype, case.op, size) for b in order
                             if b == "shmcomm" or case.dtype != "int16"]
                turn += 1
    assert done == expected
    recs = bench.report._records([shm, gloo], 2, cfg)
    assert len(recs) == 10  # shmcomm 3 cases x 2 sizes, gloo 2 x 2 (in place only)
    for r in recs:
        assert len(r["round_times_us"]) == 2 and r["time_us"] == min(r["round_times_us"])
        assert r["wrong"] == 0


def _workers_alive() -> dict[str, int]:
    """This process's benchmark workers that have not exited, counted per backend."""
    import psutil

    alive: dict[str, int] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = proc.cmdline()
            if "--worker" in cmd and proc.status() != psutil.STATUS_ZOMBIE:
                backend = cmd[cmd.index("--worker") + 1]
                alive[backend] = alive.get(backend, 0) + 1
        except psutil.Error:  # exited meanwhile
            pass
    return alive


TURNS_CFG = {"cases": [Case("all_reduce", "float32", "sum", -1)], "sizes": [8, 64], "iters": 3, "warmup": 1,
             "target_time": 0.01, "zero_copy": False, "check": True, "timeout": 60, "rounds": 1}


@pytest.mark.timeout(120)
def test_no_backend_leaves_its_group_while_another_measures():
    """#33 item 4: a backend that measured its last size tore down (gloo's threads, MPI's finalize)
    while the others still measured theirs. Each row waits a second at the last size, time enough
    for a finished backend to exit: every worker of both backends must still be there."""
    pytest.importorskip("torch")
    seen = []

    def progress(backend, row):
        if row["size"] == TURNS_CFG["sizes"][-1]:
            time.sleep(1.0)
        seen.append((backend, row["size"], _workers_alive()))

    shm, gloo = bench.run_backends(["shmcomm", "gloo"], 2, TURNS_CFG, progress)
    assert shm.status == gloo.status == "ok", shm.reason + gloo.reason
    # the last size's turn starts with gloo (the order alternates), then shmcomm measures alone
    assert [(b, size) for b, size, _ in seen] == [("shmcomm", 8), ("gloo", 8), ("gloo", 64), ("shmcomm", 64)]
    assert all(alive == {"shmcomm": 2, "gloo": 2} for _, _, alive in seen), seen
    assert _workers_alive() == {}


@pytest.mark.timeout(180)
def test_serial_runs_each_backend_alone_alternating_per_round():
    """--serial: one backend's workers at a time, a whole sweep each, the order of the backends
    alternating per round; rows keep their round, so the best of the rounds is reported."""
    pytest.importorskip("torch")
    seen = []
    cfg = dict(TURNS_CFG, rounds=2)
    shm, gloo = bench.run_backends(["shmcomm", "gloo"], 2, cfg,
                                   lambda backend, row: seen.append((backend, row["size"], _workers_alive())),
                                   serial=True)
    assert shm.status == gloo.status == "ok", shm.reason + gloo.reason
    order = ["shmcomm", "gloo", "gloo", "shmcomm"]  # round 0, then round 1 reversed
    assert [(b, size) for b, size, _ in seen] == [(b, size) for b in order for size in (8, 64)]
    assert all(alive == {b: 2} for b, _, alive in seen), seen
    assert [r["round"] for r in shm.rows] == [0, 0, 1, 1] and [r["round"] for r in gloo.rows] == [0, 0, 1, 1]
    recs = bench.report._records([shm, gloo], 2, cfg)
    assert len(recs) == 4  # 2 backends x 2 sizes, in place only
    for r in recs:
        assert len(r["round_times_us"]) == 2 and r["time_us"] == min(r["round_times_us"]) and r["wrong"] == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cores, flags, mode", [
    (2, [], "backends one after another, each alone (default for 2 ranks x 2 backends > 2 cores)"),
    (4, [], "backends at once, taking turns size by size (default for 2 ranks x 2 backends <= 4 cores)"),
    (4, ["--serial"], "backends one after another, each alone (--serial)"),
    (2, ["--interleave"], "backends at once, taking turns size by size (--interleave)"),
])
def test_mode_defaults_to_serial_when_ranks_times_backends_exceed_the_cores(monkeypatch, cores, flags, mode):
    pytest.importorskip("torch")
    monkeypatch.setattr(bench.cli, "usable_cores", lambda: list(range(cores)))
    args = bench.parse_args(["all_reduce", "-n", "2", "--backend", "shmcomm,gloo", *flags])
    assert args.mode == mode and args.serial == mode.startswith("backends one after another")
    monkeypatch.setenv("SHMCOMM_BENCH_UNAVAILABLE", "gloo")  # a backend that cannot run takes no cores
    assert bench.parse_args(["all_reduce", "-n", "2", "--backend", "shmcomm,gloo"]).mode == "backend shmcomm alone"


@pytest.mark.timeout(120)
def test_header_and_json_say_which_mode_ran(capsys, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(bench.cli, "usable_cores", lambda: [0, 1])
    js = tmp_path / "m.json"
    status, out, err = run_main(capsys, "all_reduce", "-n", "2", *TINY, "--backend", "shmcomm,gloo",
                                "--json", str(js))
    assert status == 0, out + err
    mode = "backends one after another, each alone (default for 2 ranks x 2 backends > 2 cores)"
    assert out.splitlines()[1] == f"# {mode}"
    doc = json.loads(js.read_text())
    assert doc["meta"]["mode"] == mode and doc["meta"]["serial"] is True
    assert {r["backend"] for r in doc["rows"]} == {"shmcomm", "gloo"}


@pytest.mark.timeout(30)
def test_version_and_conflicting_modes(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"shmcomm-bench {shmcomm.__version__}\n"
    with pytest.raises(SystemExit) as exc:
        bench.main(["all_reduce", "-n", "2", "--serial", "--interleave"])
    assert exc.value.code == 2 and "not allowed with argument --serial" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_backend_that_dies_mid_sweep_leaves_the_others_running():
    pytest.importorskip("torch")
    import psutil

    cfg = {"cases": [Case("all_reduce", "float32", "sum", -1)], "sizes": [8, 64, 512], "iters": 3,
           "warmup": 1, "target_time": 0.01, "zero_copy": False, "check": True, "timeout": 20, "rounds": 1}
    killed = []

    def progress(backend, row):  # after shmcomm's first size, SIGKILL its rank 1
        if backend != "shmcomm" or killed:
            return
        for proc in psutil.Process().children(recursive=True):
            try:
                if "--worker" in proc.cmdline() and proc.environ().get("RANK") == "1" \
                        and "shmcomm" in proc.cmdline():
                    proc.kill()
                    killed.append(proc.pid)
            except psutil.Error:  # exited meanwhile
                pass

    before = bench_segments()
    shm, gloo = bench.run_backends(["shmcomm", "gloo"], 2, cfg, progress, timeout=40)
    assert killed
    assert shm.status == "failed" and len(shm.rows) == 1
    assert re.search(r"rank 1 \(pid \d+\) ended with signal 9", shm.reason), shm.reason
    assert gloo.status == "ok", gloo.reason
    assert [r["size"] for r in gloo.rows] == [8, 64, 512]
    assert all(m["wrong"] == 0 for r in gloo.rows for m in r["results"].values())
    assert bench_segments() <= before



@pytest.mark.timeout(180)
def test_dtype_list_is_swept_and_compared_per_dtype(capsys, tmp_path):
    """--dtype float32,float16,bfloat16: one table per backend with a type column, checked, and
    shmcomm/gloo ratios with a geometric mean per dtype (gloo where torch is installed)."""
    pytest.importorskip("ml_dtypes")
    backends = "shmcomm,gloo" if bench.backend_available("gloo")[0] else "shmcomm"
    js = tmp_path / "d.json"
    status, out, err = run_main(capsys, "all_reduce", "-n", "2", *TINY, "--check", "--dtype",
                                "float32,fp16,bf16", "--backend", backends, "--json", str(js))
    assert status == 0, out + err
    doc = json.loads(js.read_text())
    assert doc["meta"]["dtype"] == ["float32", "float16", "bfloat16"]
    for backend in backends.split(","):
        types = [r["type"] for r in doc["rows"] if r["backend"] == backend]
        assert types == ["float32"] * 2 + ["float16"] * 2 + ["bfloat16"] * 2, (backend, types)
    assert all(r["wrong"] == 0 for r in doc["rows"])
    if "gloo" in backends:
        summary = out[out.index("# shmcomm time / peer time"):]
        geo = [line.split()[1] for line in summary.splitlines() if "geomean" in line]
        assert geo == ["float32", "float16", "bfloat16", "all"]


@pytest.mark.timeout(60)
def test_bitwise_ops_on_int16_and_bool_are_checked_clean(capsys, tmp_path):
    js = tmp_path / "bits.json"
    status, out, err = run_main(capsys, "all_reduce", "-n", "3", *TINY, "--check", "--dtype", "int16,bool",
                                "--op", "band,bor,bxor", "--json", str(js))
    assert status == 0, out + err
    recs = json.loads(js.read_text())["rows"]
    assert {(r["type"], r["redop"]) for r in recs} == {(d, o) for d in ("int16", "bool")
                                                       for o in ("band", "bor", "bxor")}
    assert all(r["wrong"] == 0 for r in recs) and "Out of bounds values : 0 OK" in out


# ---- cases, dtypes and references, in this process ------------------------------------------
@pytest.mark.timeout(10)
def test_invalid_pairs_come_from_the_library_and_peers_say_why():
    assert bench.why_invalid("float64", "band") == "bitwise ops need an integer or bool dtype"
    assert bench.why_invalid("complex128", "max") == "complex numbers have no order (no min/max)"
    assert bench.why_invalid("bool", "avg") == "bool has no average"
    assert all(bench.why_invalid(d, "sum") is None for d in dtypes.NAMES)
    assert bench.why_invalid("int8", "avg") is None and bench.why_invalid("bool", "bxor") is None
    assert bench.peer_skip("gloo", Case("broadcast", "uint16", "none", 0)) == "torch.distributed gloo has no uint16"
    assert bench.peer_skip("gloo", Case("all_reduce", "complex64", "prod", -1)).startswith("gloo reduces complex")
    assert bench.peer_skip("mpi", Case("all_reduce", "bool", "sum", -1)).startswith("MPI's C_BOOL")
    assert bench.peer_skip("mpi", Case("broadcast", "bool", "none", 0)) is None
    cases, skipped = bench.expand(["barrier", "gather"], ["int8", "float32"], ["sum"], [0, 1], 2)
    assert [tuple(c) for c in cases] == [("barrier", "int8", "none", -1), ("gather", "int8", "none", 0),
                                         ("gather", "int8", "none", 1), ("gather", "float32", "none", 0),
                                         ("gather", "float32", "none", 1)]
    assert skipped == []


@pytest.mark.timeout(10)
@pytest.mark.parametrize("name", ["bool", "int8", "uint16", "int64", "float16", "bfloat16", "complex64"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "avg", "bxor"])
def test_references_are_numpy_arithmetic_on_the_patterns(name, op):
    if bench.why_invalid(name, op):
        pytest.skip(bench.why_invalid(name, op))
    pytest.importorskip("ml_dtypes")
    dt, n = dtypes.bench_dtype(name), 3
    inputs = [verify.pattern(q, 16, dt, op) for q in range(n)]
    assert len({a.tobytes() for a in inputs}) == n  # every rank holds something else
    # what the library's own kernel computes for the same inputs, locally, must equal the reference
    out = np.empty(16, dt.storage)
    shmcomm._core.reduce_kernel(out, inputs, int(bench.cases.reduce_op(op)))
    assert verify.count_wrong(out, verify.reference(16, n, dt, op), dt) == 0
    wrong = out.copy()  # and one element off is one wrong element
    wrong[3:4] = ~out[3:4] if name == "bool" else dt.encode(dt.decode(out[3:4]) + 1)
    assert verify.count_wrong(wrong, verify.reference(16, n, dt, op), dt) == 1


@pytest.mark.timeout(10)
def test_bfloat16_without_ml_dtypes_is_held_as_its_bits():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits = dtypes.BenchDtype("bfloat16", np.dtype(np.uint16), bits16=True)
    values = np.array([0.0, 1.0, -3.0, 1 / 3, 2 / 3, 257.0, 1e-3])
    assert np.array_equal(bits.encode(values), values.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.array_equal(bits.decode(bits.encode(values)), values.astype(ml_dtypes.bfloat16).astype(np.float64))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("module", ["table", "dtypes", "cases", "verify", "measure", "report", "sizes", "workers"])
def test_docstring_examples_of_the_bench_run(module):
    mod = importlib.import_module(f"shmcomm.bench.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


class _OneRank:
    """Stands in for a backend's worker in _plan_iters: rank 0 of one, bcast is the identity."""

    rank = 0

    def bcast_obj(self, obj):
        return obj


def _slow_start_case(slow_calls: int, slow_s: float, fast_s: float):
    """A case whose first ``slow_calls`` calls take ``slow_s`` each (peers still waking up after
    start-up), then ``fast_s``: what an 8-byte all_reduce at 16 ranks looked like on 16 cores."""
    from shmcomm.bench.measure import _Case
    calls = iter(range(1 << 30))

    def call():
        k = next(calls)
        end = time.perf_counter() + (slow_s if k < slow_calls else fast_s)
        while time.perf_counter() < end:
            pass
    return _Case(call=call, fills=[], values=np.zeros(1), check=None)


def test_iterations_are_planned_after_the_start_up_calls():
    """3 slow probes once planned 13 iterations (70 us each) that measured the warm-up of an
    all_reduce that then took 3 us: the plan now waits for two rounds of probes that agree."""
    from shmcomm.bench.measure import _plan_iters
    plan = _plan_iters(_OneRank(), _slow_start_case(5, 2e-3, 50e-6), target_time=0.1)
    assert 1000 <= plan <= 2600, plan  # 0.1 s of 50 us calls (busy-waited; a loaded machine stretches them)
    steady = _plan_iters(_OneRank(), _slow_start_case(0, 0, 50e-6), target_time=0.1)
    assert 1000 <= steady <= 2600, steady
    # probes stop at half the target time: slow calls throughout give a plan from their time
    slow = _plan_iters(_OneRank(), _slow_start_case(10 ** 6, 2e-3, 0), target_time=0.02)
    assert 5 <= slow <= 12, slow
