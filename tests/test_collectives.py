"""Every collective, dtype and reduce op against numpy references, at world sizes 1-4.

Small segment settings in some runs force the pipelined paths (arrays larger than a slot).
"""

import numpy as np
import pytest

import shmcomm as sc
from harness import run_ranks
from shmcomm import _core
from shmcomm.world import default_group
from reference import (BFLOAT16, DTYPES, FACTORS, assert_same_bits, digest, make_input, ops_for,
                       reduce_reference)

SIZES = [0, 1, 7, 1001]
PIPELINED = {"SHMCOMM_SLOT_BYTES": 8192, "SHMCOMM_SMALL_BYTES": 512}


def _reductions(rank, size, sizes):
    """all_reduce, reduce, reduce_scatter(_into) for every dtype x op x size."""
    results = []
    for dtype in DTYPES:
        for op in ops_for(dtype):
            code = sc.ReduceOp[op]
            for count in sizes:
                what = f"{dtype.name} {op} count={count}"
                inputs = [make_input(dtype, count, r) for r in range(size)]
                expected = reduce_reference(inputs, op)
                x = inputs[rank].copy()
                sc.all_reduce(x, op=code)
                assert_same_bits(x, expected, "all_reduce " + what)
                results.append(x)

                dst = count % size
                y = inputs[rank].copy()
                sc.reduce(y, dst=dst, op=code)
                assert_same_bits(y, expected if rank == dst else inputs[rank], "reduce " + what)

                whole = [make_input(dtype, count * size, r, salt=1) for r in range(size)]
                full = reduce_reference(whole, op)
                mine = slice(rank * count, (rank + 1) * count)
                out = np.empty(count, dtype)
                sc.reduce_scatter_into(out, whole[rank], op=code)
                assert_same_bits(out, full[mine], "reduce_scatter_into " + what)
                out2 = np.empty(count, dtype)
                sc.reduce_scatter(out2, np.split(whole[rank], size), op=code)
                assert_same_bits(out2, full[mine], "reduce_scatter " + what)
                results.append(out)
    return digest(results)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_reductions_match_numpy_and_are_bit_identical(world):
    digests = run_ranks(_reductions, world, SIZES, timeout=220)
    assert len(digests) == world


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3])
def test_reductions_pipelined_larger_than_segment(world):
    sizes = [3000, 20011]  # several slots' worth for 4-byte and 8-byte types
    run_ranks(_reductions, world, sizes, timeout=170, env=PIPELINED)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_reductions_single_copy(world):
    """Large private arrays: ranks reduce by reading peers' memory (several 256 KiB blocks)."""
    env = {"SHMCOMM_CMA_BYTES": 1024, "SHMCOMM_SMALL_BYTES": 512}
    run_ranks(_reductions, world, [300, 70001], timeout=220, env=env)


def _uneven_all_to_all(n_elems, dtype, rank, size, salt, what, in_place=False):
    """all_to_all_single where rank s sends n_elems(s, d) elements to rank d, checked against the
    senders' inputs rebuilt here (in place: one array is both input and output)."""
    send_splits = [n_elems(rank, q) for q in range(size)]
    recv_splits = [n_elems(q, rank) for q in range(size)]
    inp = make_input(dtype, sum(send_splits), rank, salt=salt)
    out = inp if in_place else np.empty(sum(recv_splits), dtype)
    sc.all_to_all_single(out, inp, recv_splits, send_splits)
    expected = []
    for q in range(size):
        theirs = make_input(dtype, sum(n_elems(q, d) for d in range(size)), q, salt=salt)
        start = sum(n_elems(q, d) for d in range(rank))
        expected.append(theirs[start:start + n_elems(q, rank)])
    assert_same_bits(out, np.concatenate(expected), what)


