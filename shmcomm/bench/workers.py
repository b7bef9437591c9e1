"""Worker side, one class per backend (shmcomm, torch.distributed gloo, mpi4py under Open MPI or
MPICH and under Intel MPI, DeepSpeed's all_reduce op): each wraps its
library's API into the timed calls and the object exchanges the sweep needs, and says which
variants (out-of-place, in-place) its API has, and why not where it lacks one."""

from __future__ import annotations

import os

import numpy as np

from .peers import start_deepspeed
from .cases import reduce_op


class _Worker:
    """One rank of one backend: what the sweep needs from it. Subclasses fill in the API calls."""

    name = ""
    api_name = ""  # whose API, in the reasons for a missing variant
    # collective -> (variant the API lacks, why): the table shows "-" there and this reason.
    lacks = {"send_recv": ("in-place", "send_recv is timed between two buffers (a ping-pong)"),
             "barrier": ("in-place", "barrier moves no data")}

    rank = 0
    size = 1

    def alloc(self, count: int, dtype: np.dtype) -> np.ndarray:
        """A 1-D buffer the backend's calls accept; every rank allocates the same ones in order."""
        return np.empty(count, dtype)

    def make_call(self, case, variant: str, send, recv, chunk: int, dt):
        """The timed call: a closure running ``case`` (a ``cases.Case``) on numpy buffers
        ``send``/``recv`` of ``dt`` (the same or overlapping arrays for in-place), ``chunk``
        elements per rank."""
        raise NotImplementedError

    def versions(self) -> dict:
        """Versions worth printing in the table header."""
        return {}

    def barrier(self) -> None:
        """Synchronise the ranks (outside any timed region)."""
        raise NotImplementedError

    def bcast_obj(self, obj):
        """Rank 0's ``obj`` on every rank (the iteration plan)."""
        raise NotImplementedError

    def gather_obj(self, obj):
        """Every rank's ``obj`` as a list on rank 0 (None elsewhere)."""
        raise NotImplementedError

    def close(self) -> None:
        """Leave the group; for shmcomm this releases the shared memory."""

    @classmethod
    def missing(cls, collective: str, variant: str) -> str | None:
        """Why the library's API has no ``variant`` of ``collective`` (None if it has one).

        Example::

            >>> _ShmcommWorker.missing("all_reduce", "out-of-place")
            "all_reduce is in place only in shmcomm's API (one array is input and output)"
        """
        lacked, why = cls.lacks.get(collective, (None, ""))
        return why if lacked == variant else None

    def rs_inplace_block(self) -> int:
        """Which block of the input an in-place reduce_scatter leaves its result in."""
        return self.rank

    def _ping_pong(self, send, recv, send_fn, recv_fn):
        """Rank 0 sends to rank 1 and waits for the echo; other ranks idle."""
        if self.rank == 0:
            def call():
                send_fn(send, 1)
                recv_fn(recv, 1)
        elif self.rank == 1:
            def call():  # echo what arrived, so rank 0 can check the round trip too
                recv_fn(recv, 0)
                send_fn(recv, 0)
        else:
            def call():
                pass
        return call


def _in_place_only(api_name: str) -> dict:
    return {c: ("out-of-place", f"{c} is in place only in {api_name} (one array is input and output)")
            for c in ("all_reduce", "broadcast", "reduce", "scan")}


