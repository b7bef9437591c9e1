"""Rank 0 writes half a line, stalls 0.4 s (longer than a terminal's hold, shorter than a
pipe's), then ends it; rank 1 prints short lines all the while."""
import sys
import time

from _common import rank

out = sys.stdout.buffer
if rank() == 0:
    time.sleep(0.1)  # rank 1 is printing by now
    out.write(b"first half, ")
    out.flush()
    time.sleep(0.4)
    out.write(b"second half\n")
    out.flush()
else:
    for i in range(60):
        out.write(b"tick %d\n" % i)
        out.flush()
        time.sleep(0.01)
