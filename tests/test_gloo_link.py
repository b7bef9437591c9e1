"""The gloo engine between nodes (shmcomm.multinode.gloo_link) on its own: gloo links between
plain processes of this machine, every dtype and op against numpy, on 2 ranks (the swap path a
two-node job's rails take, and gloo's collectives, as on a world link) and 3 (gloo's own
reductions, or all-gather and shmcomm's kernel). Links take numpy arrays, bfloat16 as ml_dtypes'
(the conversion to torch is the link's own)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from harness import run_ranks
from reference import BFLOAT16, DTYPES, bits, make_input, ops_for, reduce_reference

torch = pytest.importorskip("torch")

# Counts: empty, one, odd, and past GATHER_BYTES (gloo's own reductions on 3 ranks).
COUNTS = (0, 1, 1001, 20000)
# Every dtype of the compiled core: links move bytes, and reduce with shmcomm's kernel what gloo
# has no kernel for (long double included, which torch cannot hold).
LINK_DTYPES = list(DTYPES)


def _cases():
    for dtype in LINK_DTYPES:
        for op in ops_for(dtype):
            if op != "AVG":  # links see SUM; the hierarchy divides
                yield dtype, op


def _reduce_every_way(rank, size, store_path, carries_p2p):
    import torch.distributed as dist

    import shmcomm as sc
    from shmcomm.multinode.gloo_link import GlooLink

    link = GlooLink(dist.FileStore(store_path, size), "test/", rank, size, 30.0, carries_p2p)
    results = {}
    try:
        for dtype, op in _cases():
            code = int(sc.ReduceOp[op])
            for count in COUNTS:
                a = make_input(dtype, count, rank)
                link.all_reduce(a, code)
                results[("all_reduce", dtype.name, op, count)] = a
                whole = make_input(dtype, count * size, rank, salt=1)
                whole.flags.writeable = False  # inputs may be read-only (the link copies them)
                out = np.empty(count, dtype)
                link.reduce_scatter_into(out, whole, code)
                results[("reduce_scatter", dtype.name, op, count)] = out
    finally:
        link.close()
    return results


@pytest.mark.timeout(240)
@pytest.mark.parametrize("size,carries_p2p", [(2, False), (2, True), (3, False)],
                         ids=["2-swap", "2-gloo", "3-gloo"])
def test_link_reductions_match_numpy_and_agree_on_every_rank(size, carries_p2p, tmp_path):
    results = run_ranks(_reduce_every_way, size, str(tmp_path / "store"), carries_p2p, init=False,
                        timeout=200)
    checked = 0
    for dtype, op in _cases():
        for count in COUNTS:
            inputs = [make_input(dtype, count, r) for r in range(size)]
            wholes = [make_input(dtype, count * size, r, salt=1) for r in range(size)]
            for kind, expected_on in (("all_reduce", lambda r: reduce_reference(inputs, op)),
                                      ("reduce_scatter", lambda r: reduce_reference(
                                          wholes, op)[r * count:(r + 1) * count])):
                key = (kind, dtype.name, op, count)
                got = [results[r][key] for r in range(size)]
                if kind == "all_reduce":  # every rank holds the same bits
                    assert all(bits(got[0]) == bits(g) for g in got), f"ranks disagree: {key}"
                for r in range(size):
                    value = got[r]
                    assert value.dtype == dtype, key
                    want = expected_on(r)
                    if size == 2 or dtype.kind not in "fc" and dtype != BFLOAT16:
                        # two ranks reduce in rank order with shmcomm's kernel: exact
                        assert bits(value) == bits(want), f"{key} rank {r}: {value[:5]} != {want[:5]}"
                    else:  # gloo's ring sums in its own order
                        tol = 1e-2 if dtype.itemsize <= 2 or dtype == BFLOAT16 else 1e-5
                        np.testing.assert_allclose(value.astype(np.complex128), want.astype(np.complex128),
                                                   rtol=tol, atol=tol, err_msg=str(key))
                    checked += 1
    assert checked > 100


def test_node_groups_of_a_multinode_job_spin_only_when_gloo_threads_fit_too(monkeypatch):
    """A node group's ranks also run gloo's threads: counted, they decide whether waiting spins."""
    from shmcomm._core import group_settings
    from shmcomm.multinode.gloo_link import BUSY_THREADS

    monkeypatch.delenv("SHMCOMM_SPIN_US", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert group_settings(cores)["spin_us"] > 0  # one thread per rank: they fit
    assert group_settings(cores, 1 + BUSY_THREADS)["spin_us"] == 0
    assert group_settings(cores, 1 + BUSY_THREADS)["yields"] > group_settings(cores)["yields"]
