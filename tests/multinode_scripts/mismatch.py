"""Ranks on different nodes call different collectives (run on 2 x 2 nodes by
tests/test_multinode.py, under torchrun on simulated nodes, and tests/test_mpi_link.py, under
mpirun): ``python mismatch.py [MODE ...]`` (default: every mode, one after another in one job).
In each mode some ranks call something else than the others; every rank must raise
CollectiveMismatchError naming what differed (checked here, on every rank), never crash, hang or
return; the group stays usable, which a correct all_reduce after each mode checks. Prints one
line per rank and mode, then ``rank R mismatch ok: N modes`` once every mode went as it should."""
import sys

import numpy as np

import shmcomm as sc

def x():
    return np.ones(4, np.float32)


# mode: (what rank r of node `node` calls (`last`: the last rank), what every rank's error says)
MODES = {
    # node 1 calls another size, dtype (the same bytes) or collective than node 0
    "sizes": (lambda node, last: sc.all_reduce(np.ones(4 if node == 0 else 8, np.float32)),
              "differ in nbytes"),
    "dtypes": (lambda node, last: sc.all_reduce(np.ones(4, np.float32 if node == 0 else np.int32)),
               "differ in dtype"),
    "kinds": (lambda node, last: sc.all_reduce(x()) if node == 0 else sc.broadcast(x(), src=0),
              "broadcast(dtype=float32, nbytes=16, root=0)"),
    # the same link calls on both nodes (reduce is an all_reduce that dst keeps): before, every
    # rank returned without an error
    "reduce": (lambda node, last: sc.all_reduce(x()) if node == 0 else sc.reduce(x(), dst=0),
               "reduce(dtype=float32, nbytes=16, op=SUM, root=0)"),
    # roots of different local ranks: each node crosses along another rail (before: both waited
    # the whole timeout and raised gloo's RuntimeError)
    "roots": (lambda node, last: sc.broadcast(x(), src=0 if node == 0 else 1), "differ in root"),
    # 8 MiB crosses by shards on every rail, 2 MiB by the leaders alone (before: as "roots")
    "paths": (lambda node, last: sc.all_reduce(np.ones((1 << 21) if node == 0 else (1 << 19), np.float32)),
              "all_reduce(dtype=float32, nbytes=8388608, op=SUM)"),
    # the last rank, which crosses no link on 2 x 2 (local rank 1), differs from its node peer
    "one rank": (lambda node, last: sc.reduce(x(), dst=0) if last else sc.all_reduce(x()),
                 "reduce(dtype=float32, nbytes=16, op=SUM, root=0)"),
}

pg = sc.init_process_group(timeout=60.0)
rank, size = pg.rank, pg.size
node = pg.topology.node_of[rank]
wrong = []
for mode in sys.argv[1:] or MODES:
    call, says = MODES[mode]
    try:
        call(node, rank == size - 1)
        outcome = "returned"
    except sc.ShmcommError as exc:
        outcome = f"raised {type(exc).__name__}: " + str(exc).replace("\n", " | ")
    print(f"rank {rank} mode {mode} {outcome}", flush=True)
    if not (outcome.startswith("raised CollectiveMismatchError") and says in outcome):
        wrong.append(mode)
    y = np.ones(2, np.float32)
    sc.all_reduce(y)  # still usable
    assert y.tolist() == [size, size], y
modes = len(sys.argv[1:] or MODES)
print(f"rank {rank} mismatch {'wrong in ' + ', '.join(wrong) if wrong else 'ok'}: {modes} modes", flush=True)
sc.destroy_process_group()
