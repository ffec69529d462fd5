"""What a benchmark records about where and on what it ran: the CPU model, the checkout's
revision and how much of the CPUs other processes took. Imported by bench/bench_worker.py,
bench/fleet_bench.py and bench/run.py (python puts a script's folder on sys.path)."""
import os
import platform
import resource
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model():
    """The "model name" of /proc/cpuinfo, else platform.processor(), else "unknown"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_rev():
    """The checkout's short HEAD, "+dirty" when tracked files differ from it; "unknown" outside a
    checkout or without git."""
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True,
                             capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               text=True, capture_output=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_snapshot():
    """(wall s, CPU-s the whole machine spent busy or stolen by the hypervisor since boot, CPU-s of
    this process and its waited-for children) for others_cpus; None for the machine's figure when
    /proc/stat cannot be read."""
    hz = os.sysconf("SC_CLK_TCK")
    busy = None
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal ...: all but idle and iowait
        busy = (sum(v[:8]) - v[3] - v[4]) / hz
    except (OSError, ValueError, IndexError):
        pass
    own = sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    return time.monotonic(), busy, own


def others_cpus(s0, s1):
    """CPUs (average over s0..s1, snapshots of cpu_snapshot) that other processes and the
    hypervisor's steal took: the machine's busy CPU time less this process tree's, over the wall
    time; None when unknown. Children still running at s1 are not in this process tree's figure
    (count as others)."""
    if s0[1] is None or s1[1] is None or s1[0] <= s0[0]:
        return None
    return max(0.0, ((s1[1] - s0[1]) - (s1[2] - s0[2])) / (s1[0] - s0[0]))
