"""rounds.py BOOTSTRAP TOPIC N [ROUNDS]: the Kafka readers' CPU, one reader after another, many
rounds, so that each round meets the same moment of the machine and the broker. A bench run
pairs each reader with the loop once per run, and on a shared VM one reader's CPU moves by a
fifth or more between runs; a median over rounds, and each round's own ratio, move less.

Readers: the loop that reads every header, the leanest export, dlqctl export and summarize,
output discarded, on a topic already holding N records (the bench's letters). Each runs under
`perf stat -e task-clock`, itself under wait4, so every run gives both clocks: rusage (user +
sys, what the bench reports; it leaves out time the hypervisor gave to other guests) and
task-clock (which counts that time as the reader's), with the steal ticks /proc/stat counted
during the run. The rusage includes perf's own CPU, 15 to 20 ms, on every reader alike.
Run from the repository root with the release build and its examples built."""
import os, statistics, subprocess, sys, tempfile

bootstrap, topic, n = sys.argv[1:4]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 8
target = f"kafka://{bootstrap}/{topic}"
readers = {
    "loop with headers": ["target/release/examples/ceiling", "kafka-read", bootstrap, topic, n, "+HEADERS"],
    "leanest export": ["target/release/examples/ceiling", "kafka-export", bootstrap, topic, n],
    "dlqctl export": ["target/release/dlqctl", "export", target, "-q", "--from-beginning"],
    "dlqctl summarize": ["target/release/dlqctl", "summarize", target, "-q", "--from-beginning", "--by", "reason"],
}


def steal_ticks():
    return int(open("/proc/stat").readline().split()[8])


def run(command):
    with tempfile.NamedTemporaryFile("r") as counts:
        before = steal_ticks()
        child = subprocess.Popen(["perf", "stat", "-x,", "-e", "task-clock", "-o", counts.name, *command],
                                 stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"rounds.py: {command[0]} failed")
        task_clock = next(float(line.split(",")[0]) for line in counts.read().splitlines() if "task-clock" in line)
    return {"rusage": usage.ru_utime + usage.ru_stime, "task-clock": task_clock / 1000, "steal": steal_ticks() - before}


runs = {name: [] for name in readers}
for r in range(rounds):
    for name, command in readers.items():
        runs[name].append(run(command))
    print(f"rounds.py: round {r + 1} of {rounds}", file=sys.stderr)

loop = runs["loop with headers"]
for clock in ("rusage", "task-clock"):
    print(f"\n{clock}, ms of CPU, median over {rounds} rounds (ratio to the loop; per round: median, range)")
    for name, results in runs.items():
        cpu = statistics.median(x[clock] for x in results)
        line = f"  {name:18} {cpu * 1000:8.1f}"
        if results is not loop:
            ratios = sorted(x[clock] / l[clock] for x, l in zip(results, loop))
            line += (f"  ({cpu / statistics.median(x[clock] for x in loop):.2f}x;"
                     f" {statistics.median(ratios):.2f}x, {ratios[0]:.2f}x to {ratios[-1]:.2f}x)")
        print(line)
print("\ntask-clock over rusage (ms) by steal ticks during the run:")
for x in sorted((x for results in runs.values() for x in results), key=lambda x: x["steal"]):
    print(f"  {x['steal']:4}  {(x['task-clock'] - x['rusage']) * 1000:7.1f}")
