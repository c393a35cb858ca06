"""timed.py OUT COMMAND...: runs COMMAND (its output discarded) and writes to OUT the line
"wall user sys maxrss_kb", as `/usr/bin/time -f "%e %U %S %M"` would, but with CPU time kept
to the microsecond: GNU time truncates user and sys to 10 ms each, which on a 0.35 s run is a
3% error and always downwards, so it inflated every ratio whose smaller side was a short run.

COMMAND still runs under /usr/bin/time, for its peak RSS: a child started from Python starts
as a copy of Python (vfork or fork), and the kernel keeps that copy's RSS, about 14 MB, as the
child's peak. CPU is the rusage of /usr/bin/time and COMMAND together, as wait4 gives it;
/usr/bin/time's own share is one to two milliseconds (`timed.py OUT true` measures 2 to 3 ms
in all), the same on every line."""
import os, subprocess, sys, tempfile, time

out, command = sys.argv[1], sys.argv[2:]
with tempfile.NamedTemporaryFile("r") as peak:
    started = time.perf_counter()
    child = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", peak.name, *command], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    maxrss = peak.read().split()[-1]
code = os.waitstatus_to_exitcode(status)
if code != 0:
    print(f"timed.py: {command[0]} exited with {code}", file=sys.stderr)
    sys.exit(1)
with open(out, "w") as f:
    f.write(f"{wall:.3f} {usage.ru_utime:.6f} {usage.ru_stime:.6f} {maxrss}\n")
