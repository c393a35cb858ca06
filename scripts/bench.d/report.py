"""Medians of timed.py lines ("label wall user sys maxrss_kb messages"), as a Markdown table
with messages/s, CPU seconds and peak RSS, then dlqctl's ratios to the broker's ceiling and to
the peer script. Labels are WHO_JOB_BROKER: ceiling_read, ceiling_move, peer_export, lean_export,
dlqctl_*."""
import collections, statistics, sys

runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, wall, user, sys_, rss, n = line.split()
    runs[label].append((float(wall), float(user) + float(sys_), int(rss), int(n)))
rows = {}
print("| measurement | runs | messages | wall (s) | msg/s | CPU (s) | CPU µs/msg | peak RSS (MB) |")
print("|---|---|---|---|---|---|---|---|")
for label, rs in runs.items():
    wall = statistics.median(r[0] for r in rs)
    cpu = statistics.median(r[1] for r in rs)
    rss = statistics.median(r[2] for r in rs) / 1024
    n = rs[0][3]
    rate = n / wall if wall else 0
    rows[label] = (rate, cpu / max(n, 1))
    print(f"| {label.replace('_', ' ')} | {len(rs)} | {n} | {wall:.2f} | {rate:,.0f} | {cpu:.3f} "
          f"| {1e6 * cpu / max(n, 1):.1f} | {rss:.1f} |")
print()


def compare(label, other, what):
    if other not in rows:
        return ""
    rate, cpu = rows[label]
    orate, ocpu = rows[other]
    return f"{rate / orate:.2f}x the {what}'s throughput at {cpu / ocpu if ocpu else 0:.2f}x its CPU per message"


for label in rows:
    if not label.startswith("dlqctl_"):
        continue
    _, job, broker = label.split("_", 2)
    if broker == "archive":
        continue
    ceiling = f"ceiling_{'move' if job == 'redrive' else 'read'}_{broker}"
    parts = [compare(label, ceiling, "ceiling")]
    if job != "redrive":
        parts.append(compare(label, f"peer_export_{broker}", "peer"))
        parts.append(compare(label, f"{ceiling}_with_headers", "ceiling-reading-headers"))
    if job == "export":
        parts.append(compare(label, f"lean_export_{broker}", "leanest export"))
    else:
        parts.append(compare(label, f"{ceiling}_with_id", "ceiling-with-redrive-headers"))
    print(f"- dlqctl {job} {broker}: " + "; ".join(p for p in parts if p))
for label in rows:
    if label.startswith("lean_export_"):
        broker = label.removeprefix("lean_export_")
        print(f"- leanest export {broker}: " + compare(label, f"ceiling_read_{broker}_with_headers", "ceiling-reading-headers"))
