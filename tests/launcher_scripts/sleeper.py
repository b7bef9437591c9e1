"""Each rank starts two children (one in its own session, as a daemon would), records every pid
in PID_DIR, then sleeps: the test signals the launcher and checks that none of them survive."""
import os
import subprocess
import sys
import time

from _common import rank, write_pid

pid_dir = sys.argv[1]
child = subprocess.Popen(["sleep", "60"])
daemon = subprocess.Popen(["sleep", "61"], start_new_session=True)
write_pid(pid_dir, f"child{rank()}", child.pid)
write_pid(pid_dir, f"daemon{rank()}", daemon.pid)
write_pid(pid_dir, f"rank{rank()}", os.getpid())
print("ready", flush=True)
time.sleep(60)
