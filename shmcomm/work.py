"""``shmcomm.Work``: the handle of an async operation (compiled in ``shmcomm._core``).

Operations on one group run in issue order through the group's progress engine (see
``src_cython/engine.pxi``): ``Work.wait`` drives the queue on the waiting thread up to its op,
and a background thread runs ops that nobody waits for.
"""

from shmcomm._core import Work

__all__ = ["Work"]