def _movement(rank, size, sizes):
    """broadcast, all_gather(_into), gather, scatter, all_to_all(_single) for every dtype x size."""
    for dtype in DTYPES:
        for count in sizes:
            what = f"{dtype.name} count={count}"
            inputs = [make_input(dtype, count, r) for r in range(size)]
            root = (count + 1) % size
            b = inputs[rank].copy()
            sc.broadcast(b, src=root)
            assert_same_bits(b, inputs[root], "broadcast " + what)

            outs = [np.empty(count, dtype) for _ in range(size)]
            sc.all_gather(outs, inputs[rank])
            for q in range(size):
                assert_same_bits(outs[q], inputs[q], f"all_gather from {q} " + what)
            whole = np.empty(count * size, dtype)
            sc.all_gather_into(whole, inputs[rank])
            assert_same_bits(whole, np.concatenate(inputs), "all_gather_into " + what)

            gl = [np.empty(count, dtype) for _ in range(size)] if rank == root else None
            sc.gather(inputs[rank], gl, dst=root)
            if rank == root:
                for q in range(size):
                    assert_same_bits(gl[q], inputs[q], f"gather from {q} " + what)

            pieces = [make_input(dtype, count, root * 100 + q) for q in range(size)]
            mine = np.empty(count, dtype)
            sc.scatter(mine, pieces if rank == root else None, src=root)
            assert_same_bits(mine, pieces[rank], "scatter " + what)

            sends = [make_input(dtype, count, rank * 100 + q, salt=2) for q in range(size)]
            recvs = [np.empty(count, dtype) for _ in range(size)]
            sc.all_to_all(recvs, sends)
            for q in range(size):
                assert_same_bits(recvs[q], make_input(dtype, count, q * 100 + rank, salt=2),
                                 f"all_to_all from {q} " + what)

            # uneven splits: rank r sends (q + r + count) % 3 elements to rank q
            _uneven_all_to_all(lambda src, dst: (dst + src + count) % 3, dtype, rank, size, salt=3,
                               what="all_to_all_single " + what)
    sc.barrier()
    return True


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_data_movement_matches_numpy(world):
    assert all(run_ranks(_movement, world, SIZES, timeout=170))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 4])
def test_data_movement_pipelined(world):
    assert all(run_ranks(_movement, world, [5000], timeout=170, env=PIPELINED))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3])
def test_data_movement_single_copy(world):
    """Pieces above SHMCOMM_CMA_BYTES are read from peers' memory directly."""
    assert all(run_ranks(_movement, world, [300, 5000], timeout=170, env={"SHMCOMM_CMA_BYTES": 1024}))


def _string_copy_sizes(rank, size):
    """Slot copies of 1280 B up to 4 KiB go by `rep movsb` where the CPU makes it fast
    (shm_copy.h): byte counts on both sides of its bounds, odd ones and views at odd addresses
    included, through all_reduce, broadcast and all_gather; then many broadcasts of 1.5 KiB."""
    for nbytes in (1279, 1280, 1281, 2047, 2111, 2113, 4095, 4096, 4097):
        raw = np.empty(nbytes + 1, np.uint8)
        x = raw[1:]  # an odd address
        x[:] = (np.arange(nbytes) * (rank + 3)) % 251
        expected = sum((np.arange(nbytes) * (r + 3)) % 251 for r in range(size)).astype(np.uint8)
        sc.all_reduce(x)
        assert_same_bits(x, expected, f"all_reduce of {nbytes} B")
        b = (np.arange(nbytes) * 7 + rank).astype(np.uint8)
        sc.broadcast(b, src=size - 1)
        assert_same_bits(b, (np.arange(nbytes) * 7 + size - 1).astype(np.uint8), f"broadcast of {nbytes} B")
        outs = [np.empty(nbytes, np.uint8) for _ in range(size)]
        sc.all_gather(outs, np.full(nbytes, rank + 1, np.uint8))
        for q in range(size):
            assert_same_bits(outs[q], np.full(nbytes, q + 1, np.uint8), f"all_gather of {nbytes} B from {q}")
    # a broadcast of 1 KiB and more moves along the root's slot call by call (broadcast.pxi):
    # past a whole lap of the slot, every call's data where the receivers look
    for i in range(600):
        b = np.full(1500 + i % 7, (i * 7 + rank) % 256, np.uint8)
        sc.broadcast(b, src=i % size)
        assert (b == (i * 7 + i % size) % 256).all(), f"broadcast call {i}"
    return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_slot_copies_around_the_string_copy_sizes(world):
    assert all(run_ranks(_string_copy_sizes, world, timeout=100))


