"""Failure news between the ``shmrun`` of each node of one job (``shmrun --nnodes M``).

Each node's launcher supervises only its own ranks. So that a failure on one node stops the job
on every node (as torchrun's agents do through their rendezvous), node 0's launcher listens on
``--master-port`` + 1 and the others connect to it. Messages are JSON lines:

- ``{"kind": "fail", "node": K, "code": C, "text": ...}``: node K's job failed (its first failed
  rank exited with C); node 0 passes it on to every other node;
- ``{"kind": "done", "node": K}``: node K's ranks all ended well;
- ``{"kind": "bye"}``: node 0 is leaving after every node said ``done``.

A connection that closes without ``done`` (or ``bye``) counts as that node failing: its
launcher was killed, or its machine went away. The link is a thread per peer; news reaches the
supervisor through ``news`` and a call of ``wake`` (which writes to its wake-up pipe)::

    link = NodeLink(nnodes=2, node_rank=1, addr="10.0.0.1", port=29501, wake=lambda: None)
    link.start()
    ...
    if link.news: print(link.news[0].text)     # "node 0 failed: rank 0 ... exit code 3"
    link.finish(ok=True)                      # say "done" (node 0: wait for the others' "done")
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass

__all__ = ["NodeLink", "Failure"]

CONNECT_RETRY_S = 0.5
LINGER_S = 30.0  # how long node 0 waits at the end for a node that never connected


@dataclass
class Failure:
    """A failure on another node: which node, the exit code to report, a one-line account."""
    node: int
    code: int
    text: str


class NodeLink:
    """One node's end of the job's failure link (node 0 serves it, the others connect)."""

    def __init__(self, nnodes: int, node_rank: int, addr: str, port: int, wake) -> None:
        self.nnodes, self.node_rank, self.addr, self.port = nnodes, node_rank, addr, port
        self._wake = wake
        self.news: list[Failure] = []
        self._lock = threading.Lock()
        self._peers: dict[int, socket.socket] = {}  # node 0: connected nodes; others: {0: node 0}
        self._done: set[int] = set()
        self._closing = threading.Event()
        self._changed = threading.Condition(self._lock)
        self._server: socket.socket | None = None
        self._own_failure: dict | None = None  # sent to a node that connects after it

    # -- set-up --------------------------------------------------------------------------------
    def start(self) -> None:
        """Node 0: listen (a clear OSError if the port is taken); the others: connect in the
        background, retrying until node 0 answers."""
        if self.node_rank == 0:
            try:
                srv = socket.create_server(("", self.port))
            except OSError as e:
                raise OSError(e.errno, f"cannot listen on port {self.port} (--master-port + 1), where "
                              f"the other nodes' shmrun reach node 0's: {e.strerror}") from None
            srv.settimeout(0.5)
            self._server = srv
            threading.Thread(target=self._accept, name="shmrun-link-accept", daemon=True).start()
        else:
            threading.Thread(target=self._connect, name="shmrun-link-connect", daemon=True).start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _connect(self) -> None:
        while not self._closing.is_set():
            try:
                conn = socket.create_connection((self.addr, self.port), timeout=5.0)
            except OSError:
                time.sleep(CONNECT_RETRY_S)
                continue
            conn.settimeout(None)
            with self._lock:
                self._peers[0] = conn
                late = self._own_failure
            self._send(conn, {"kind": "hello", "node": self.node_rank})
            if late is not None:
                self._send(conn, late)
            self._serve(conn, peer=0)
            return

    # -- traffic -------------------------------------------------------------------------------
    def _serve(self, conn: socket.socket, peer: int | None = None) -> None:
        """Read one peer's messages until its connection closes."""
        said_goodbye = False
        with conn.makefile("r", encoding="utf-8") as lines:
            try:
                for line in lines:
                    msg = json.loads(line)
                    kind = msg.get("kind")
                    if kind == "hello":
                        peer = int(msg["node"])
                        with self._lock:
                            self._peers[peer] = conn
                            self._changed.notify_all()
                            late = self._own_failure or (self._relayed(self.news[0])
                                                          if self.news else None)
                        if late is not None:  # it connected after the job failed
                            self._send(conn, late)
                    elif kind == "fail":
                        self._failed(Failure(int(msg["node"]), int(msg["code"]), str(msg["text"])))
                    elif kind in ("done", "bye"):
                        said_goodbye = True
                        with self._lock:
                            self._done.add(peer if kind == "done" else 0)
                            self._changed.notify_all()
            except (OSError, ValueError):
                pass
        if not said_goodbye and peer is not None and not self._closing.is_set():
            who = f"node {peer}'s shmrun" if peer else "node 0's shmrun"
            self._failed(Failure(peer, 1, f"lost contact with {who} (killed, or its machine is gone)"))
        with self._lock:
            self._changed.notify_all()

    def _failed(self, failure: Failure) -> None:
        with self._lock:
            first = not self.news
            self.news.append(failure)
            peers = dict(self._peers)
            self._changed.notify_all()
        if self.node_rank == 0 and first:  # pass it on to every node but the one it came from
            for node, conn in peers.items():
                if node != failure.node:
                    self._send(conn, self._relayed(failure))
        self._wake()

    @staticmethod
    def _relayed(failure: Failure) -> dict:
        return {"kind": "fail", "node": failure.node, "code": failure.code, "text": failure.text}

    @staticmethod
    def _send(conn: socket.socket, msg: dict) -> None:
        try:
            conn.sendall((json.dumps(msg) + "\n").encode())
        except OSError:
            pass  # that peer is gone; its reader reports it

    # -- this node's news ----------------------------------------------------------------------
    def report_failure(self, code: int, text: str) -> None:
        """This node's job failed: tell node 0 (node 0: tell every node)."""
        msg = {"kind": "fail", "node": self.node_rank, "code": code, "text": text}
        with self._lock:
            self._own_failure = msg
            peers = list(self._peers.values())
        for conn in peers:
            self._send(conn, msg)

    def finish(self, ok: bool) -> None:
        """Leave the link. A well-ended node says ``done``; node 0 first waits until every
        other node said ``done`` or failed (it relays their news till then)."""
        if self.node_rank == 0 and ok:
            deadline = time.monotonic() + LINGER_S
            with self._lock:
                while True:
                    waiting = [k for k in range(1, self.nnodes) if k not in self._done
                               and not any(f.node == k for f in self.news)]
                    unconnected = [k for k in waiting if k not in self._peers]
                    if not waiting or (unconnected == waiting and time.monotonic() > deadline):
                        break
                    self._changed.wait(0.5)
            with self._lock:
                peers = list(self._peers.values())
            for conn in peers:
                self._send(conn, {"kind": "bye"})
        elif ok:
            with self._lock:
                peers = list(self._peers.values())
            if not peers:  # ended before the connection was made: one direct try
                try:
                    conn = socket.create_connection((self.addr, self.port), timeout=2.0)
                    self._send(conn, {"kind": "hello", "node": self.node_rank})
                    peers = [conn]
                    with self._lock:
                        self._peers[0] = conn  # closed by close() below
                except OSError:
                    pass
            for conn in peers:
                self._send(conn, {"kind": "done", "node": self.node_rank})
        self.close()

    def close(self) -> None:
        """Stop the threads and close every connection (idempotent)."""
        self._closing.set()
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for conn in peers:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        if self._server is not None:
            self._server.close()
            self._server = None
