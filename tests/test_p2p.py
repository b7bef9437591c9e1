"""Point-to-point: tags, any source, large messages through the ring, ordering, errors."""

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks


def _ping_pong(rank, size):
    peer = 1 - rank
    for n in [0, 1, 17, 100_000, 1_000_003]:  # up to ~8 MB: many trips through a 256 KiB ring
        data = np.arange(n, dtype=np.float64) * (rank + 1)
        if rank == 0:
            sc.send(data, dst=peer, tag=n)
            back = np.empty(n)
            assert sc.recv(back, src=peer, tag=n) == peer
            assert np.array_equal(back, np.arange(n, dtype=np.float64) * 2)
        else:
            got = np.empty(n)
            assert sc.recv(got, src=peer, tag=n) == peer
            assert np.array_equal(got, np.arange(n, dtype=np.float64))
            sc.send(data, dst=peer, tag=n)
    return True


@pytest.mark.timeout(60)
def test_send_recv_sizes_through_the_ring():
    assert all(run_ranks(_ping_pong, 2))


def _tags_and_any_source(rank, size):
    if rank != 0:
        # two messages with different tags; rank 0 receives them in the opposite order
        sc.send(np.array([rank, 1]), dst=0, tag=1)
        sc.send(np.array([rank, 2]), dst=0, tag=2)
        return None
    got = {}
    for _ in range(size - 1):
        buf = np.empty(2, np.int64)
        src = sc.recv(buf, src=None, tag=2)
        assert buf[0] == src and buf[1] == 2
        got[src] = True
    for src in range(1, size):
        buf = np.empty(2, np.int64)
        assert sc.recv(buf, src=src, tag=1) == src
        assert list(buf) == [src, 1]
    return sorted(got)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 4])
def test_tags_match_out_of_order_and_any_source(world):
    assert run_ranks(_tags_and_any_source, world)[0] == list(range(1, world))


def _nonblocking_exchange(rank, size):
    """Every rank isends a large message to every other before receiving: no deadlock."""
    n = 300_000  # larger than a ring
    sends = [sc.isend(np.full(n, rank * 10 + q, np.int32), dst=q, tag=5) for q in range(size) if q != rank]
    bufs = {q: np.empty(n, np.int32) for q in range(size) if q != rank}
    recvs = [sc.irecv(bufs[q], src=q, tag=5) for q in bufs]
    for w in sends + recvs:
        w.wait(timeout=30)
    for q, buf in bufs.items():
        assert (buf == q * 10 + rank).all()
    assert sorted(w.source_rank() for w in recvs) == sorted(bufs)
    # messages with the same tag arrive in order
    if rank == 0:
        for i in range(50):
            sc.send(np.array([i]), dst=1, tag=9)
    elif rank == 1:
        for i in range(50):
            b = np.empty(1, np.int64)
            sc.recv(b, src=0, tag=9)
            assert b[0] == i
    # a rank may send to itself
    w = sc.isend(np.array([42.0]), dst=rank, tag=3)
    b = np.empty(1)
    assert sc.recv(b, src=rank, tag=3) == rank and b[0] == 42.0
    w.wait()
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_nonblocking_exchange_and_ordering(world):
    assert all(run_ranks(_nonblocking_exchange, world))


def _eager_and_queued_interleave(rank, size):
    # Blocking calls take an eager path (straight through the ring) only when nothing else is in
    # flight; mixed with isend/irecv and a full ring, order and matching must stay MPI's.
    parts = [np.full(30_000, 10 * i + 1, np.float32) for i in range(12)]  # 120 KB each: ring fills
    if rank == 0:
        w = sc.isend(parts[0], dst=1, tag=5)
        sc.send(parts[1], dst=1, tag=5)  # must arrive after parts[0]
        w.wait()
        for p in parts[2:]:
            sc.send(p, dst=1, tag=6)  # the receiver is still busy: later ones wait for room
        sc.send(np.array([7.0], np.float32), dst=1, tag=9)
    else:
        first, second = np.empty(30_000, np.float32), np.empty(30_000, np.float32)
        w = sc.irecv(first, src=0, tag=5)
        assert sc.recv(second, src=0, tag=5) == 0  # an irecv is pending: it matches first
        w.wait()
        assert np.array_equal(first, parts[0]) and np.array_equal(second, parts[1])
        time.sleep(0.2)
        late = np.empty(1, np.float32)
        assert sc.recv(late, src=None, tag=9) == 0  # queued behind ten unexpected messages
        assert late[0] == 7.0
        for p in parts[2:]:
            got = np.empty(30_000, np.float32)
            assert sc.recv(got, src=0, tag=6) == 0
            assert np.array_equal(got, p)
    return True


