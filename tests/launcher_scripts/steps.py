"""Run this rank's steps, in order, so a test can drive the ranks' output one write at a time.

Usage: steps.py SYNC_DIR STEP...   where each STEP is RANK/ACTION:ARG, done only by that rank:
    out:TEXT    write TEXT (Python escapes such as \\r and \\n allowed) to stdout, unbuffered
    err:TEXT    the same on stderr
    wait:NAME   wait until the file SYNC_DIR/NAME exists (the test or a touch step creates it);
                exit 3 after 20 s
    touch:NAME  create the file SYNC_DIR/NAME (another rank's wait step goes on)
    dots:NAME   write "." to stdout every 30 ms until the file SYNC_DIR/NAME exists
    input:TEXT  input(TEXT) (the prompt goes to stdout), then print "got <answer>"
    exit:CODE   exit with CODE
"""
import codecs
import os
import sys
import time

from _common import rank

sync_dir = sys.argv[1]
for step in sys.argv[2:]:
    who, _, rest = step.partition("/")
    if int(who) != rank():
        continue
    action, _, arg = rest.partition(":")
    if action in ("out", "err"):
        os.write(1 if action == "out" else 2, codecs.decode(arg, "unicode_escape").encode())
    elif action == "wait":
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(sync_dir, arg)):
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.02)
    elif action == "touch":
        open(os.path.join(sync_dir, arg), "w").close()
    elif action == "dots":
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(sync_dir, arg)) and time.monotonic() < deadline:
            os.write(1, b".")
            time.sleep(0.03)
    elif action == "input":
        print("got", input(arg))
    elif action == "exit":
        sys.exit(int(arg))
    else:
        raise SystemExit(f"unknown step {step!r}")
