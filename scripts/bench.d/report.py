"""Medians of /usr/bin/time lines ("label wall user sys maxrss_kb messages"), as a Markdown table
with messages/s, CPU seconds and peak RSS, and dlqctl's ratio to the peer script."""
import collections, statistics, sys

runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, wall, user, sys_, rss, n = line.split()
    runs[label].append((float(wall), float(user) + float(sys_), int(rss), int(n)))
rows = {}
print("| measurement | messages | wall (s) | msg/s | CPU (s) | CPU µs/msg | peak RSS (MB) |")
print("|---|---|---|---|---|---|---|")
for label, rs in runs.items():
    wall = statistics.median(r[0] for r in rs)
    cpu = statistics.median(r[1] for r in rs)
    rss = statistics.median(r[2] for r in rs) / 1024
    n = rs[0][3]
    rows[label] = (n / wall if wall else 0, cpu)
    print(f"| {label.replace('_', ' ')} | {n} | {wall:.2f} | {n / wall if wall else 0:,.0f} | {cpu:.2f} | {1e6 * cpu / max(n, 1):.1f} | {rss:.1f} |")
print()
for label, (rate, cpu) in rows.items():
    if label.startswith("dlqctl_export_"):
        peer = label.replace("dlqctl_", "peer_")
        if peer in rows:
            prate, pcpu = rows[peer]
            print(f"- {label.replace('_', ' ')}: {rate / prate:.2f}x the peer's throughput, "
                  f"{cpu / pcpu if pcpu else 0:.2f}x its CPU")