def _thresholds_follow_rank_zero(rank, size):
    x = np.arange(50_000, dtype=np.float64) * (rank + 1)
    sc.all_reduce(x)
    outs = [np.empty(50_000) for _ in range(size)]
    sc.all_gather(outs, np.full(50_000, float(rank)))
    assert all((outs[q] == q).all() for q in range(size))
    return bool((x == np.arange(50_000) * sum(range(1, size + 1))).all())


@pytest.mark.timeout(60)
def test_ranks_with_different_settings_use_rank_zeros(monkeypatch):
    """Algorithm thresholds set differently per rank must not split the ranks' step sequences."""
    import os

    def run(rank, size):
        os.environ["SHMCOMM_SMALL_BYTES"] = str(1 << 20) if rank else "64"
        os.environ["SHMCOMM_CMA_BYTES"] = "0" if rank else "1024"
        sc.init_process_group(rank=rank, world_size=size, name=f"thr-{os.getppid()}", timeout=30)
        try:
            return _thresholds_follow_rank_zero(rank, size)
        finally:
            sc.destroy_process_group()

    assert all(run_ranks(run, 3, init=False))


def _inputs_of_every_kind(rank, size):
    import array

    torch = pytest.importorskip("torch")
    expected = sum(range(size))
    # torch tensors, reduced in place, including bfloat16 and float16
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        t = torch.full((5,), rank, dtype=dt)
        sc.all_reduce(t)
        assert t.tolist() == [expected] * 5, (dt, t)
    t = torch.full((3, 4), float(rank), requires_grad=True)
    sc.all_reduce(t.data)
    assert float(t.data[0, 0]) == expected
    with pytest.raises(ValueError, match="contiguous"):
        sc.all_reduce(torch.zeros(4, 4).t())
    whole = torch.arange(10.0) * (rank + 1)
    part = whole[3:7]  # contiguous, not at the start of its storage
    sc.all_reduce(part)
    assert part.tolist() == [v * sum(range(1, size + 1)) for v in (3.0, 4.0, 5.0, 6.0)]
    assert whole[:3].tolist() == [v * (rank + 1) for v in (0.0, 1.0, 2.0)]  # untouched
    # lazy views whose memory does not hold their values: refused, not reduced wrongly
    z = torch.tensor([1 + 2j, 3 - 1j]) * (rank + 1)
    for lazy in (z.conj(), torch._neg_view(torch.ones(3))):
        with pytest.raises(ValueError, match="lazily conjugated or negated"):
            sc.all_reduce(lazy)
    empty = torch.empty(0)
    sc.all_reduce(empty)
    with pytest.raises(TypeError, match="unsupported dtype"):
        sc.all_reduce(torch.zeros(2, dtype=torch.complex32))
    # buffer-protocol objects
    a = array.array("d", [rank] * 3)
    sc.all_reduce(a)
    assert list(a) == [expected] * 3
    ba = bytearray([rank + 1] * 4)
    sc.all_reduce(ba, op=sc.ReduceOp.MAX)
    assert list(ba) == [size] * 4
    with pytest.raises(TypeError, match="buffer-protocol"):
        sc.all_reduce([1, 2, 3])
    with pytest.raises(ValueError, match="writable"):
        sc.all_reduce(bytes(4))
    # shared-memory arrays
    x = sc.empty((2, 3), np.float64)
    x[:] = rank
    sc.all_reduce(x)
    assert x.shape == (2, 3) and (x == expected).all()
    z = sc.zeros(10, np.int32)
    assert (z == 0).all()
    big = sc.empty(100_000, np.float32)
    big[:] = np.arange(100_000, dtype=np.float32) * (rank + 1)
    sc.all_reduce(big)
    assert np.array_equal(big, np.arange(100_000, dtype=np.float32) * sum(range(1, size + 1)))
    # coalesced
    arrays = [np.full(3, rank, np.float32), np.full(1000, rank, np.int16)]
    sc.all_reduce_coalesced(arrays)
    assert all((a == expected).all() for a in arrays)
    return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_torch_buffers_and_shared_arrays(world):
    pytest.importorskip("torch")
    assert all(run_ranks(_inputs_of_every_kind, world))


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_tensor_is_direct_names_the_tensors_taken_by_pointer():
    torch = pytest.importorskip("torch")
    z = torch.tensor([1 + 2j, 3 - 1j])
    taken = {"float32": torch.ones(4), "bfloat16": torch.ones(4, dtype=torch.bfloat16),
             "complex64": z, "slice": torch.arange(10.0)[3:7], "empty": torch.empty(0)}
    copied = {"transposed": torch.ones(4, 4).t(), "conj view": z.conj(), "neg view": torch._neg_view(torch.ones(3)),
              "complex32": torch.zeros(2, dtype=torch.complex32),
              "parameter": torch.nn.Parameter(torch.ones(2)), "numpy": np.ones(2)}
    assert {k for k, t in taken.items() if not sc._core.tensor_is_direct(t)} == set()
    assert {k for k, t in copied.items() if sc._core.tensor_is_direct(t)} == set()


