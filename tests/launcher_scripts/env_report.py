"""Print this rank's launcher environment and arguments as one JSON line."""
import json
import os
import sys

KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SHMCOMM_JOB", "OMP_NUM_THREADS",
        "PYTHONUNBUFFERED", "THP_MEM_ALLOC_ENABLE"]

report = {k: os.environ.get(k) for k in KEYS}
report["argv"] = sys.argv[1:]
report["executable"] = sys.executable
report["affinity"] = sorted(os.sched_getaffinity(0))
print(json.dumps(report))
print(f"rank {report['RANK']} on stderr", file=sys.stderr)