class _TorchLikeWorker(_Worker):
    """shmcomm and torch.distributed: same call shapes, different module and buffer wrapper."""

    api = None

    def wrap(self, array: np.ndarray, dt):
        """The object the library's calls take for ``array`` of ``dt``, sharing its memory."""
        return array

    def make_call(self, case, variant, send, recv, chunk, dt):
        api, r, n = self.api, self.rank, self.size
        collective, root = case.collective, case.root
        op = self.reduce_op(case.op) if case.op != "none" else None
        w = lambda a: self.wrap(a, dt)  # noqa: E731
        if collective == "all_reduce":
            buf = w(recv)
            return lambda: api.all_reduce(buf, op=op)
        if collective == "broadcast":
            buf = w(recv)
            return lambda: api.broadcast(buf, src=root)
        if collective == "reduce":
            buf = w(recv)
            return lambda: api.reduce(buf, dst=root, op=op)
        if collective == "all_gather":
            out, inp, fn = w(recv), w(send), self.all_gather_into
            return lambda: fn(out, inp)
        if collective == "gather":
            inp = w(send)
            parts = [w(recv[q * chunk:(q + 1) * chunk]) for q in range(n)] if r == root else None
            return lambda: api.gather(inp, gather_list=parts, dst=root)
        if collective == "scatter":
            out = w(recv)
            parts = [w(send[q * chunk:(q + 1) * chunk]) for q in range(n)] if r == root else None
            return lambda: api.scatter(out, scatter_list=parts, src=root)
        if collective == "reduce_scatter":
            out, inp, fn = w(recv), w(send), self.reduce_scatter_into
            return lambda: fn(out, inp, op=op)
        if collective == "all_to_all":
            out, inp = w(recv), w(send)
            return lambda: api.all_to_all_single(out, inp)
        if collective == "send_recv":
            return self._ping_pong(w(send), w(recv), lambda b, d: api.send(b, d), lambda b, s: api.recv(b, s))
        if collective == "barrier":
            return api.barrier
        if collective == "scan":
            buf = w(recv)
            return lambda: api.scan(buf, op=op)
        raise ValueError(collective)

    # Both modules spell these the same way.
    def barrier(self):
        self.api.barrier()

    def bcast_obj(self, obj):
        box = [obj]
        self.api.broadcast_object_list(box, src=0)
        return box[0]

    def gather_obj(self, obj):
        out = [None] * self.size if self.rank == 0 else None
        self.api.gather_object(obj, out, dst=0)
        return out

    def close(self):
        self.api.destroy_process_group()


class _ShmcommWorker(_TorchLikeWorker):
    name = "shmcomm"

    api_name = "shmcomm's API"
    lacks = {**_Worker.lacks, **_in_place_only(api_name)}  # all_to_all_single(out, out) is in place here

    def __init__(self, cfg: dict):
        import shmcomm as sc

        self.api = sc
        self.rank, self.size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        sc.init_process_group(rank=self.rank, world_size=self.size, name=os.environ["SHMCOMM_JOB"],
                              timeout=float(cfg["timeout"]))
        self.reduce_op = reduce_op
        self.zero_copy = bool(cfg["zero_copy"])
        self.all_gather_into = sc.all_gather_into
        self.reduce_scatter_into = sc.reduce_scatter_into

    def wrap(self, array, dt):
        if dt.bits16:  # bfloat16 without ml_dtypes: a torch bfloat16 view, which shmcomm accepts
            import torch

            return torch.from_numpy(array).view(torch.bfloat16)
        return array

    def alloc(self, count, dtype):
        # sc.empty is collective: every rank allocates the same buffers in the same order.
        return self.api.empty(count, dtype) if self.zero_copy else np.empty(count, dtype)

    def versions(self) -> dict:
        return {"shmcomm": self.api.__version__}


class _GlooWorker(_TorchLikeWorker):
    name = "gloo"
    api_name = "torch.distributed's API"
    lacks = {**_Worker.lacks, **_in_place_only(api_name),
             "all_to_all": ("in-place", "torch.distributed's all_to_all_single has no in-place form")}

    def __init__(self, cfg: dict):
        import warnings
        from datetime import timedelta

        # torch deprecates names across releases; the warnings would only clutter the output
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        import torch
        import torch.distributed as dist

        self.torch, self.api = torch, dist
        dist.init_process_group("gloo", init_method="env://",
                                timeout=timedelta(seconds=float(cfg["timeout"])))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.reduce_op = lambda name: getattr(dist.ReduceOp, reduce_op(name).name)
        self.all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.reduce_scatter_into = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def wrap(self, array, dt):
        # The tensor shares the numpy array's memory, so fills and checks work on the array.
        if dt.name == "bfloat16":
            return self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(array)

    def versions(self) -> dict:
        return {"torch": self.torch.__version__}