def _objects(rank, size):
    objs = [{"a": 1}, "text", 3.5] if rank == 0 else [None, None, None]
    sc.broadcast_object_list(objs, src=0)
    assert objs == [{"a": 1}, "text", 3.5]
    out = [None] * size
    sc.all_gather_object(out, {"rank": rank, "pad": "x" * rank * 100})
    assert [o["rank"] for o in out] == list(range(size))
    gl = [None] * size if rank == size - 1 else None
    sc.gather_object(("r", rank), gl, dst=size - 1)
    if rank == size - 1:
        assert gl == [("r", q) for q in range(size)]
    got = [None]
    sc.scatter_object_list(got, [list(range(q)) for q in range(size)] if rank == 0 else None, src=0)
    assert got[0] == list(range(rank))
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_object_collectives(world):
    assert all(run_ranks(_objects, world))


def _premul_sum(rank, size, sizes):
    """PREMUL_SUM (the torch backend's scaled sum; each rank scales by its own factor) on every
    reduction path: private arrays, shared ones (zero copy), and async calls queued together
    (batched, each with its own factors), for every floating dtype."""
    comm = default_group()._comm
    code, factor = _core.PREMUL_SUM, FACTORS[rank]
    for dtype in [d for d in DTYPES if d.kind == "f" or d == BFLOAT16]:
        for count in sizes:
            what = f"{dtype.name} count={count}"
            inputs = [make_input(dtype, count, r) for r in range(size)]
            expected = reduce_reference(inputs, "PREMUL_SUM")
            x = inputs[rank].copy()
            comm.all_reduce(x, code, factor=factor)
            assert_same_bits(x, expected, "all_reduce " + what)
            z = sc.empty(count, dtype)
            z[:] = inputs[rank]
            comm.all_reduce(z, code, factor=factor)
            assert_same_bits(z, expected, "zero-copy all_reduce " + what)
            y = inputs[rank].copy()
            comm.reduce(y, size - 1, code, factor=factor)
            assert_same_bits(y, expected if rank == size - 1 else inputs[rank], "reduce " + what)
            whole = [make_input(dtype, count * size, r, salt=1) for r in range(size)]
            full = reduce_reference(whole, "PREMUL_SUM")
            out = np.empty(count, dtype)
            comm.reduce_scatter_into(out, whole[rank], code, factor=factor)
            assert_same_bits(out, full[rank * count:(rank + 1) * count], "reduce_scatter " + what)
            shared = sc.empty(count * size, dtype)
            shared[:] = whole[rank]
            comm.reduce_scatter_into(out, shared, code, factor=factor)
            assert_same_bits(out, full[rank * count:(rank + 1) * count],
                             "zero-copy reduce_scatter " + what)
        # several queued calls, each scaled differently: batched calls carry their own factors
        inputs = [[make_input(dtype, 33, r, salt=j) for r in range(size)] for j in range(6)]
        arrays = [inputs[j][rank].copy() for j in range(6)]
        works = [comm.all_reduce(a, code, async_op=True, factor=factor * (j + 1))
                 for j, a in enumerate(arrays)]
        for j, w in enumerate(works):
            w.wait()
            scaled = [f * (j + 1) for f in FACTORS]
            assert_same_bits(arrays[j], reduce_reference(inputs[j], "PREMUL_SUM", scaled),
                             f"queued all_reduce {j} {dtype.name}")
    return True


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world,env,sizes", [
    (1, {}, SIZES), (2, {}, SIZES), (3, {}, SIZES), (4, {}, [1, 1001]),
    (3, PIPELINED, [3000, 20011]),
    (2, {"SHMCOMM_CMA_BYTES": 1024, "SHMCOMM_SMALL_BYTES": 512}, [70001]),
], ids=["1", "2", "3", "4", "pipelined-3", "single-copy-2"])
def test_premul_sum_on_every_path(world, env, sizes):
    assert all(run_ranks(_premul_sum, world, sizes, timeout=220, env=env))


