"""Start ranks with multiprocessing, passing rank, world size and job explicitly, as a user
without a launcher would: ``python by_multiprocessing.py spawn|fork N JOB``. This process never
imports shmcomm, so its ranks share no secret (each makes its own up)."""
import multiprocessing as mp
import os
import sys


def rank_main(rank: int, size: int, job: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import features
    import shmcomm as sc

    line = features.main(rank, size, job)
    sc.destroy_process_group()
    print(line, flush=True)


if __name__ == "__main__":
    method, size, job = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ctx = mp.get_context(method)
    procs = [ctx.Process(target=rank_main, args=(r, size, job)) for r in range(size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(abs(p.exitcode or 0) for p in procs))
