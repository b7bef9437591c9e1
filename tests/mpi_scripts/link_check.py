"""The MPI engine's links on their own (run by tests/test_mpi_link.py under mpirun): one link
over MPI's world, every dtype and op of the compiled core against numpy's reference, counts 0,
1, odd and past the all-gather size, and every data-movement call and point to point.
Reductions are shmcomm's kernel in link-rank order, so every result is exact.

Prints "rank R link ok N" at the end; any failure raises (non-zero exit)."""
import os
import sys

import numpy as np

sys.modules["torch"] = None  # MPI alone: importing torch would fail
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import shmcomm as sc  # noqa: E402
from reference import DTYPES, assert_same_bits, make_input, ops_for, reduce_reference  # noqa: E402
from shmcomm.multinode.mpi_link import MPILink  # noqa: E402
from mpi4py import MPI  # noqa: E402

link = MPILink(MPI.COMM_WORLD.Dup(), timeout=60.0)
rank, size, checked = link.rank, link.size, 0
for dtype in DTYPES:
    for count in (0, 1, 1001, 9000):  # 9000: past GATHER_BYTES from 8-byte types on
        inputs = [make_input(dtype, count, r) for r in range(size)]
        for op in ops_for(dtype):
            if op == "AVG":  # links see SUM; the hierarchy divides
                continue
            a = inputs[rank].copy()
            link.all_reduce(a, int(sc.ReduceOp[op]))
            assert_same_bits(a, reduce_reference(inputs, op), f"all_reduce {dtype} {op} {count}")
            wholes = [make_input(dtype, count * size, r, salt=1) for r in range(size)]
            out = np.empty(count, dtype)
            mine = wholes[rank].copy()
            mine.flags.writeable = False  # inputs may be read-only
            link.reduce_scatter_into(out, mine, int(sc.ReduceOp[op]))
            assert_same_bits(out, reduce_reference(wholes, op)[rank * count:(rank + 1) * count],
                             f"reduce_scatter {dtype} {op} {count}")
            checked += 2
        b = inputs[rank].copy()
        link.broadcast(b, size - 1)
        assert_same_bits(b, inputs[size - 1], f"broadcast {dtype} {count}")
        every = np.empty(count * size, dtype)
        link.all_gather_into(every, inputs[rank])
        assert_same_bits(every, np.concatenate(inputs), f"all_gather {dtype} {count}")
        checked += 2
# all_to_all with uneven splits: rank r sends q + r + 1 elements to rank q
sends = [np.full(q + rank + 1, rank * 100 + q, np.int64) for q in range(size)]
got = np.empty(sum(rank + q + 1 for q in range(size)), np.int64)
link.all_to_all_single(got, np.concatenate(sends), [rank + q + 1 for q in range(size)],
                       [q + rank + 1 for q in range(size)])
want = np.concatenate([np.full(rank + q + 1, q * 100 + rank, np.int64) for q in range(size)])
assert_same_bits(got, want, "all_to_all_single")
outs = [np.empty(3, np.float32) for _ in range(size)] if rank == 0 else None
link.gather(np.full(3, rank, np.float32), outs, 0)
assert rank != 0 or all((o == q).all() for q, o in enumerate(outs)), outs
mine = np.empty(2, np.int16)
link.scatter(mine, [np.full(2, 7 * q, np.int16) for q in range(size)] if rank == 1 else None, 1)
assert (mine == 7 * rank).all(), mine
link.barrier()
checked += 4
# point to point around a ring, any source too; a wrong size is a mismatch, not a partial message
right, left = (rank + 1) % size, (rank - 1) % size
buf = np.empty(5, np.float64)
recv = link.irecv(buf, None, 3)
send = link.isend(np.full(5, float(rank)), right, 3)
recv.wait()
send.wait()
assert recv.source() == left and (buf == left).all(), (recv.source(), buf)
try:
    link.isend(np.ones(1), right, -1)
except ValueError as exc:
    assert "tag" in str(exc), exc
else:
    raise AssertionError("a negative tag was sent")
short = link.irecv(np.empty(2), left, 4)
link.isend(np.ones(3), right, 4).wait()
try:
    short.wait()
except sc.ShmcommError as exc:  # MPI's truncation error, or the size check
    assert "bytes" in str(exc) or "TRUNCATE" in str(exc).upper(), exc
else:
    raise AssertionError("a longer message fit a shorter receive")
checked += 3
# ranks that call different collectives: CollectiveMismatchError on every rank, no hang
try:
    if rank == 0:
        link.broadcast(np.ones(4, np.float32), 0)
    else:
        link.all_reduce(np.ones(4, np.float32), 0)
except sc.CollectiveMismatchError:
    checked += 1
else:
    raise AssertionError("a mismatch went through")
link.close()
print(f"rank {rank} link ok {checked}", flush=True)
