"""The machine's CPU topology, read from sysfs, for the launcher and the composition levels alike:
which cores this process may use, how they group into NUMA nodes, sockets or single cores
(``shmrun --bind-to``), how many NUMA nodes the machine has and which one this rank is bound to
(``shmcomm.hierarchy.numa``).

    usable_cores()                       # [0, 1]
    cpu_domains("numa")                  # [(0, [0, 1])]: one NUMA node with both cores
    machine_numa_nodes(), rank_numa_node()   # 1, 0 on a small VM
"""

from __future__ import annotations

import functools
import glob
import os
import re

__all__ = ["usable_cores", "cpu_domains", "parse_cpulist", "format_cpulist", "machine_numa_nodes",
           "rank_numa_node"]

# where the topology is read (tests point it at a made-up tree)
SYSFS = "/sys"


def usable_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity mask). Example::

        len(usable_cores())     # 2 on a 2-core machine
    """
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8`` (the kernel's cpulist format) -> [0, 1, 2, 3, 8]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpulist(cpus) -> str:
    """[0, 1, 2, 3, 8] -> ``0-3,8``."""
    out, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def cpu_domains(kind: str, usable: list[int] | None = None, root: str = SYSFS) -> list[tuple[int, list[int]]]:
    """The usable cores grouped for ``--bind-to kind``: ``(id, cores)`` per NUMA node (``numa``,
    from ``node*/cpulist``), per socket (``socket``, from each core's ``physical_package_id``) or
    per core (``core``), in id order, leaving out groups with no usable core. Without that
    information in sysfs, every usable core is one group (id 0). Example::

        cpu_domains("numa")     # [(0, [0, 1])] on a machine with one NUMA node and 2 cores
    """
    usable = usable_cores() if usable is None else sorted(usable)
    allowed = set(usable)
    if kind == "core":
        return [(c, [c]) for c in usable]
    groups: dict[int, list[int]] = {}
    if kind == "numa":
        for path in glob.glob(os.path.join(root, "devices/system/node/node*/cpulist")):
            m = re.search(r"node(\d+)/cpulist$", path)
            try:
                with open(path) as f:
                    cpus = parse_cpulist(f.read())
            except (OSError, ValueError):
                continue
            if m:
                groups[int(m.group(1))] = [c for c in cpus if c in allowed]
    elif kind == "socket":
        for c in usable:
            try:
                with open(os.path.join(root, f"devices/system/cpu/cpu{c}/topology/physical_package_id")) as f:
                    package = int(f.read().strip())
            except (OSError, ValueError):
                package = 0
            groups.setdefault(package, []).append(c)
    else:
        raise ValueError(f"unknown binding {kind!r}: expected core, numa or socket")
    domains = [(i, sorted(cpus)) for i, cpus in sorted(groups.items()) if cpus]
    return domains or [(0, usable)]


@functools.lru_cache(maxsize=None)
def machine_numa_nodes(sysfs: str = SYSFS) -> int:
    """How many NUMA nodes of this machine have CPUs (1 without that information in sysfs).

    Example::

        machine_numa_nodes()   # 1 on most laptops and small VMs, 2 on a two-socket server
    """
    return len(cpu_domains("numa", usable=list(range(os.cpu_count() or 1)), root=sysfs))


def rank_numa_node(sysfs: str = SYSFS) -> int:
    """The NUMA node this thread may run on, if its CPU affinity lies inside one; else -1
    (unbound: the scheduler may move it, and its memory, to any node).

    Example::

        rank_numa_node()   # 1 under shmrun --bind-to numa on rank 1 of a two-socket server
    """
    domains = cpu_domains("numa", root=sysfs)
    return domains[0][0] if len(domains) == 1 else -1
