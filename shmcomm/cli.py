"""``shmcomm``: maintenance commands for the shared memory shmcomm uses.

::

    shmcomm info            # version, build, SIMD, cores, limits, /dev/shm space
    shmcomm ls              # this user's segments: job, size, owner pids, alive or stale
    shmcomm clean           # remove stale segments (those no live process owns or maps)
    shmcomm clean --dry-run # only say what would be removed

Segments normally disappear as soon as every rank has attached, so ``ls`` usually prints
``no segments``; a segment outlives its job only when a rank crashed during start-up (so does a
staging name, ``<name>~<pid>-<start time>``, where ``/dev/shm`` has no ``O_TMPFILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time

import psutil

from shmcomm import __version__, capabilities, segments

__all__ = ["main", "segment_state", "segment_users", "info_lines"]

STARTUP_GRACE_S = 60.0  # a segment without header or pids is only stale once older than this
_SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16",
               "avx512_fp16", "asimd", "asimdhp", "sve", "sve2", "bf16")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable; keeps type checkers content


# -- segment liveness ------------------------------------------------------------------------

def segment_users() -> dict[str, set[int]]:
    """Which processes map or hold open each shmcomm file of ``/dev/shm``: name -> pids.

    This sees users whatever the segment header says (a newer layout, a header not yet
    written), so ``clean`` never removes a segment some process is using. Processes this user
    may not inspect, and those that exit meanwhile, are skipped. Example::

        segment_users().get("shmcomm.1000.job-42.g0", set())
    """
    marker = f"{segments.SHM_DIR}/{segments.PREFIX}."
    users: dict[str, set[int]] = {}
    for proc in psutil.process_iter():
        names = _mapped_files(proc.pid, marker)   # a rank keeps its segments mapped, fds closed
        try:
            names.update(f.path for f in proc.open_files() if f.path.startswith(marker))
        except (psutil.Error, OSError):  # gone, not ours, or an fd closed while it was read
            pass
        for path in names:
            users.setdefault(os.path.basename(path), set()).add(proc.pid)
    return users


def _mapped_files(pid: int, marker: str) -> set[str]:
    """Paths starting with ``marker`` that process ``pid`` maps (none if it cannot be read).

    Read from ``/proc/PID/maps``, not with psutil's ``memory_maps()``: that reads ``smaps``, where
    the kernel walks every page table of the process to count its memory, holding its memory
    lock (page faults of a running rank wait) and over ten times slower on a large process
    (350 ms against 28 ms for 20 000 mappings and 1.6 GB resident). Only paths are needed here.
    """
    names = set()
    try:
        with open(f"/proc/{pid}/maps", "r", errors="replace") as f:
            for line in f:
                i = line.find(marker)
                if i >= 0:
                    names.add(line[i:].split()[0])   # drops a " (deleted)" suffix
    except OSError:
        pass
    return names


def segment_state(seg: segments.SegmentInfo, users: dict[str, set[int]] | None = None,
                  now: float | None = None) -> str:
    """``"alive"``, ``"starting"``, ``"stale"`` or ``"foreign"``: only a stale segment may be
    removed.

    Foreign: a file under this user's names that is not this user's (another user planted it,
    or it is a link or has a wrong mode): never touched. Alive: an owner pid from the header still runs, or a process maps or opens the file.
    Starting: a staging name whose creator (pid and start time, from the name) still runs; or no
    header or no owner pid yet, and younger than ``STARTUP_GRACE_S`` (its creator may be between
    creating the file and writing the header). Stale: everything else. Example::

        [s.name for s in segments.list_segments() if segment_state(s) == "stale"]
    """
    if seg.untrusted is not None:
        return "foreign"
    users = segment_users() if users is None else users
    if users.get(seg.name):
        return "alive"
    if seg.creator is not None:  # a staging name says who is creating it
        return "stale" if seg.stale else "starting"
    if seg.valid and any(pid > 0 for pid in seg.pids):
        return "stale" if seg.stale else "alive"
    try:
        age = (time.time() if now is None else now) - os.stat(seg.path).st_mtime
    except OSError:
        return "stale"  # already gone
    return "starting" if age < STARTUP_GRACE_S else "stale"


# -- info ------------------------------------------------------------------------------------

def _cpu_features() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    have = set(value.split())
                    found = [flag for flag in _SIMD_FLAGS if flag in have]
                    # aarch64 calls NEON "asimd"; say NEON, which is what people look for.
                    return ["neon" if flag == "asimd" else flag for flag in found]
    except OSError:
        pass
    return []


def _kernel_level() -> str:
    """The reduction kernels' SIMD level in use, the levels this CPU runs, and why (SHMCOMM_SIMD)."""
    try:
        from shmcomm import _core
    except ImportError as exc:
        return f"unknown (the compiled core does not import: {exc})"
    levels = ", ".join(_core.simd_levels())
    try:
        _core.choose_simd_level()
    except ValueError as exc:
        return f"{_core.simd_level()}; {exc}"
    level = _core.simd_level()
    forced = os.environ.get("SHMCOMM_SIMD", "").strip()
    why = f"forced by SHMCOMM_SIMD={forced}" if forced and forced != "auto" else "the best this CPU runs"
    return f"{level} ({why}; runs: {levels})"


