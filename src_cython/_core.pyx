# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled core of shmcomm: shared segments, waits, reduce kernels, collectives and Futures.

The module is one extension built from the files included below, one concept per file (as
mpi4py does). The pure-Python package ``shmcomm`` is the public face; nothing here is meant to be
imported directly except through it.
"""
import enum
import errno as errno_mod
import os
import socket
import sys
import threading
import time
import weakref

import numpy as np

from libc.stdint cimport UINT64_MAX, int64_t, uint32_t, uint64_t, uintptr_t
cimport capi
from capi cimport *

include "errors.pxi"
include "future.pxi"
include "segment.pxi"
include "buffers.pxi"
include "kernels.pxi"
include "settings.pxi"
include "calls.pxi"
include "registry.pxi"
include "tuning.pxi"
include "engine.pxi"
include "layout.pxi"
include "joining.pxi"
include "waits.pxi"
include "leases.pxi"
include "queue.pxi"
include "heap.pxi"
include "work.pxi"
include "coll/pieces.pxi"
include "coll/uneven.pxi"
include "coll/reduce.pxi"
include "coll/broadcast.pxi"
include "coll/gather.pxi"
include "coll/scatter.pxi"
include "coll/reduce_scatter.pxi"
include "coll/all_to_all.pxi"
include "coll/barrier.pxi"
include "coll/scan.pxi"
include "p2p.pxi"
include "p2p_transfer.pxi"
include "group_core.pxi"
include "torch_entry.pxi"
include "rpc_frame.pxi"
include "rpc_channel.pxi"
