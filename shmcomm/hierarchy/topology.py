"""Who runs where: each rank's host identity, the nodes and rails they form, and whether the
launch environment spans several nodes (or simulates them with ``SHMCOMM_SIMULATE_NODES``).

Example::

    >>> t = Topology(["a", "b", "a", "b"])
    >>> t.nodes, t.local_of, t.rails
    ([[0, 2], [1, 3]], [0, 0, 1, 1], [[0, 1], [2, 3]])
"""

from __future__ import annotations

import os
import socket

from shmcomm.settings import find, read_int

__all__ = ["Topology", "host_identity", "simulated_nodes", "spans_nodes"]


def simulated_nodes() -> int:
    """``SHMCOMM_SIMULATE_NODES`` (testing and benchmarking): the number of blocks of
    consecutive ranks that act as separate nodes on this machine; 1 when unset.

    Example::

        os.environ["SHMCOMM_SIMULATE_NODES"] = "2"; simulated_nodes()   # 2
    """
    return read_int(find("SHMCOMM_SIMULATE_NODES"), 1)


def spans_nodes(world_size: int) -> bool:
    """True under a launch on several nodes (torchrun, ``shmrun --nnodes``): ``LOCAL_WORLD_SIZE``
    says fewer ranks run here than ``world_size``; or with ``SHMCOMM_SIMULATE_NODES`` above 1
    (blocks of ranks acting as nodes on this machine, for tests and benchmarks).

    Example::

        spans_nodes(4)   # True under torchrun --nnodes 2 --nproc-per-node 2
    """
    if world_size > 1 and os.environ.get("SHMCOMM_SIMULATE_NODES", "").strip() not in ("", "1"):
        return True
    local = os.environ.get("LOCAL_WORLD_SIZE")
    try:
        return local is not None and int(local) != world_size
    except ValueError:
        raise ValueError(f"LOCAL_WORLD_SIZE must be an integer, got {local!r}") from None


def host_identity(rank: int | None = None, size: int | None = None) -> str:
    """Host name, boot id and the /dev/shm mount: ranks sharing all three see one another's
    segments (containers on one kernel with private /dev/shm mounts differ in the last). Under
    ``SHMCOMM_SIMULATE_NODES=K``, rank ``rank`` of ``size`` also names its block of consecutive
    ranks, so that the blocks act as K nodes.

    Example::

        print(host_identity())   # "node-a (boot id 5f..., /dev/shm 25:1)"
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        st = os.stat("/dev/shm")
        shm = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        shm = "?"
    k = simulated_nodes()
    block = f" [simulated node {rank * k // size} of {k}]" if k > 1 and rank is not None and size else ""
    return f"{socket.gethostname()}{block} (boot id {boot}, /dev/shm {shm})"


class Topology:
    """Which node each rank of a group runs on: nodes in order of their lowest rank, and each
    node's ranks in rank order (a rank's *local index* is its place there).

    ``rails[l]`` is the rank of local index ``l`` on every node, in node order (so a rank's
    place on its rail is its node's index); None when nodes hold different numbers of ranks.
    ``first_of[n]`` is node n's lowest rank when its ranks are consecutive (as torchrun and
    shmrun number them), else None: the node's pieces of a rank-ordered buffer are then one slice.

    Example::

        >>> t = Topology(["a", "a", "b", "b"])
        >>> t.nodes, t.first_of, t.consecutive, t.even
        ([[0, 1], [2, 3]], [0, 2], True, True)
    """

    def __init__(self, hosts: list[str]):
        names = list(dict.fromkeys(hosts))
        self.hosts = list(hosts)
        self.nodes = [[r for r, h in enumerate(hosts) if h == name] for name in names]
        self.node_of = [names.index(h) for h in hosts]
        self.local_of = [self.nodes[k].index(r) for r, k in enumerate(self.node_of)]
        self.even = len({len(node) for node in self.nodes}) == 1
        self.rails = ([[node[l] for node in self.nodes] for l in range(len(self.nodes[0]))]
                      if self.even else None)
        self.first_of = [node[0] if node == list(range(node[0], node[0] + len(node))) else None
                         for node in self.nodes]
        # every node's ranks consecutive: the nodes' blocks of a rank-ordered buffer lie in node
        # order, which is rail order, so a rail can gather or reduce-scatter whole blocks
        self.consecutive = None not in self.first_of

    def describe(self) -> str:
        """One line: the nodes and their ranks.

        Example::

            >>> Topology(["a (boot id 1)", "b (boot id 2)"]).describe()
            'a: ranks [0]; b: ranks [1]'
        """
        return "; ".join(f"{self.hosts[node[0]].split(' ')[0]}: ranks {node}" for node in self.nodes)
