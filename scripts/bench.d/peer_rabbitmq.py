"""The export an SRE writes with pika: every message of a queue, headers, base64 for binary
bodies, one JSON line each, the queue left as it was (fetched without ack, then requeued)."""
import base64, json, sys
import pika

url, queue = sys.argv[1], sys.argv[2]
conn = pika.BlockingConnection(pika.URLParameters(url))
ch = conn.channel()
out = sys.stdout
while True:
    method, props, body = ch.basic_get(queue, auto_ack=False)
    if method is None:
        break
    try:
        text, encoding = body.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode(), "base64"
    headers = {k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v) for k, v in (props.headers or {}).items()}
    out.write(json.dumps({"id": props.message_id, "headers": headers, "body": text, "body_encoding": encoding}, default=str))
    out.write("\n")
conn.close()  # requeues everything fetched