@pytest.mark.timeout(60)
def test_blocking_calls_keep_order_with_async_ones_and_a_full_ring():
    assert all(run_ranks(_eager_and_queued_interleave, 2))


def _large_both_ways(rank, size):
    # Messages above 1 MiB share their copy (the sender writes half into the receive buffer): both
    # ranks sending large messages at once, several in flight, must neither deadlock nor mix up.
    peer = 1 - rank
    outs = [np.arange(600_000, dtype=np.float64) * (rank + 1) + i for i in range(3)]
    works = [sc.isend(o, dst=peer, tag=i) for i, o in enumerate(outs)]
    for i in reversed(range(3)):
        got = np.empty(600_000)
        assert sc.recv(got, src=peer, tag=i) == peer
        assert np.array_equal(got, np.arange(600_000, dtype=np.float64) * (peer + 1) + i)
    for w in works:
        w.wait()
    return True


@pytest.mark.timeout(60)
def test_large_messages_both_ways_at_once():
    assert all(run_ranks(_large_both_ways, 2))


def _wide_tags_and_bad_arguments(rank, size):
    big = 2**40 + rank  # tags are 64-bit, not C ints
    if rank == 0:
        sc.send(np.arange(3.0), dst=1, tag=2**40 + 1)
    else:
        got = np.empty(3)
        assert sc.recv(got, src=0, tag=big) == 0 and got.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="64 bits"):
        sc.send(np.ones(1), dst=1 - rank, tag=2**64)
    with pytest.raises(TypeError, match="dst must be an int"):
        sc.send(np.ones(1), dst=True)
    with pytest.raises(ValueError, match="op must be"):
        sc.all_reduce(np.ones(1), op=-1)
    # a negative source is refused, not read as "any rank" (None is that)
    for bad in (-1, -2):
        with pytest.raises(ValueError, match=f"src must be a rank >= 0, or None for any rank; got {bad}"):
            sc.recv(np.ones(1), src=bad)
        with pytest.raises(ValueError, match=f"src must be a rank >= 0, or None for any rank; got {bad}"):
            sc.irecv(np.ones(1), src=bad)
    with pytest.raises(ValueError, match=r"dst must be a rank in \[0, 2\), got -1"):
        sc.send(np.ones(1), dst=-1)
    return True


@pytest.mark.timeout(60)
def test_wide_tags_and_bad_arguments():
    assert all(run_ranks(_wide_tags_and_bad_arguments, 2))


def _p2p_errors(rank, size):
    if rank == 0:
        with pytest.raises(ValueError, match="dst"):
            sc.send(np.ones(2), dst=5)
        with pytest.raises(TypeError, match="tag"):
            sc.send(np.ones(2), dst=1, tag="x")
        sc.send(np.ones(8), dst=1, tag=1)
        return True
    with pytest.raises(sc.CollectiveMismatchError, match="64 bytes"):
        sc.recv(np.ones(4), src=0, tag=1)  # too small for the 8 float64 sent
    with pytest.raises(sc.PeerFailureError):  # rank 0 left: nothing more will come
        sc.recv(np.ones(2), src=0, tag=2)
    return True


@pytest.mark.timeout(60)
def test_p2p_size_mismatch_and_departed_sender():
    assert all(run_ranks(_p2p_errors, 2))


def _recv_from_killed(rank, size):
    if rank == 0:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(sc.PeerFailureError) as info:
        sc.recv(np.ones(2), src=0)
    assert info.value.rank == 0
    return time.monotonic() - t0


@pytest.mark.timeout(60)
def test_recv_from_killed_peer_fails_fast():
    elapsed = run_ranks(_recv_from_killed, 2, expect_dead={0})[1]
    assert elapsed < 2.0


def _single_copy_messages(rank, size):
    """Messages above SHMCOMM_CMA_BYTES: header through the ring, payload read from the sender."""
    n = 200_000
    if rank == 0:
        a = np.arange(n, dtype=np.float64)
        b = np.arange(n, dtype=np.float64) * 2
        w1 = sc.isend(a, dst=1, tag=1)
        w2 = sc.isend(b, dst=1, tag=2)
        w1.wait(timeout=20)
        w2.wait(timeout=20)
        sc.send(np.arange(n, dtype=np.int32), dst=1, tag=3)
        w = sc.isend(a, dst=0, tag=4)  # to itself
        got = np.empty(n)
        sc.recv(got, src=0, tag=4)
        w.wait()
        assert np.array_equal(got, a)
        with pytest.raises(sc.PeerFailureError):  # rank 1 never reads this one and leaves
            sc.isend(np.ones(n), dst=1, tag=9).wait(timeout=20)
        return True
    second = np.empty(n)
    assert sc.recv(second, src=0, tag=2) == 0  # out of order: the first waits as unexpected
    first = np.empty(n)
    sc.recv(first, src=None, tag=1)
    assert np.array_equal(first, np.arange(n, dtype=np.float64))
    assert np.array_equal(second, np.arange(n, dtype=np.float64) * 2)
    with pytest.raises(sc.CollectiveMismatchError):
        sc.recv(np.empty(n, np.int64), src=0, tag=3)  # wrong dtype: refused, and the sender is released
    return True


