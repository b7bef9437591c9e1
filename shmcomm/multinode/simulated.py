"""Simulated nodes on one machine: each a UTS, IPC and mount namespace (``unshare``) with its own
hostname and an empty tmpfs on /dev/shm, sharing the loopback network, running ``torchrun
--nnodes N --node-rank K --master-addr 127.0.0.1``. Such trees behave as separate machines to
shmcomm (and to torch): how to test a multi-node job on one machine (as root). Used by
``bench/bench_multinode.py`` and the multi-node tests.

    nodes = start_nodes("train.py", [2, 2])           # 2 nodes x 2 ranks
    for rc, out in finish(nodes, timeout=300): print(rc, out)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from shmcomm.launcher.environment import free_port_pair

# the directory holding this shmcomm package: the nodes' Python imports this very copy
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def refusal() -> str | None:
    """Why simulated nodes cannot run here (unshare refused, not root...), or None."""
    try:
        probe = subprocess.run(["unshare", "--uts", "--ipc", "--mount", "--fork", "sh", "-c",
                                "hostname probe && mount -t tmpfs tmpfs /dev/shm"],
                               capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare cannot run here: {exc}"
    return None if probe.returncode == 0 else f"unshare refused: {probe.stderr.strip()[:200]}"


def start_nodes(script: str, per_node: list[int], *args: str, env: dict | None = None,
                launcher: str = "torchrun") -> list:
    """Start one node per entry of ``per_node`` (its rank count), each running ``torchrun
    script args`` (``launcher="shmrun"``: shmrun with the same flags); each prints
    ``shm-left=N`` (files left in its /dev/shm) after its job."""
    port = free_port_pair()  # node 0's shmrun also listens on port + 1
    environ = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
                   SHMCOMM_TIMEOUT="60", **(env or {}))
    nodes = []
    for k, n in enumerate(per_node):
        module = "torch.distributed.run" if launcher == "torchrun" else "shmcomm.launch"
        torchrun = [sys.executable, "-m", module, "--nnodes", str(len(per_node)),
                    "--node-rank", str(k), "--nproc-per-node", str(n), "--master-addr", "127.0.0.1",
                    "--master-port", str(port), script, *args]
        inner = (f"hostname node{k} && mount -t tmpfs tmpfs /dev/shm && {' '.join(torchrun)}; "
                 "rc=$?; echo shm-left=$(ls -A /dev/shm | wc -l); exit $rc")
        nodes.append(subprocess.Popen(["unshare", "--uts", "--ipc", "--mount", "--fork", "sh", "-c", inner],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=environ, start_new_session=True))
    return nodes


def kill_node(p) -> None:
    """SIGKILL a node: its launcher and every process under it (torchrun starts its workers in
    sessions of their own, so the process group alone would miss them)."""
    import psutil

    try:
        tree = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in tree:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def finish(nodes: list, timeout: float) -> list[tuple[int, str]]:
    """Each node's exit code and output; TimeoutError (every node killed) past ``timeout`` s."""
    results = []
    deadline = time.monotonic() + timeout
    for p in nodes:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in nodes:
                kill_node(q)
            out, _ = p.communicate()
            raise TimeoutError(f"simulated node timed out after {timeout} s:\n{out[-3000:]}") from None
        results.append((p.returncode, out))
    return results