def _zero_copy(rank, size):
    """Arrays from sc.empty take the zero-copy path from 4 KiB (below the single-copy size too,
    where the one-shot and medium paths serve private arrays); mixed with private arrays, or at
    another offset on one rank, they still work, through the slots."""
    comm = default_group()._comm
    for dtype in (np.float32, np.float16, np.int64):
        for count in (1000, 5000, 300_001):  # float32: 4000 B (one shot), 20000 B (medium at 2 ranks)
            inputs = [make_input(np.dtype(dtype), count, r) for r in range(size)]
            zero_copy = count * np.dtype(dtype).itemsize >= 4096
            for op in ("SUM", "MAX"):
                expected = reduce_reference(inputs, op)
                x = sc.empty(count, dtype)
                x[:] = inputs[rank]
                before = comm.zero_copy_calls
                sc.all_reduce(x, op=sc.ReduceOp[op])
                assert_same_bits(x, expected, f"zero-copy all_reduce {dtype} {op} {count}")
                assert comm.zero_copy_calls - before == zero_copy, f"all_reduce {dtype} {count}: wrong path"
                y = sc.empty(count, dtype)
                y[:] = inputs[rank]
                sc.reduce(y, dst=1, op=sc.ReduceOp[op])
                assert_same_bits(y, expected if rank == 1 else inputs[rank], f"zero-copy reduce {dtype}")
            # rank 0 passes a private array, the others shared ones: falls back to copying
            shared = sc.empty(count, dtype)
            z = inputs[rank].copy() if rank == 0 else shared
            z[:] = inputs[rank]
            before = comm.zero_copy_calls
            sc.all_reduce(z)
            assert_same_bits(z, reduce_reference(inputs, "SUM"), "mixed zero-copy")
            assert comm.zero_copy_calls == before, "zero copy with one private array"
            # a view at another offset of the shared array on one rank only
            w = sc.empty(count + 1, dtype)
            v = w[1:] if rank == 0 else w[:-1]
            v[:] = inputs[rank]
            sc.all_reduce(v)
            assert_same_bits(v, reduce_reference(inputs, "SUM"), "offset zero-copy")
            assert comm.zero_copy_calls == before, "zero copy with arrays at different offsets"
            _zero_copy_gather_scatter(rank, size, np.dtype(dtype), count)
    # queued calls around one on a shared array, on every rank or on rank 0 only (where the
    # others batch calls 1 and 2 together while rank 0 runs call 1 alone): all done, in order
    for everywhere in (True, False):
        for count in (2000, 6000):  # one shot, medium (at 2 ranks)
            arrays = [make_input(np.dtype(np.float32), count, rank, salt=j) for j in range(4)]
            shared = sc.empty(count, np.float32)
            if everywhere or rank == 0:
                shared[:] = arrays[1]
                arrays[1] = shared
            works = [sc.all_reduce(a, async_op=True) for a in arrays]
            for j, (a, w) in enumerate(zip(arrays, works)):
                w.wait()
                whole = [make_input(np.dtype(np.float32), count, r, salt=j) for r in range(size)]
                assert_same_bits(a, reduce_reference(whole, "SUM"),
                                 f"queued all_reduce {j} of {count} around a shared one ({everywhere=})")
    return True


