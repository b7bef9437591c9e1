"""Failure news between the ``shmrun`` of each node of one job (``shmrun --nnodes M``).

Each node's launcher supervises only its own ranks. So that a failure on one node stops the job
on every node (as torchrun's agents do through their rendezvous), node 0's launcher listens on
``--master-port`` + 1 at ``--master-addr`` and the others connect to it.

Only the job's own launchers are believed. A connection from this machine must come from a
process of this user (its socket's owner, from ``/proc/net/tcp``). Then both ends prove that they
hold the job's key (an HMAC over two fresh nonces; the key never travels): node 0 sends
``{"kind": "challenge", "nonce": N0}``, the node answers ``{"kind": "hello", "node": K, "nonce":
N1, "proof": ...}`` and node 0 ``{"kind": "welcome", "proof": ...}``. The key comes from
``SHMCOMM_SECRET`` when the user set one, the same on every node; else from what every node's
command line shares (``-n``, ``--nnodes``, ``--master-port``), which keeps out strays and other
users of this machine but not a remote host that knows the job's flags. A connection that fails
any of this is closed and ignored (the first one is reported), never taken as news.
After the handshake, messages are JSON lines:

- ``{"kind": "fail", "node": K, "code": C, "text": ...}``: node K's job failed (its first failed
  rank exited with C); node 0 passes it on to every other node;
- ``{"kind": "done", "node": K}``: node K's ranks all ended well;
- ``{"kind": "bye"}``: node 0 is leaving after every node said ``done``.

A connection that closes without ``done`` (or ``bye``) counts as that node failing: its
launcher was killed, or its machine went away. The link is a thread per peer; news reaches the
supervisor through ``news`` and a call of ``wake`` (which writes to its wake-up pipe)::

    key = link_key(None, nnodes=2, nproc=4, port=29500)
    link = NodeLink(nnodes=2, node_rank=1, addr="10.0.0.1", port=29501, wake=lambda: None, key=key)
    link.start()
    ...
    if link.news: print(link.news[0].text)     # "node 0 failed: rank 0 ... exit code 3"
    for line in link.take_notices(): print(line)
    link.finish(ok=True)                      # say "done" (node 0: wait for the others' "done")
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass

__all__ = ["NodeLink", "Failure", "link_key"]

CONNECT_RETRY_S = 0.5
LINGER_S = 30.0  # how long node 0 waits at the end for a node that never connected
HANDSHAKE_S = 5.0  # a peer that has not proved itself by then is dropped
_MAX_HANDSHAKE_LINE = 4096  # a stranger cannot make us buffer more than this


def link_key(secret: str | None, nnodes: int, nproc: int, port: int) -> bytes:
    """The key the node launchers of one job prove themselves with: from ``secret`` (the
    ``SHMCOMM_SECRET`` the user gave every node) when given, else from the flags every node has.

    Example::

        link_key("s3cret", 2, 4, 29500) != link_key(None, 2, 4, 29500)   # True
    """
    material = f"secret\0{secret}" if secret else f"flags\0{nnodes}\0{nproc}\0{port}"
    return hashlib.sha256(b"shmcomm-node-link\0" + material.encode()).digest()


@dataclass
class Failure:
    """A failure on another node: which node, the exit code to report, a one-line account."""
    node: int
    code: int
    text: str


class _Stranger(Exception):
    """A connection that did not prove it is one of this job's launchers; the text says why."""


