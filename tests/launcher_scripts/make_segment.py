"""Leave a file in /dev/shm named like a segment of this job, as a rank that crashed would."""
import os

from shmcomm.segments import SHM_DIR, segment_name

path = os.path.join(SHM_DIR, segment_name(os.environ["SHMCOMM_JOB"], f"test{os.environ['RANK']}").lstrip("/"))
with open(path, "wb") as f:
    f.write(b"\0" * 64)
print(path)
