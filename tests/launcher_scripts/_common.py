"""Helpers shared by the launcher test scripts (run as ranks under shmrun)."""
import os


def rank() -> int:
    """This rank's number, from the launcher's environment."""
    return int(os.environ["RANK"])


def write_pid(pid_dir: str, name: str, pid: int) -> None:
    """Record ``pid`` as ``pid_dir/name`` atomically, so the test never reads half a file."""
    tmp = os.path.join(pid_dir, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(str(pid))
    os.replace(tmp, os.path.join(pid_dir, name))