class NodeLink:
    """One node's end of the job's failure link (node 0 serves it, the others connect)."""

    def __init__(self, nnodes: int, node_rank: int, addr: str, port: int, wake, key: bytes) -> None:
        self.nnodes, self.node_rank, self.addr, self.port = nnodes, node_rank, addr, port
        self._wake = wake
        self._key = key
        self.news: list[Failure] = []
        self._notices: list[str] = []  # for the supervisor to show (see take_notices)
        self._noticed: set[str] = set()
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
            srv = self._listen()
            srv.settimeout(0.5)
            self._server = srv
            threading.Thread(target=self._accept, name="shmrun-link-accept", daemon=True).start()
        else:
            threading.Thread(target=self._connect, name="shmrun-link-connect", daemon=True).start()

    def _listen(self) -> socket.socket:
        """A server socket at ``--master-addr`` (the address the other nodes dial), not on every
        interface; on every one only where that address is not this machine's (behind NAT)."""
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(self.addr, self.port,
                                                           type=socket.SOCK_STREAM)[0]
            try:
                return socket.create_server(sockaddr[:2], family=family)
            except OSError as e:
                if e.errno != errno.EADDRNOTAVAIL:
                    raise
            self._notice(f"--master-addr {self.addr} is not an address of this machine: node 0's "
                         f"launcher listens on port {self.port} of every interface")
            return socket.create_server(("", self.port))
        except OSError as e:
            raise OSError(e.errno, f"cannot listen on {self.addr} port {self.port} (--master-port + "
                          f"1), where the other nodes' shmrun reach node 0's: {e.strerror}") from None

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, addr = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._welcome, args=(conn, addr), daemon=True).start()

    def _welcome(self, conn: socket.socket, addr) -> None:
        """Node 0: serve a node that proves it is one of this job's launchers; drop the rest."""
        lines = conn.makefile("r", encoding="utf-8")
        try:
            peer = self._admit(conn, lines)
        except _Stranger as e:
            self._notice(f"ignored a connection to the node link from {addr[0]} port {addr[1]}: "
                         f"{e}. Further ones are ignored silently", once="stranger")
            lines.close()
            conn.close()
            return
        with self._lock:
            self._peers[peer] = conn
            self._changed.notify_all()
            late = self._own_failure or (self._relayed(self.news[0]) if self.news else None)
        if late is not None:  # it connected after the job failed
            self._send(conn, late)
        self._serve(conn, lines, peer)

    def _admit(self, conn: socket.socket, lines) -> int:
        """Node 0's side of the handshake: the node rank of a launcher of this job, else raises
        ``_Stranger``."""
        owner = _local_owner(conn)
        if owner is not None and owner != os.geteuid():
            raise _Stranger(f"it comes from a process of uid {owner}" if owner >= 0 else
                            "it comes from this machine, by a socket /proc/net/tcp does not show")
        conn.settimeout(HANDSHAKE_S)
        nonce = secrets.token_hex(16)
        self._send(conn, {"kind": "challenge", "nonce": nonce})
        hello = _read_handshake(lines)
        node, theirs = hello.get("node"), hello.get("nonce")
        if hello.get("kind") != "hello" or type(node) is not int or not 0 < node < self.nnodes \
                or not isinstance(theirs, str):
            raise _Stranger("it did not introduce itself as another node's shmrun")
        if not self._proves(hello.get("proof"), "hello", node, nonce, theirs):
            raise _Stranger("it does not hold this job's key (a different SHMCOMM_SECRET, -n, "
                            "--nnodes or --master-port, or not a launcher of this job)")
        self._send(conn, {"kind": "welcome", "proof": self._proof("welcome", node, theirs, nonce)})
        conn.settimeout(None)
        return node

    def _dial(self, timeout: float):
        """Another node: connect to node 0 and prove the job's key to each other; the connection
        and its lines, or None (node 0 not there yet, or refusing us)."""
        try:
            conn = socket.create_connection((self.addr, self.port), timeout=timeout)
        except OSError:
            return None
        lines = conn.makefile("r", encoding="utf-8")
        try:
            conn.settimeout(HANDSHAKE_S)
            theirs = _read_handshake(lines).get("nonce")
            if not isinstance(theirs, str):
                raise _Stranger("it sent no challenge")
            nonce = secrets.token_hex(16)
            self._send(conn, {"kind": "hello", "node": self.node_rank, "nonce": nonce,
                              "proof": self._proof("hello", self.node_rank, theirs, nonce)})
            if not self._proves(_read_handshake(lines).get("proof"), "welcome", self.node_rank,
                                nonce, theirs):
                raise _Stranger("it does not hold this job's key")
        except _Stranger as e:
            self._notice(f"node 0's shmrun at {self.addr} port {self.port} and this one do not "
                         f"accept each other ({e}); is SHMCOMM_SECRET, -n, --nnodes and "
                         f"--master-port the same on every node? Still trying", once="refused")
            lines.close()
            conn.close()
            return None
        conn.settimeout(None)
        return conn, lines

    def _proof(self, step: str, node: int, first: str, second: str) -> str:
        data = f"{step}\0{node}\0{first}\0{second}".encode()
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def _proves(self, proof, step: str, node: int, first: str, second: str) -> bool:
        return isinstance(proof, str) and hmac.compare_digest(
            proof, self._proof(step, node, first, second))

    def _connect(self) -> None:
        while not self._closing.is_set():
            dialled = self._dial(5.0)
            if dialled is None:
                time.sleep(CONNECT_RETRY_S)
                continue
            conn, lines = dialled
            with self._lock:
                self._peers[0] = conn
                late = self._own_failure
            if late is not None:
                self._send(conn, late)
            self._serve(conn, lines, peer=0)
            return

    # -- traffic -------------------------------------------------------------------------------
    def _serve(self, conn: socket.socket, lines, peer: int) -> None:
        """Read an admitted peer's messages until its connection closes."""
        said_goodbye = False
        with lines:
            try:
                for line in lines:
                    msg = json.loads(line)
                    kind = msg.get("kind")
                    if kind == "fail":
                        self._failed(Failure(int(msg["node"]), int(msg["code"]), str(msg["text"])))
                    elif kind in ("done", "bye"):
                        said_goodbye = True
                        with self._lock:
                            self._done.add(peer)
                            self._changed.notify_all()
            except (OSError, ValueError, AttributeError, KeyError):
                pass
        if not said_goodbye and not self._closing.is_set():
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

    def _notice(self, text: str, once: str | None = None) -> None:
        with self._lock:
            if once is not None:
                if once in self._noticed:
                    return
                self._noticed.add(once)
            self._notices.append(text)
        self._wake()

    def take_notices(self) -> list[str]:
        """What the link has to tell the user since the last call (refused connections), for the
        supervisor to show on its console from its own thread."""
        with self._lock:
            notices, self._notices = self._notices, []
        return notices

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
        """Leave the link. A well-ended node says ``done``, a failed one has said ``fail``
        (``report_failure``); node 0 first waits until every other node said ``done`` or
        failed (it relays their news till then)."""
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
        elif self.node_rank != 0:
            with self._lock:
                peers = list(self._peers.values())
            # a failure went to node 0 when reported, or on connecting (report_failure, _connect)
            news = [{"kind": "done", "node": self.node_rank}] if ok else []
            if not peers:  # ended before the connection was made: one direct try
                dialled = self._dial(2.0)
                if dialled is not None:
                    conn, lines = dialled
                    lines.close()  # nothing more to read; the socket stays open
                    peers = [conn]
                    with self._lock:
                        self._peers[0] = conn  # closed by close() below
                        if self._own_failure is not None:
                            news.append(self._own_failure)
            for conn in peers:
                for msg in news:
                    self._send(conn, msg)
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