def _build_lines() -> list[tuple[str, str]]:
    try:
        from shmcomm import _core  # imported lazily: only `info` needs it
    except Exception as e:  # a broken build is exactly what `info` should report
        return [("core", f"not importable ({type(e).__name__}: {e})")]
    lines = [("core", getattr(_core, "__file__", "?"))]
    try:
        from shmcomm._build_info import BUILD_INFO
    except ImportError:
        return lines + [("build", "not recorded (a core built before setup.py kept its facts)")]
    return lines + [(f"build {key}", str(value)) for key, value in BUILD_INFO.items()]


def _settings_lines(nranks: int) -> list[tuple[str, str]]:
    """The tuning a group of ``nranks`` gets here, each value with where it comes from."""
    try:
        from shmcomm import _core
        settings = _core.group_settings(nranks)
    except Exception as exc:  # noqa: BLE001 - a bad SHMCOMM_* value is worth reporting, not a crash
        return [("settings", f"unavailable: {exc}")]
    lines = [("last-level cache", _human(_core._last_level_cache_bytes()))]
    for key, value in settings.items():
        var = f"SHMCOMM_{key.upper()}"
        shown = _human(value) if key.endswith("_bytes") else str(value)
        source = f"from {var}" if os.environ.get(var) else f"default; {var}"
        lines.append((f"{key} ({nranks} ranks)", f"{shown} ({source})"))
    return lines


def _numa_line() -> str:
    """How many NUMA nodes have CPUs, and whether this process is bound inside one (what decides
    whether large collectives compose inside NUMA nodes: shmcomm/hierarchy/numa.py)."""
    from shmcomm.cpus import machine_numa_nodes, rank_numa_node

    count, mine = machine_numa_nodes(), rank_numa_node()
    if count == 1:
        return "1 (collectives stay flat)"
    where = f"bound inside node {mine}" if mine >= 0 else "not bound inside one (collectives stay flat)"
    return f"{count}; this process {where}"


def _threads_line(usable: int) -> str:
    """Threads a rank splits a large synchronous all_reduce over here (shmcomm/hierarchy/threads.py):
    the setting, or each unbound rank's share of the usable cores at 2, 4 and 8 ranks."""
    from shmcomm.hierarchy.threads import DEFAULT_MAX_THREADS
    from shmcomm.settings import find, read_int

    asked = read_int(find("SHMCOMM_RANK_THREADS"), 0)
    if asked == 1:
        return "1 (SHMCOMM_RANK_THREADS=1: large all_reduces stay on one thread)"
    if asked > 1:
        return f"{asked} (SHMCOMM_RANK_THREADS) for all_reduce from SHMCOMM_THREADS_BYTES"
    shares = ", ".join(f"{max(1, min(DEFAULT_MAX_THREADS, usable // n))} at {n} ranks" for n in (2, 4, 8))
    return f"{shares} (unbound ranks' share of the cores; 1: large all_reduces stay on one thread)"


def _limit(which: int, size: bool = False) -> str:
    def fmt(v: int) -> str:
        if v == resource.RLIM_INFINITY:
            return "unlimited"
        return _human(v) if size else str(v)
    soft, hard = resource.getrlimit(which)
    return f"{fmt(soft)} (hard {fmt(hard)})"


def info_lines() -> list[tuple[str, str]]:
    """The ``shmcomm info`` report as (key, value) pairs.

    Example::

        dict(info_lines())["version"]  # '0.1.0'
    """
    lines = [("version", __version__),
             ("torch backend", capabilities.torch_backend()),
             ("bench peers", capabilities.bench_peers()),
             ("single copy", capabilities.single_copy()),
             ("python", f"{platform.python_version()} ({sys.executable})"),
             ("platform", f"{platform.system()} {platform.release()} {platform.machine()}")]
    lines += _build_lines()
    lines.append(("simd", " ".join(_cpu_features()) or "none detected"))
    lines.append(("kernels", _kernel_level()))
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    lines.append(("cores", f"{usable} usable of {os.cpu_count()}"))
    lines.append(("NUMA nodes", _numa_line()))
    lines.append(("threads a rank", _threads_line(usable)))
    lines.append(("open files", _limit(resource.RLIMIT_NOFILE)))
    lines.append(("locked memory", _limit(resource.RLIMIT_MEMLOCK, size=True)))
    lines.append(("processes", _limit(resource.RLIMIT_NPROC)))
    try:
        st = os.statvfs(segments.SHM_DIR)
        space = f"{_human(st.f_bavail * st.f_frsize)} free of {_human(st.f_blocks * st.f_frsize)}"
        lines.append((segments.SHM_DIR, space))
    except OSError as e:
        lines.append((segments.SHM_DIR, f"unavailable ({e.strerror})"))
    lines += _settings_lines(usable)
    segs = segments.list_segments()
    if segs:
        users = segment_users()
        stale = sum(segment_state(s, users) == "stale" for s in segs)
        lines.append(("segments", f"{len(segs)} ({stale} stale; see `shmcomm ls`)"))
    else:
        lines.append(("segments", "none"))
    return lines