def _many_heaps(rank, size):
    """Which heap holds an array is found among many live and dead ones (past the 128 kept in C
    too): zero copy on a live one's array, never on a private array."""
    import gc

    comm = default_group()._comm

    def check(array, shared, what):
        array[:] = rank + 1
        before = comm.zero_copy_calls
        sc.all_reduce(array)
        assert np.all(array == size * (size + 1) // 2), what
        assert comm.zero_copy_calls - before == shared, what

    keep = [sc.empty(2048, np.float32) for _ in range(20)]
    del keep[::2]  # dead heaps between live ones
    gc.collect()
    check(keep[3], True, "an array of a heap older than dead ones")
    check(np.empty(2048, np.float32), False, "a private array among dead heaps")
    newest = sc.empty(2048, np.float32)  # made after the deaths: the dead ones are dropped
    check(newest, True, "the newest heap's array")
    keep += [sc.empty(1024, np.float32) for _ in range(130)]  # past the 128 kept in C
    check(keep[5], True, "an old heap's array, 140 heaps alive")
    check(keep[-1], True, "the newest of 140 heaps")
    check(np.empty(2048, np.float32), False, "a private array, 140 heaps alive")
    return True


@pytest.mark.timeout(120)
def test_arrays_are_found_among_many_live_and_dead_heaps():
    assert all(run_ranks(_many_heaps, 2))


def _zero_copy_gather_scatter(rank, size, dtype, count):
    """all_gather_into with every output from sc.empty, and reduce_scatter_into with every input
    from sc.empty (FSDP2's buffers): in place and not, and falling back when one rank's buffer is
    private."""
    comm = default_group()._comm
    # the sizes that take the zero-copy path, all pieces together (each rank writes or reads
    # them): from the single-copy size, or from 4 KiB (all_gather) and 16 KiB (reduce_scatter)
    # below it, where the first step says where the arrays lie
    total = count * dtype.itemsize * size
    large = total >= min(comm.cma_bytes, 4096)
    pieces = [make_input(dtype, count, r, salt=2) for r in range(size)]
    gathered = np.concatenate(pieces)
    for in_place in (True, False):
        out = sc.empty(count * size, dtype)
        out[:] = 0
        mine = out[rank * count:(rank + 1) * count]
        inp = mine if in_place else pieces[rank].copy()
        mine[:] = pieces[rank] if in_place else 0
        before = comm.zero_copy_calls
        sc.all_gather_into(out, inp)
        assert_same_bits(out, gathered, f"zero-copy all_gather_into {dtype} {count} {in_place=}")
        assert comm.zero_copy_calls - before == large, "all_gather_into took the wrong path"
    shared = sc.empty(count * size, dtype)  # collective: every rank makes it, one rank ignores it
    private = np.empty(count * size, dtype) if rank == size - 1 else shared
    before = comm.zero_copy_calls
    sc.all_gather_into(private, pieces[rank])
    assert_same_bits(private, gathered, "all_gather_into, one output private")
    assert comm.zero_copy_calls == before, "zero copy with one private output"

    wholes = [make_input(dtype, count * size, r, salt=3) for r in range(size)]
    for op in ("SUM", "MAX"):
        full = reduce_reference(wholes, op)[rank * count:(rank + 1) * count]
        for in_place in (True, False):
            whole = sc.empty(count * size, dtype)
            whole[:] = wholes[rank]
            out = whole[rank * count:(rank + 1) * count] if in_place else np.empty(count, dtype)
            before = comm.zero_copy_calls
            sc.reduce_scatter_into(out, whole, op=sc.ReduceOp[op])
            assert_same_bits(out, full, f"zero-copy reduce_scatter_into {dtype} {op} {in_place=}")
            assert comm.zero_copy_calls - before == (total >= min(comm.cma_bytes, 16384)), \
                "reduce_scatter_into took the wrong path"
        shared = sc.empty(count * size, dtype)
        whole = wholes[rank].copy() if rank == 0 else shared
        whole[:] = wholes[rank]
        out = np.empty(count, dtype)
        before = comm.zero_copy_calls
        sc.reduce_scatter_into(out, whole, op=sc.ReduceOp[op])
        assert_same_bits(out, full, "reduce_scatter_into, one input private")
        assert comm.zero_copy_calls == before, "zero copy with one private input"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,env", [(2, {}), (3, {}), (4, {"SHMCOMM_CMA_BYTES": 1024})],
                         ids=["2", "3", "4-small-pieces"])
def test_zero_copy_shared_arrays(world, env):
    assert all(run_ranks(_zero_copy, world, env=env))