class _MpiWorker(_Worker):
    name = "mpi"
    api_name = "MPI"
    lacks = {**_Worker.lacks, "broadcast": ("out-of-place", "MPI's Bcast is in place only (one buffer)")}

    def __init__(self, cfg: dict):
        import mpi4py
        from mpi4py import MPI

        self.mpi4py, self.MPI = mpi4py, MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        if self.size != cfg["nranks"]:
            # mpi4py loaded another MPI than the launcher's: each process is a world of its own
            raise RuntimeError(f"MPI world size is {self.size}, expected {cfg['nranks']}: mpi4py loaded "
                               f"{MPI.Get_library_version().splitlines()[0]!r}, not the MPI of the "
                               "launcher (MPI4PY_LIBMPI names the library to load)")
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "band": MPI.BAND,
                    "bor": MPI.BOR, "bxor": MPI.BXOR}

    def rs_inplace_block(self) -> int:
        return 0  # MPI_IN_PLACE Reduce_scatter_block leaves the result at the start of the buffer

    def make_call(self, case, variant, send, recv, chunk, dt):
        collective, root = case.collective, case.root
        op = self.ops[case.op] if case.op != "none" else None
        c, MPI, r, ip = self.comm, self.MPI, self.rank, variant == "in-place"
        IN_PLACE = MPI.IN_PLACE
        if collective == "all_reduce":
            return (lambda: c.Allreduce(IN_PLACE, recv, op)) if ip else (lambda: c.Allreduce(send, recv, op))
        if collective == "broadcast":
            return lambda: c.Bcast(recv, root)
        if collective == "reduce":
            if not ip:
                out = recv if r == root else None
                return lambda: c.Reduce(send, out, op, root)
            if r == root:
                return lambda: c.Reduce(IN_PLACE, recv, op, root)
            return lambda: c.Reduce(recv, None, op, root)
        if collective == "all_gather":
            return (lambda: c.Allgather(IN_PLACE, recv)) if ip else (lambda: c.Allgather(send, recv))
        if collective == "gather":
            if ip and r == root:
                return lambda: c.Gather(IN_PLACE, recv, root)
            out = recv if r == root else None
            return lambda: c.Gather(send, out, root)
        if collective == "scatter":
            if ip and r == root:
                return lambda: c.Scatter(send, IN_PLACE, root)
            src = send if r == root else None
            return lambda: c.Scatter(src, recv, root)
        if collective == "reduce_scatter":
            if ip:
                return lambda: c.Reduce_scatter_block(IN_PLACE, send, op)
            return lambda: c.Reduce_scatter_block(send, recv, op)
        if collective == "all_to_all":
            return (lambda: c.Alltoall(IN_PLACE, recv)) if ip else (lambda: c.Alltoall(send, recv))
        if collective == "send_recv":
            return self._ping_pong(send, recv, lambda b, d: c.Send(b, d), lambda b, s: c.Recv(b, s))
        if collective == "barrier":
            return c.Barrier
        if collective == "scan":
            return (lambda: c.Scan(IN_PLACE, recv, op)) if ip else (lambda: c.Scan(send, recv, op))
        raise ValueError(collective)

    def versions(self) -> dict:
        # The library string is long, multi-line and NUL-padded; its first field names it.
        library = self.MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]
        return {"mpi4py": self.mpi4py.__version__, "mpi": library.split(",")[0].strip()}

    def barrier(self):
        self.comm.Barrier()

    def bcast_obj(self, obj):
        return self.comm.bcast(obj, root=0)

    def gather_obj(self, obj):
        return self.comm.gather(obj, root=0)

    def close(self):
        pass  # mpi4py finalizes MPI at exit


class _IntelMpiWorker(_MpiWorker):
    """mpi4py on Intel MPI (started by its own mpiexec, which loads its libmpi: runner.py)."""

    name = "impi"


class _DeepSpeedWorker(_GlooWorker):
    """DeepSpeed's shared-memory all_reduce (``torch.ops.deepspeed.inference_all_reduce_``), the op
    DeepSpeed's CPU inference calls; everything around it (barriers, object exchange) on gloo."""

    name = "deepspeed"
    api_name = "DeepSpeed's op"
    lacks = {**_GlooWorker.lacks, **_in_place_only(api_name)}

    def __init__(self, cfg: dict):
        super().__init__(cfg)
        why = start_deepspeed(self.size)
        if why:
            raise RuntimeError(why)

    def make_call(self, case, variant, send, recv, chunk, dt):
        if case.collective != "all_reduce":  # cases.peer_skip keeps the others away
            raise ValueError(f"DeepSpeed's op has no {case.collective}")
        op, buf = self.torch.ops.deepspeed.inference_all_reduce_, self.wrap(recv, dt)
        return lambda: op(buf)

    def versions(self) -> dict:
        import deepspeed

        return {"deepspeed": deepspeed.__version__, "torch": self.torch.__version__}


_WORKERS = {"shmcomm": _ShmcommWorker, "gloo": _GlooWorker, "mpi": _MpiWorker, "impi": _IntelMpiWorker,
            "deepspeed": _DeepSpeedWorker}
