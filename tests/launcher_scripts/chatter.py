"""Print COUNT long lines as fast as possible, each made only of this rank's digit, to stdout
(and every tenth to stderr), written in pieces so lines cross pipe-buffer boundaries."""
import os
import sys

from _common import rank

count, width = int(sys.argv[1]), int(sys.argv[2])
digit = str(rank() % 10)
out = sys.stdout.buffer
for i in range(count):
    line = f"{i}:".encode() + digit.encode() * width
    out.write(line[: width // 2])
    out.write(line[width // 2:] + b"\n")
    if i % 10 == 0:
        sys.stderr.write(f"{i}:" + digit * 100 + "\n")
out.flush()
os.write(1, b"no-newline-" + digit.encode())  # a final partial line must still come out whole