def _fsdp_shards(rank, size):
    """FSDP2's all-gather and reduce-scatter of a 1.25 MiB layer at 8 ranks: 160 KiB shards,
    below the single-copy size each, in sc.empty buffers: zero copy all the same."""
    _zero_copy_gather_scatter(rank, size, np.dtype(np.float32), 40_000)
    assert 40_000 * 4 < default_group()._comm.cma_bytes <= 40_000 * 4 * size
    return True


@pytest.mark.timeout(120)
def test_zero_copy_takes_small_shards_of_a_large_layer_at_8_ranks():
    assert all(run_ranks(_fsdp_shards, 8))


def _all_to_all_large(rank, size):
    """Pieces above the single-copy threshold: uneven splits, and in place (must not race)."""
    f64, f32 = np.dtype(np.float64), np.dtype(np.float32)

    _uneven_all_to_all(lambda src, dst: 3000 + 1000 * ((src + 2 * dst) % 3), f64, rank, size, salt=5,
                       what="all_to_all_single, uneven, single copy")

    want = [make_input(f32, 4000, q * 100 + rank, salt=6) for q in range(size)]
    pieces = [make_input(f32, 4000, rank * 100 + q, salt=6) for q in range(size)]
    whole = np.concatenate(pieces)
    sc.all_to_all(pieces, pieces)  # the same arrays in and out
    for q in range(size):
        assert_same_bits(pieces[q], want[q], f"all_to_all in place from {q}")
    sc.all_to_all_single(whole, whole)
    assert_same_bits(whole, np.concatenate(want), "all_to_all_single in place")

    for base in (1, 3000):  # in place with uneven (symmetric) splits: slots, then single copy
        def sym(src, dst):  # symmetric, so every rank sends as much as it receives
            return base * (1 + (src + dst) % 2) + (src + dst) % 3
        _uneven_all_to_all(sym, f64, rank, size, salt=7, in_place=True,
                           what=f"all_to_all_single in place, uneven, {base}")
    return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_all_to_all_single_copy_uneven_and_in_place(world):
    assert all(run_ranks(_all_to_all_large, world, timeout=100, env={"SHMCOMM_CMA_BYTES": 1024}))


def _offset_view(dtype, count, offset):
    """``count`` elements starting ``offset`` elements into a fresh array: a destination that is
    not 16-byte aligned, so streaming copies take their unaligned head and tail paths."""
    return np.zeros(count + offset + 1, dtype)[offset:offset + count]


def _large_outputs(rank, size):
    """Outputs above SHMCOMM_STREAM_BYTES (written with streaming stores) into unaligned views."""
    for dtype, count, offset in ((np.dtype(np.float32), 300_001, 1), (np.dtype(np.int8), 1_200_007, 3)):
        what = f"{dtype.name} count={count} offset={offset}"
        inputs = [make_input(dtype, count, r, salt=8) for r in range(size)]
        root = size - 1
        b = _offset_view(dtype, count, offset)
        b[...] = inputs[rank]
        sc.broadcast(b, src=root)
        assert_same_bits(b, inputs[root], "broadcast " + what)

        whole = _offset_view(dtype, count * size, offset)
        sc.all_gather_into(whole, inputs[rank])
        assert_same_bits(whole, np.concatenate(inputs), "all_gather_into " + what)
        in_place = _offset_view(dtype, count * size, offset)
        in_place[rank * count:(rank + 1) * count] = inputs[rank]
        sc.all_gather_into(in_place, in_place[rank * count:(rank + 1) * count])
        assert_same_bits(in_place, np.concatenate(inputs), "all_gather_into in place " + what)

        gl = [_offset_view(dtype, count, offset) for _ in range(size)] if rank == root else None
        sc.gather(inputs[rank], gl, dst=root)
        for q in range(size if rank == root else 0):
            assert_same_bits(gl[q], inputs[q], f"gather from {q} " + what)

        mine = _offset_view(dtype, count, offset)
        sc.scatter(mine, inputs if rank == root else None, src=root)
        assert_same_bits(mine, inputs[rank], "scatter " + what)

        sends = np.concatenate([make_input(dtype, count, rank * 100 + q, salt=9) for q in range(size)])
        want = np.concatenate([make_input(dtype, count, q * 100 + rank, salt=9) for q in range(size)])
        out = _offset_view(dtype, count * size, offset)
        sc.all_to_all_single(out, sends)
        assert_same_bits(out, want, "all_to_all_single " + what)
        sc.all_to_all_single(sends, sends)  # in place: sent from the kept staging copy
        assert_same_bits(sends, want, "all_to_all_single in place " + what)

        shared = sc.empty(count, dtype)  # zero copy: results written into every peer's array
        shared[...] = inputs[rank]
        sc.all_reduce(shared)
        assert_same_bits(shared, reduce_reference(inputs, "SUM"), "all_reduce sc.empty " + what)
        del shared
    sc.barrier()
    return True