def _cmd_info(args: argparse.Namespace) -> int:
    from shmcomm.settings import in_effect

    lines, table = info_lines(), in_effect()
    if args.json:
        print(json.dumps({**dict(lines), "settings": table}, indent=1))
        return 0
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key + ':':<{width + 1}} {value}")
    changed = [row["var"] for row in table if row["value"] is not None]
    if not args.settings:
        print(f"\nsettings: {len(table)} SHMCOMM_* variables, {len(changed)} set here"
              + (f" ({', '.join(changed)})" if changed else "") + "; the table: shmcomm info --settings")
        return 0
    print("\nsettings (every SHMCOMM_* variable shmcomm reads; * = set here):")
    width = max(len(str(row["var"])) for row in table)
    for row in table:
        mark = "*" if row["value"] is not None else " "
        value = f"{row['value']} (default {row['default']})" if mark == "*" else str(row["default"])
        bounds = "".join(f"; {word} {row[key]}" for word, key in (("at least", "floor"),
                                                                    ("at most", "ceiling"))
                         if row[key] is not None)
        print(f"{mark} {str(row['var']):<{width}}  {row['scope']:<9} {value}{bounds}: {row['why']}")
    return 0


# -- ls / clean ------------------------------------------------------------------------------

def _cmd_ls(args: argparse.Namespace) -> int:
    segs = segments.list_segments(job=args.job)
    if not segs:
        print("no segments")
        return 0
    users = segment_users()
    rows = [("NAME", "JOB", "SIZE", "PIDS", "STATE")]
    for s in segs:
        pids = ",".join(str(p) for p in s.pids if p > 0) or (str(s.creator[0]) if s.creator else "-")
        rows.append((s.name, s.job or "?", _human(s.size), pids, segment_state(s, users)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    for s in segs:
        if s.untrusted is not None:
            print(f"shmcomm: {s.name} is not yours: {s.untrusted}; shmcomm never uses or removes "
                  f"it (ask its owner or root to)", file=sys.stderr)
    return 0


def _cmd_clean(args: argparse.Namespace) -> int:
    users = segment_users()
    removed, freed, errors = 0, 0, 0
    for s in segments.list_segments(job=args.job):
        if segment_state(s, users) != "stale":
            continue
        # Read again just before unlinking: a job may have started under this name meanwhile.
        fresh = segments.describe(s.path)
        if segment_state(fresh, segment_users()) != "stale":
            continue
        what = f"{s.name} (job {s.job or '?'}, {_human(s.size)})"
        if args.dry_run:
            print(f"would remove {what}")
        else:
            try:
                os.unlink(s.path)
            except FileNotFoundError:
                continue
            except OSError as e:
                print(f"shmcomm: cannot remove {s.name}: {e.strerror}", file=sys.stderr)
                errors += 1
                continue
            print(f"removed {what}")
        removed += 1
        freed += s.size
    if not removed:
        print("no stale segments")
    elif args.dry_run:
        print(f"{removed} stale segment(s), {_human(freed)}, would be removed")
    else:
        print(f"removed {removed} stale segment(s), freed {_human(freed)}")
    return 1 if errors else 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shmcomm", description="shmcomm maintenance commands.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("info", help="version, build facts, kernel level, settings in effect, cores, "
                                    "limits, /dev/shm space")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object "
                                                        "(the settings table included)")
    p.add_argument("--settings", action="store_true",
                   help="also print the table of every SHMCOMM_* variable: scope, default, bounds")
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("ls", help="list this user's shared-memory segments")
    p.add_argument("--job", help="only the segments of this job")
    p.set_defaults(func=_cmd_ls)
    p = sub.add_parser("clean", help="remove stale segments (never one a live process uses)")
    p.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    p.add_argument("--job", help="only the segments of this job")
    p.set_defaults(func=_cmd_clean)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``shmcomm`` console script; returns the exit code.

    Example::

        main(["clean", "--dry-run"])
    """
    args = _build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `shmcomm info | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
