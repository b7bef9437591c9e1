"""What travels between agents: the kind of each frame, and the private copies a call to this
same process gets of its buffers.

A frame on a lane is ``(src, kind, rid, flags, data, bufs)``: the sender's rank, one of the kinds
below, the call's id, the serialization flags, the pickle and its out-of-band buffers. Requests go
on the agent's request lane, replies (``KIND_OK``, ``KIND_ERR``) on its reply lane::

    frame = (0, KIND_REQUEST, 7, flags, data, bufs)   # rank 0 asks; the reply carries rid 7
"""

from __future__ import annotations

import numpy as np

__all__ = ["KIND_REQUEST", "KIND_ONEWAY", "KIND_OK", "KIND_ERR"]

KIND_REQUEST = 1   # run (func, args, kwargs) and reply
KIND_ONEWAY = 2    # run it, no reply (reference counting notes)
KIND_OK = 3        # reply: the pickled return value
KIND_ERR = 4       # reply: a packed exception


def _copies(bufs: list) -> list:
    """Private copies of out-of-band buffers for a call to this same process (value semantics)."""
    return [np.frombuffer(b, np.uint8).copy() for b in bufs]
