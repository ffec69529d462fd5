#!/usr/bin/env python3
"""Wall and CPU time of a command and of every process it starts, including those that outlive
their parent (a test's Kafka broker JVM is started in the background and stopped by another
process: /usr/bin/time alone never sees its CPU time).

    bench/cputime.py [-o FILE] COMMAND [ARG...]

Becomes a child subreaper (Linux prctl PR_SET_CHILD_SUBREAPER), so orphaned descendants are
re-parented to it; runs COMMAND, then waits for every remaining descendant, and prints one line

    cputime: wall W s, user U s, sys S s, cpu U+S s (cpu/wall R), exit RC

on stderr (and to FILE when given). Exits with COMMAND's exit status. A descendant that never
exits keeps this waiting: the command must clean up after itself (the tests' servers do).
"""
import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(argv):
    out = None
    if len(argv) >= 2 and argv[0] == "-o":
        out, argv = argv[1], argv[2:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"cputime: prctl: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    rc = subprocess.call(argv)
    # the descendants re-parented to us: reap them all (their rusage joins RUSAGE_CHILDREN)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
    wall = time.monotonic() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime
    line = (f"cputime: wall {wall:.1f} s, user {ru.ru_utime:.1f} s, sys {ru.ru_stime:.1f} s, "
            f"cpu {cpu:.1f} s (cpu/wall {cpu / wall:.2f}), exit {rc}")
    print(line, file=sys.stderr)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
