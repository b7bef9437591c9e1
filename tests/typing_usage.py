"""Typed uses of shmcomm's public API, for mypy only (tests/test_typing.py): the return types that
matter are pinned with ``assert_type``, and the calls that must be type errors carry a
``# type: ignore[code]`` that mypy (``warn_unused_ignores``) reports as unused if the error goes
away. Never run, nor collected by pytest (no ``test_`` prefix); the functions take what a real
program would have, so nothing needs a process group.
"""
# A collective returning None is used as an expression here on purpose, to pin that type.
# mypy: disable-error-code="func-returns-value"

from __future__ import annotations

import array as pyarray
from typing import Any

import numpy as np
from typing_extensions import assert_type

import shmcomm as sc
from shmcomm import rpc

F32 = np.ndarray[Any, np.dtype[np.float32]]


def collectives(x: F32, outs: list[F32], pg: sc.ProcessGroup) -> None:
    # Synchronous calls return None; async_op=True returns a Work; a bool variable, either.
    assert_type(sc.all_reduce(x), None)
    assert_type(sc.all_reduce(x, op=sc.ReduceOp.MAX), None)
    assert_type(sc.all_reduce(x, "avg", pg), None)
    assert_type(sc.all_reduce(x, async_op=True), sc.Work)
    assert_type(sc.all_reduce(x, op=7, group=pg, async_op=False), None)
    flag: bool = bool(x.size)
    assert_type(sc.all_reduce(x, async_op=flag), sc.Work | None)
    assert_type(pg.all_reduce(x), None)
    assert_type(pg.all_reduce(x, async_op=True), sc.Work)
    assert_type(sc.broadcast(x, src=0), None)
    assert_type(sc.broadcast(x, 0, async_op=True), sc.Work)
    assert_type(sc.reduce(x, dst=0, op="sum"), None)
    assert_type(sc.all_gather(outs, x), None)
    assert_type(sc.all_gather_into(x, x, async_op=True), sc.Work)
    assert_type(sc.gather(x, None, dst=0), None)
    assert_type(sc.scatter(x, outs, src=0, async_op=True), sc.Work)
    assert_type(sc.reduce_scatter(x, outs), None)
    assert_type(sc.reduce_scatter_into(x, x, op=sc.ReduceOp.SUM, async_op=True), sc.Work)
    assert_type(sc.all_to_all(outs, outs), None)
    assert_type(sc.all_to_all_single(x, x, [1, 2], (2, 1)), None)
    assert_type(sc.all_gather_v(x, x, counts=[1, 2]), None)
    assert_type(sc.gather_v(x, None, dst=1, async_op=True), sc.Work)
    assert_type(sc.scatter_v(x, None), None)
    assert_type(sc.reduce_scatter_v(x, x, [1, 1], async_op=True), sc.Work)
    assert_type(sc.barrier(), None)
    assert_type(sc.barrier(async_op=True), sc.Work)
    assert_type(sc.all_reduce_coalesced([x, x]), None)
    assert_type(sc.all_reduce_coalesced([x], async_op=True), sc.Work)
    assert_type(pg.all_reduce_coalesced([x], async_op=True), sc.Work)

    # Arrays: numpy, any buffer-protocol object (torch tensors match structurally).
    assert_type(sc.all_reduce(bytearray(8)), None)
    assert_type(sc.all_reduce(memoryview(bytearray(8))), None)
    assert_type(sc.all_reduce(pyarray.array("d", [1.0])), None)
    assert_type(sc.all_reduce(np.zeros(3, np.int64)), None)

    # Point to point.
    assert_type(sc.send(x, dst=1, tag=3), None)
    assert_type(sc.recv(x), int)
    assert_type(sc.recv(x, src=0, tag=3, group=pg), int)
    assert_type(pg.recv(x, None), int)
    assert_type(sc.isend(x, 1), sc.Work)
    assert_type(sc.irecv(x, src=None), sc.Work)
    assert_type(sc.sendrecv(x, 1, outs[0], sc.PROC_NULL, sendtag=2), int)
    assert_type(pg.sendrecv(x, sc.PROC_NULL, outs[0], None), int)

    # Objects and shared arrays.
    objs: list[Any] = [None] * sc.get_world_size()
    assert_type(sc.all_gather_object(objs, {"rank": sc.get_rank()}), None)
    assert_type(sc.broadcast_object_list(objs, src=0), None)
    assert_type(sc.gather_object(1, objs if sc.get_rank() == 0 else None), None)
    assert_type(sc.scatter_object_list(objs, None, src=0), None)
    assert_type(sc.empty(4, np.float32), np.ndarray[Any, np.dtype[Any]])
    assert_type(sc.zeros((2, 3)), np.ndarray[Any, np.dtype[Any]])


