"""timed.py OUT COMMAND...: runs COMMAND (its output discarded) and writes to OUT the line
"wall user sys maxrss_kb", as `/usr/bin/time -f "%e %U %S %M"` would. The figures are the same
ones (the child's rusage from wait4), but CPU time is kept to the microsecond: GNU time
truncates user and sys to 10 ms each, which on a 0.35 s run is a 3% error and always
downwards, so it inflated every ratio whose smaller side was a short run."""
import os, subprocess, sys, time

out, command = sys.argv[1], sys.argv[2:]
started = time.perf_counter()
child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
wall = time.perf_counter() - started
with open(out, "w") as f:
    f.write(f"{wall:.3f} {usage.ru_utime:.6f} {usage.ru_stime:.6f} {usage.ru_maxrss}\n")
code = os.waitstatus_to_exitcode(status)
if code != 0:
    print(f"timed.py: {command[0]} exited with {code}", file=sys.stderr)
    sys.exit(1)