@pytest.mark.timeout(60)
def test_single_copy_messages():
    assert all(run_ranks(_single_copy_messages, 2, env={"SHMCOMM_CMA_BYTES": 4096}))


def _send_then_recv_both_ways(rank, size, nbytes, rounds):
    """Both ranks send first, then receive: above the ring, each blocking send waited for the
    other's receive, which never came (a random CommTimeoutError: 5 of 6 runs at 320 KB)."""
    peer = 1 - rank
    count = nbytes // 8
    for i in range(rounds):
        mine = np.full(count, rank * 1000.0 + i)
        got = np.empty(count)
        sc.send(mine, dst=peer, tag=i)
        assert sc.recv(got, src=peer, tag=i) == peer
        assert (got == peer * 1000.0 + i).all(), (i, got[:3])
    return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nbytes,rounds", [(300_000, 20), (30 << 20, 20)], ids=["300KB", "30MiB"])
def test_blocking_send_then_recv_both_ways_never_deadlocks(nbytes, rounds):
    assert all(run_ranks(_send_then_recv_both_ways, 2, nbytes, rounds, env={"SHMCOMM_TIMEOUT": 10},
                         timeout=100))


# ---- exposures: a failed send or receive is never touched afterwards (issue 47) ---------------
def _late_push_after_a_receive_timed_out(rank, size):
    """An 8 MiB single-copy message, whose second half the sender writes (PUSH) into the
    receiver's buffer: rank 1's irecv times out while rank 0's progress thread cannot run (its
    main thread holds the GIL in one C call). The sender's write used to land afterwards, in the
    buffer the receiver had reused, and its send 'succeeded'."""
    import ctypes

    hold_gil = ctypes.PyDLL(None).usleep  # looked up first: the call below must hold the GIL at once
    n = 2 << 20
    small = np.zeros(4, np.float32)  # start each rank's progress thread: asleep from here on
    (sc.isend(small, dst=1) if rank == 0 else sc.irecv(small, src=0)).wait()
    sc.barrier()
    if rank == 1:
        buf = np.zeros(n, np.float32)
        try:
            sc.irecv(buf, src=0).wait()
            outcome = "received"
            assert (buf == 1).all()
        except sc.CommTimeoutError:
            outcome = "timed out"
        buf[...] = -1  # the user reuses the buffer
        time.sleep(1.5)  # the sender answers meanwhile
        return outcome, int(np.count_nonzero(buf != -1))
    time.sleep(0.85)
    w = sc.isend(np.ones(n, np.float32), dst=1)
    hold_gil(1_000_000)
    try:
        w.wait()
        return "sent", 0
    except sc.ShmcommError as exc:
        return f"{type(exc).__name__}: {exc}", 0


@pytest.mark.timeout(180)
def test_a_timed_out_receive_is_never_written_afterwards():
    timed_out = 0
    for trial in range(12):  # the race is the test's: retried until the receive times out twice
        (sent, _), (received, late_writes) = run_ranks(_late_push_after_a_receive_timed_out, 2,
                                                       env={"SHMCOMM_TIMEOUT": 1.0}, timeout=40)
        assert late_writes == 0, f"trial {trial}: {late_writes} elements written after the receive failed"
        if received == "timed out":
            timed_out += 1
            # the sender learns that its message was not delivered
            assert sent.startswith("ShmcommError") and "not delivered" in sent, sent
            if timed_out == 2:
                break
        else:
            assert sent == "sent"
    assert timed_out, "the receive never timed out: the test did not test anything"