def works(w: sc.Work) -> None:
    assert_type(w.wait(), bool)
    assert_type(w.wait(timeout=1.5), bool)
    assert_type(w.result(), list[Any])
    assert_type(w.is_completed(), bool)
    assert_type(w.is_success(), bool)
    assert_type(w.exception(), BaseException | None)
    assert_type(w.get_future(), sc.Future[list[Any]])
    assert_type(w.source_rank(), int)
    assert_type(w.abort(), None)


def futures(f: sc.Future[int], g: sc.Future[str], w: sc.Work) -> None:
    assert_type(f.wait(), int)
    assert_type(f.wait(timeout=2.0), int)
    assert_type(f.value(), int)
    assert_type(f.done(), bool)
    assert_type(f.then(lambda fut: str(fut.value())), sc.Future[str])
    assert_type(f.set_result(3), None)
    assert_type(f.add_done_callback(print), None)
    assert_type(sc.Future[float](), sc.Future[float])
    assert_type(sc.wait_all([f, f]), list[int])
    assert_type(sc.wait_all([f, g, w]), list[Any])
    assert_type(sc.collect_all([f]), sc.Future[list[sc.Future[int]]])
    assert_type(sc.wait_any([f, w], timeout=1.0), int)


async def awaiting(f: sc.Future[int]) -> None:
    assert_type(await f, int)


def groups() -> None:
    pg = sc.init_process_group(rank=0, world_size=2, name="job", timeout=10.0)
    assert_type(pg, sc.ProcessGroup)
    assert_type(pg.rank, int)
    assert_type(pg.size, int)
    assert_type(sc.is_initialized(), bool)
    assert_type(sc.get_rank(), int)
    assert_type(sc.get_world_size(pg), int)
    assert_type(sc.new_group([0, 1]), sc.ProcessGroup | None)
    assert_type(sc.split(color=0, key=1), sc.ProcessGroup | None)
    mine, every = sc.new_subgroups(2)
    assert_type(mine, sc.ProcessGroup)
    assert_type(every, list[sc.ProcessGroup | None])
    assert_type(sc.destroy_process_group(), None)


def _rank_fn(rank: int, n: int) -> float:
    return float(rank * n)


def launching() -> None:
    assert_type(sc.spawn(_rank_fn, 2), list[Any])
    assert_type(sc.spawn(_rank_fn, 2, args=(), timeout=30.0), list[Any])
    assert_type(sc.get_pickler(), sc.pickling.Pickler)


def remote_calls() -> None:
    rpc.init_rpc("worker0", rank=0, world_size=2)
    assert_type(rpc.rpc_sync("worker1", _rank_fn, args=(1, 2)), float)
    assert_type(rpc.rpc_async(1, _rank_fn, args=(1, 2)), sc.Future[float])
    assert_type(rpc.remote("worker1", _rank_fn, args=(1, 2)), rpc.RRef)
    assert_type(rpc.get_worker_info(), rpc.WorkerInfo)
    assert_type(rpc.shutdown(), None)


def errors(x: F32, f: sc.Future[int], pg: sc.ProcessGroup) -> None:
    # Each line must stay a type error of exactly this code (else: "unused type: ignore").
    sc.all_reduce([1.0, 2.0])  # type: ignore[call-overload]
    sc.all_reduce(x, op=1.5)  # type: ignore[call-overload]
    sc.all_reduce(x, group=3)  # type: ignore[call-overload]
    sc.all_reduce(x, async_op=True).wait(timeout="1")  # type: ignore[arg-type]
    sc.all_reduce(x).wait()  # type: ignore[attr-defined]
    pg.broadcast(x)  # type: ignore[call-overload]
    sc.recv(x, src="0")  # type: ignore[arg-type]
    sc.send(x, dst=1, async_op=True)  # type: ignore[call-arg]
    sc.all_to_all_single(x, x, output_split_sizes=3)  # type: ignore[call-overload]
    s: str = f.wait()  # type: ignore[assignment]
    f.set_exception("bad")  # type: ignore[arg-type]
    sc.spawn(_rank_fn, "2")  # type: ignore[arg-type]
    sc.not_a_function()  # type: ignore[attr-defined]
    del s