STREAM = {"SHMCOMM_STREAM_BYTES": 1 << 20}  # the default is half the last-level cache


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world, env", [(2, STREAM), (3, STREAM), (2, {**STREAM, "SHMCOMM_CMA_BYTES": 0}),
                                        (3, {**STREAM, "SHMCOMM_CMA_BYTES": 0, "SHMCOMM_SLOT_BYTES": 65536})])
def test_large_outputs_into_unaligned_views(world, env):
    """Single copy (default) and the slot pipeline (CMA off) both stream large results."""
    assert all(run_ranks(_large_outputs, world, timeout=170, env=env))


def _all_to_all_single_rows(rank, size):
    """Split sizes count rows along the first axis, as torch's do (elements for 1-D arrays)."""
    in_rows = [rank + q + 1 for q in range(size)]          # rank r sends r + q + 1 rows to q
    out_rows = [q + rank + 1 for q in range(size)]
    inp = np.concatenate([np.full((k, 3), rank * 10 + q, np.int32) for q, k in enumerate(in_rows)])
    out = np.empty((sum(out_rows), 3), np.int32)
    sc.all_to_all_single(out, inp, out_rows, in_rows)
    expected = np.concatenate([np.full((k, 3), q * 10 + rank, np.int32) for q, k in enumerate(out_rows)])
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(TypeError, match=r"input_split_sizes\[i\] must be an int"):
        sc.all_to_all_single(out, inp, out_rows, ["a"] * size)
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [1, 3])
def test_all_to_all_single_splits_count_rows(world):
    assert all(run_ranks(_all_to_all_single_rows, world))


def _across_the_step_wrap(rank, size):
    """Every path that steps, called round after round with values that change every round,
    past 2000 steps: a group starts its 32-bit step numbers 1024 below their wrap (engine.pxi
    FIRST_STEP), so this crosses it on every path, arrivals read from the descriptor's tag."""
    results = []
    for i in range(700):
        small = np.full(3, rank + i, np.float32)
        sc.all_reduce(small)  # one step
        medium = np.full(3000, float(rank * i), np.float64)
        sc.all_reduce(medium)  # two steps (reduce-scatter + all-gather)
        b = np.full(5, i if rank == i % size else -1, np.int64)
        sc.broadcast(b, src=i % size)
        sc.barrier()
        results.append(bool((small == sum(range(size)) + size * i).all()
                            and (medium == float(i * sum(range(size)))).all()
                            and (b == i).all()))
    return all(results)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_step_numbers_wrap_safely(world):
    assert all(run_ranks(_across_the_step_wrap, world, timeout=110, env={"SHMCOMM_SMALL_BYTES": 64}))


def _every_spelling_of_product(rank, size):
    """ReduceOp.PROD (MPI's and numpy's spelling) is PRODUCT; so are "prod" and "product"."""
    inputs = [make_input(np.dtype(np.float64), 101, r) for r in range(size)]
    expected = reduce_reference(inputs, "PRODUCT")
    for op in (sc.ReduceOp.PROD, sc.ReduceOp.PRODUCT, "prod", "PROD", "product", int(sc.ReduceOp.PROD)):
        x = inputs[rank].copy()
        sc.all_reduce(x, op=op)
        assert_same_bits(x, expected, f"all_reduce op={op!r}")
    return [m.name for m in sc.ReduceOp]


@pytest.mark.timeout(60)
def test_prod_is_an_alias_of_product():
    assert sc.ReduceOp.PROD is sc.ReduceOp.PRODUCT
    names = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"]
    assert run_ranks(_every_spelling_of_product, 2) == [names] * 2  # each op once
