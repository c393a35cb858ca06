"""The export an SRE writes with confluent-kafka: every record of a topic from the beginning,
key, headers, base64 for binary values, one JSON line each, without committing."""
import base64, json, sys
from confluent_kafka import Consumer, TopicPartition

bootstrap, topic = sys.argv[1], sys.argv[2]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-peer", "enable.auto.commit": False})
parts = c.list_topics(topic, timeout=10).topics[topic].partitions
ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
c.assign([TopicPartition(topic, p, 0) for p in parts])
done = {p for p, end in ends.items() if end == 0}
out = sys.stdout
def text(b):
    if b is None:
        return None, "null"
    try:
        return b.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(b).decode(), "base64"
while len(done) < len(parts):
    m = c.poll(5)
    if m is None:
        break
    if m.error():
        continue
    body, enc = text(m.value())
    headers = {k: text(v)[0] for k, v in (m.headers() or [])}
    out.write(json.dumps({"topic": m.topic(), "partition": m.partition(), "offset": m.offset(),
                          "key": text(m.key())[0], "headers": headers, "body": body, "body_encoding": enc}))
    out.write("\n")
    if m.offset() + 1 >= ends[m.partition()]:
        done.add(m.partition())
c.close()