def _sender_withdraws_after_its_send_fails(rank, size, failed):
    """Rank 0's single-copy isend times out (rank 1 posts no receive for it in time); rank 0
    reuses its buffer. A receive posted later must fail, never read the reused buffer.
    ``failed`` (an Event the ranks share) says when rank 0's send has failed: a fixed sleep in
    rank 1 once let a loaded machine's rank 1 read half the message before rank 0 timed out, and
    then wait for the other half from a rank 0 that had stopped driving (its own timeout, not
    the withdrawal, was the error)."""
    n = 1 << 20
    if rank == 0:
        data = np.full(n, 7.0)
        try:
            sc.isend(data, dst=1, tag=5).wait()
            return "sent"
        except sc.CommTimeoutError as exc:
            error = str(exc)
        finally:
            failed.set()
        data[...] = -1  # reused
        time.sleep(1.5)
        return error
    assert failed.wait(30), "rank 0's send neither failed nor completed"
    got = np.zeros(n)
    try:
        sc.recv(got, src=0, tag=5)
    except sc.ShmcommError as exc:
        return str(exc), int(np.count_nonzero(got == -1))
    return "received", int(np.count_nonzero(got == -1))


@pytest.mark.timeout(60)
def test_a_failed_send_withdraws_its_buffer():
    failed = multiprocessing.get_context("fork").Event()
    sent, (received, reused_read) = run_ranks(_sender_withdraws_after_its_send_fails, 2, failed,
                                              env={"SHMCOMM_TIMEOUT": 1.0}, timeout=40)
    assert reused_read == 0, f"the receive read {reused_read} elements of the reused buffer"
    assert "withdrew" in received, received  # refused: the sender's send failed
    assert "rendezvous" in sent, sent  # the send's error says why a large send waits for its receive


def _unexpected_messages_are_bounded(rank, size, count, each, bound):
    """Rank 0 sends ``count`` large messages rank 1 has not asked for while rank 1 is blocked in
    a receive of another tag: rank 1 takes at most ``bound`` bytes of them into buffers (they
    used to be taken without limit: 40 x 64 MiB grew it by 2.5 GiB); the rest wait for their
    receives, and every message arrives intact."""
    import psutil

    n = each // 8
    if rank == 0:
        works = [sc.isend(np.full(n, float(i)), dst=1, tag=100 + i) for i in range(count)]
        time.sleep(1.0)  # rank 1 sits in its receive meanwhile
        sc.send(np.zeros(1), dst=1, tag=1)
        for w in works:
            w.wait()
        return True
    before = psutil.Process().memory_info().rss
    sc.recv(np.zeros(1), src=0, tag=1)  # blocked while the large ones arrive
    grew = psutil.Process().memory_info().rss - before
    for i in range(count):
        got = np.empty(n)
        sc.recv(got, src=0, tag=100 + i)
        assert (got == i).all(), i
    return grew


@pytest.mark.timeout(120)
def test_unexpected_single_copy_messages_are_bounded():
    count, each, bound = 8, 16 << 20, 40 << 20  # 128 MiB sent; at most two messages held
    _, grew = run_ranks(_unexpected_messages_are_bounded, 2, count, each, bound,
                        env={"SHMCOMM_UNEXPECTED_BYTES": bound, "SHMCOMM_TIMEOUT": 30}, timeout=100)
    assert grew <= bound + (8 << 20), f"the receiver grew by {grew >> 20} MiB (bound {bound >> 20} MiB)"


def _sender_stopped_mid_stream(rank, size):
    """A 64 MiB message streams through the 256 KiB ring (single copy off); rank 1 stops the
    sender once the message has begun to arrive. Rank 1's receive, matched and part filled, used
    to wait for the rest for ever; it must fail at its deadline, and the rest, once the sender
    resumes, must never reach the buffer the user reused."""
    n = 8 << 20
    pids = [None] * size
    sc.all_gather_object(pids, os.getpid())
    sc.barrier()
    if rank == 0:
        try:
            sc.send(np.ones(n), dst=1)
            return "sent"
        except sc.ShmcommError as exc:
            return type(exc).__name__
    buf = np.zeros(n)
    w = sc.irecv(buf, src=0)
    while buf[0] == 0:  # the message has begun to arrive
        time.sleep(0.0001)
    os.kill(pids[0], signal.SIGSTOP)
    try:
        w.wait()
        outcome = "received"
    except sc.CommTimeoutError:
        outcome = "timed out"
    buf[...] = -1  # reused
    os.kill(pids[0], signal.SIGCONT)
    time.sleep(1.5)  # the sender writes the rest meanwhile (or gives up)
    return outcome, int(np.count_nonzero(buf != -1))


@pytest.mark.timeout(60)
def test_a_receive_whose_sender_stops_mid_stream_fails_and_stays_untouched():
    _, (outcome, written) = run_ranks(_sender_stopped_mid_stream, 2,
                                      env={"SHMCOMM_TIMEOUT": 1.0, "SHMCOMM_CMA_BYTES": 0}, timeout=40)
    assert outcome == "timed out" and written == 0, (outcome, written)