def _read_handshake(lines) -> dict:
    """One JSON object of a handshake, of bounded size; raises ``_Stranger`` for anything else."""
    try:
        msg = json.loads(lines.readline(_MAX_HANDSHAKE_LINE))
    except (OSError, ValueError) as e:  # a timeout, a closed connection, not JSON
        raise _Stranger(f"no handshake ({e or type(e).__name__})") from None
    if not isinstance(msg, dict):
        raise _Stranger("no handshake")
    return msg


def _ip(packed_or_text) -> bytes:
    """An IP address as bytes, an IPv4-mapped IPv6 address as its IPv4 one."""
    if isinstance(packed_or_text, str):
        packed_or_text = packed_or_text.split("%")[0]  # an IPv6 scope
    ip = ipaddress.ip_address(packed_or_text)
    return (getattr(ip, "ipv4_mapped", None) or ip).packed


def _endpoint(hexed: str) -> tuple[bytes, int]:
    """``ADDR:PORT`` of /proc/net/tcp*: the address as 32-bit words in host order, the port in hex."""
    addr, port = hexed.split(":")
    raw = b"".join(struct.pack("=I", int(addr[i:i + 8], 16)) for i in range(0, len(addr), 8))
    return _ip(raw), int(port, 16)


def _is_local(ip: bytes) -> bool:
    """Whether ``ip`` is an address of this machine (one a socket here can bind)."""
    family = socket.AF_INET if len(ip) == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((socket.inet_ntop(family, ip), 0))
        except OSError:
            return False
    return True


def _local_owner(conn: socket.socket) -> int | None:
    """The uid owning the other end of ``conn`` when that end is on this machine (-1 when it
    should be in /proc/net/tcp* but is not); None when it is on another machine, or where
    /proc cannot tell. A TCP socket has no SO_PEERCRED; its owner is in those tables."""
    (peer_ip, peer_port), (my_ip, my_port) = conn.getpeername()[:2], conn.getsockname()[:2]
    want = ((_ip(peer_ip), peer_port), (_ip(my_ip), my_port))
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.readlines()[1:]
        except OSError:
            continue
        readable = True
        for row in rows:
            fields = row.split()
            if (_endpoint(fields[1]), _endpoint(fields[2])) == want:  # its local end is our peer
                return int(fields[7])
    return -1 if readable and _is_local(want[0][0]) else None
