"""Tests of ``shmcomm-bench`` (shmcomm/bench/): its own code paths, not the speed it measures.

Sweeps are tiny (-n 2 or 3, a couple of sizes, a few iterations) because the machine has two cores
and other suites run beside this one; nothing here asserts a time.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
import threading

import pytest

from shmcomm import bench, segments

TINY = ["-b", "8", "-e", "64", "-f", "8", "--iters", "3", "--warmup", "1", "-q"]


def run_main(capsys, *argv):
    """Run the tool in this process; returns (exit status, stdout, stderr)."""
    status = bench.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


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


def _record(backend, coll, size, variant, time_us):
    return {"backend": backend, "collective": coll, "size": size, "count": size // 4, "type": "float32",
            "redop": "sum", "root": -1, "variant": variant, "time_us": time_us,
            "algbw_GBps": size / time_us / 1e3, "busbw_GBps": size / time_us / 1e3, "wrong": None}


@pytest.mark.timeout(10)
def test_format_table_columns_and_na_cells():
    recs = [_record("shmcomm", "all_reduce", 8, "in-place", 2.0),
            _record("shmcomm", "all_reduce", 1024, "in-place", 4.0)]
    text = bench.format_table(recs, "shmcomm", "all_reduce")
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert "out-of-place" in head[0] and "in-place" in head[0]
    assert head[1].split()[1:] == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                                   "#wrong", "time", "algbw", "busbw", "#wrong"]
    assert head[2].split()[1:3] == ["(B)", "(elements)"]
    rows = table_rows(text)
    assert [r[:6] for r in rows] == [["8", "2", "float32", "sum", "-1", "n/a"],
                                     ["1024", "256", "float32", "sum", "-1", "n/a"]]
    assert rows[0][6:] == ["2.00", "0.00", "0.00", "N/A"]  # N/A: not checked
    # every column of a row starts where its heading ends (right-aligned under the title)
    names = head[1]
    data = [line for line in text.splitlines() if line.startswith(" ")][1]
    assert names.index("size") + len("size") == data.index("1024") + len("1024")
    assert names.rindex("time") + len("time") == data.index("4.00") + len("4.00")


@pytest.mark.timeout(10)
def test_format_ratios_uses_the_variant_both_measured():
    recs = [_record("shmcomm", "all_reduce", 8, "in-place", 2.0),
            _record("mpi", "all_reduce", 8, "out-of-place", 1.0),
            _record("mpi", "all_reduce", 8, "in-place", 4.0),
            _record("shmcomm", "all_reduce", 64, "in-place", 3.0),
            _record("mpi", "all_reduce", 64, "in-place", 1.0)]
    text = bench.format_ratios(recs, ["all_reduce"], ["gloo", "mpi"])
    lines = {tuple(line.split()[:2]): line for line in text.splitlines() if not line.startswith("#")}
    assert "0.5 (ip)" in lines[("all_reduce", "8")]  # 2 / 4 (in-place), not 2 / 1
    assert "3 (ip)" in lines[("all_reduce", "64")]
    assert lines[("all_reduce", "8")].split()[2] == "-"  # gloo did not run
    geo = [line for line in text.splitlines() if "geomean" in line][0]
    assert float(geo.split()[-1]) == pytest.approx(math.sqrt(0.5 * 3), rel=1e-2)


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
    (["all_reduce", "-n", "2", "--op", "avg", "--dtype", "int32"], "--op avg needs a floating-point"),
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
    for option in ("--zero-copy", "--check", "--backend", "--json", "--csv", "--plot", "--iters", "--warmup"):
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
    assert all(len(r) == 13 and r[8] == "0" and r[12] == "0" for r in rows)  # both variants checked
    assert "# Out of bounds values : 0 OK" in out

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
        assert r["time_us"] == pytest.approx(max(r["rank_times_us"]))

    with open(cs, newline="") as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == len(recs)
    assert list(lines[0]) == list(bench.report._CSV_FIELDS)
    for line, rec in zip(lines, recs):
        assert line["size"] == str(rec["size"]) and line["variant"] == rec["variant"]
        assert float(line["busbw_GBps"]) == pytest.approx(rec["busbw_GBps"])
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
@pytest.mark.parametrize("dtype, op", [("float16", "max"), ("int8", "prod"), ("float64", "avg")])
def test_check_on_three_ranks_zero_copy(capsys, tmp_path, dtype, op):
    js = tmp_path / "zc.json"
    status, out, err = run_main(capsys, "reduce_scatter", "-n", "3", "-b", "12", "-e", "3K", "-f", "16",
                                "--iters", "2", "--warmup", "0", "--dtype", dtype, "--op", op, "--zero-copy",
                                "--check", "-q", "--json", str(js))
    assert status == 0, out + err
    recs = json.loads(js.read_text())["rows"]
    assert recs and all(r["wrong"] == 0 and r["zero_copy"] and r["type"] == dtype for r in recs)
    assert "zero-copy (sc.empty)" in out


@pytest.mark.timeout(120)
def test_progress_lines_on_stderr(capsys):
    status, out, err = run_main(capsys, "broadcast", "-n", "2", "-b", "8", "-e", "64", "-f", "8",
                                "--iters", "2")
    assert status == 0
    assert "[shmcomm] 1/2 broadcast 8 B: ip" in err
    assert "[shmcomm] 2/2 broadcast 64 B: ip" in err
    assert "[shmcomm]" not in out


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
    assert [r[1] for r in ratio_rows] == ["8", "64"]
    assert all(r[3] == "(ip)" and float(r[2]) > 0 for r in ratio_rows)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("peer", ["gloo", "mpi"])
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
    assert {r["collective"] for r in recs} == set(bench.COLLECTIVES)
    assert [r for r in recs if r["wrong"] != 0] == []
    variants = {(r["collective"], r["variant"]) for r in recs}
    if peer == "mpi":  # MPI.IN_PLACE forms exist for every collective but broadcast/send_recv/barrier
        assert ("all_reduce", "out-of-place") in variants and ("all_to_all", "in-place") in variants
    else:  # torch.distributed reduces in place only
        assert ("all_reduce", "out-of-place") not in variants and ("all_reduce", "in-place") in variants


@pytest.mark.timeout(60)
def test_a_failing_worker_is_reported_and_leaves_nothing_behind():
    cfg = {"collectives": ["all_reduce"], "sizes": [8], "dtype": "no-such-dtype", "op": "sum", "iters": 1,
           "warmup": 0, "target_time": 0.01, "zero_copy": False, "check": False, "timeout": 20}
    before = {s.name for s in segments.list_segments()}
    res = bench.run_backend("shmcomm", 2, cfg, timeout=40)
    assert res.status == "failed"
    assert re.search(r"rank [01] \(pid \d+\) ended with exit code 1", res.reason), res.reason
    assert "no-such-dtype" in res.reason
    assert {s.name for s in segments.list_segments()} <= before


# ---- plot -----------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_plot_file_is_written(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    png = tmp_path / "p.png"
    status, out, err = run_main(capsys, "all_reduce", "-n", "2", *TINY, "--plot", str(png))
    assert status == 0, out + err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(30)
def test_plot_without_matplotlib_is_a_clear_error_before_any_run(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(SystemExit) as exc:
        bench.main(["all_reduce", "-n", "2", "--plot", "x.png"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and "pip install" in err
    assert "[shmcomm]" not in err  # refused before sweeping


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
        return {"collective": "all_reduce", "size": size, "round": rnd,
                "results": {"in-place": {"time_us": t, "rank_times_us": [t, t / 2], "wrong": wrong}}}
    merged = bench.report._best_of_rounds([row(8, 0, 3.0, 0), row(64, 0, 9.0, 0), row(8, 1, 2.0, 1),
                                           row(64, 1, 10.0, 0), row(8, 2, 4.0, 0)])
    assert [(r["size"], r["results"]["in-place"]["time_us"]) for r in merged] == [(8, 2.0), (64, 9.0)]
    best8 = merged[0]["results"]["in-place"]
    assert best8["round_times_us"] == [3.0, 2.0, 4.0] and best8["rank_times_us"] == [2.0, 1.0]
    assert best8["wrong"] == 1  # a wrong element in any round counts
    unchecked = bench.report._best_of_rounds([row(8, 0, 3.0, None), row(8, 1, 2.0, None)])
    assert unchecked[0]["results"]["in-place"]["wrong"] is None


@pytest.mark.timeout(180)
def test_backends_take_turns_size_by_size_with_rounds(capsys, tmp_path):
    pytest.importorskip("torch")
    js = tmp_path / "turns.json"
    status, out, err = run_main(capsys, "all_reduce", "-n", "2", "-b", "8", "-e", "64", "-f", "8",
                                "--iters", "3", "--warmup", "1", "--rounds", "2", "--check",
                                "--backend", "shmcomm,gloo", "--json", str(js))
    assert status == 0, out + err
    done = re.findall(r"^\[(\w+)\] \d+/4 all_reduce (\d+) B", err, re.M)
    # Each size: every backend once per round, the order alternating, before the next size.
    assert done == [("shmcomm", "8"), ("gloo", "8"), ("gloo", "8"), ("shmcomm", "8"),
                    ("shmcomm", "64"), ("gloo", "64"), ("gloo", "64"), ("shmcomm", "64")]
    assert "best of 2 rounds" in out and "# Out of bounds values : 0 OK" in out
    doc = json.loads(js.read_text())
    assert doc["meta"]["rounds"] == 2
    recs = doc["rows"]
    assert sorted((r["backend"], r["size"]) for r in recs) == [("gloo", 8), ("gloo", 64),
                                                              ("shmcomm", 8), ("shmcomm", 64)]
    for r in recs:
        assert len(r["round_times_us"]) == 2 and r["time_us"] == min(r["round_times_us"])
        assert r["wrong"] == 0


@pytest.mark.timeout(120)
def test_a_backend_that_dies_mid_sweep_leaves_the_others_running():
    pytest.importorskip("torch")
    import psutil

    cfg = {"collectives": ["all_reduce"], "sizes": [8, 64, 512], "dtype": "float32", "op": "sum",
           "iters": 3, "warmup": 1, "target_time": 0.01, "zero_copy": False, "check": True,
           "timeout": 20, "rounds": 1}
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

    before = {s.name for s in segments.list_segments()}
    shm, gloo = bench.run_backends(["shmcomm", "gloo"], 2, cfg, progress, timeout=40)
    assert killed
    assert shm.status == "failed" and len(shm.rows) == 1
    assert re.search(r"rank 1 \(pid \d+\) ended with signal 9", shm.reason), shm.reason
    assert gloo.status == "ok", gloo.reason
    assert [r["size"] for r in gloo.rows] == [8, 64, 512]
    assert all(m["wrong"] == 0 for r in gloo.rows for m in r["results"].values())
    assert {s.name for s in segments.list_segments()} <= before



@pytest.mark.timeout(180)
def test_dtype_list_is_swept_and_compared_per_dtype(capsys, tmp_path):
    """--dtype float32,float16,bfloat16: one table per dtype and backend, checked, and shmcomm/gloo
    ratios per dtype at the end (gloo where torch is installed)."""
    pytest.importorskip("ml_dtypes")
    backends = "shmcomm,gloo" if bench.backend_available("gloo")[0] else "shmcomm"
    js = tmp_path / "d.json"
    status, out, err = run_main(capsys, "all_reduce", "-n", "2", *TINY, "--check", "--dtype",
                                "float32,fp16,bf16", "--backend", backends, "--json", str(js))
    assert status == 0, out + err
    doc = json.loads(js.read_text())
    assert doc["meta"]["dtype"] == ["float32", "float16", "bfloat16"]
    for backend in backends.split(","):
        types = {r["type"] for r in doc["rows"] if r["backend"] == backend}
        assert types == {"float32", "float16", "bfloat16"}, (backend, types)
    assert all(r["wrong"] == 0 for r in doc["rows"])
    for dtname in ("float32", "float16", "bfloat16"):
        assert f"# ===== dtype {dtname} =====" in out
    if "gloo" in backends:
        summary = out.split("# ===== per dtype, in this run =====")[1]
        assert all(f"# {d}\n" in summary for d in ("float32", "float16", "bfloat16"))
        assert summary.count("vs gloo") == 3


@pytest.mark.timeout(60)
def test_bitwise_ops_are_offered_and_checked(capsys):
    status, out, err = run_main(capsys, "all_reduce", "-n", "3", *TINY, "--check", "--dtype", "int16",
                                "--op", "bxor")
    assert status == 0, out + err
    assert "bxor" in out and "Out of bounds values : 0 OK" in out
    with pytest.raises(SystemExit):
        bench.parse_args(["all_reduce", "-n", "2", "--dtype", "float32,int8", "--op", "band"])
