"""Helpers behind scripts/brokers: readiness checks, Tansu's header index, and the seed story.

The seed story is one `orders` flow whose consumer fails, told on each broker with real
dead letters (the broker itself dead-letters them wherever it can), and the exact counts
are written to seed.json so tests can assert them.

Usage: brokers.py check rabbitmq|sqs|kafka | index-tansu DB | seed --out FILE | reset
       brokers.py fixture BROKER NAMESPACE < letters.jsonl | drop BROKER NAMESPACE
"""

import argparse
import base64
import json
import os
import sqlite3
import struct
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

RABBITMQ_PORT = int(os.environ.get("DLQCTL_RABBITMQ_PORT", "5672"))
RABBITMQ_MGMT = "http://127.0.0.1:%s" % os.environ.get("DLQCTL_RABBITMQ_MGMT_PORT", "15672")
LOCALSTACK = "http://127.0.0.1:%s" % os.environ.get("DLQCTL_LOCALSTACK_PORT", "4566")
KAFKA = "127.0.0.1:%s" % os.environ.get("DLQCTL_KAFKA_PORT", "9092")
SEED_VHOST = "seed"
DLT_RETENTION_MS = 14 * 24 * 3600 * 1000


def log(msg):
    print("seed: " + msg, file=sys.stderr)


def wait_for(what, predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit("seed: timed out waiting for " + what)
        time.sleep(0.2)


# --- RabbitMQ ----------------------------------------------------------------------------------

def management(method, path, body=None):
    auth = base64.b64encode(b"guest:guest").decode()
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(RABBITMQ_MGMT + path, data=data, method=method)
    req.add_header("Authorization", "Basic " + auth)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read()
            return json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        if method == "DELETE" and e.code == 404:
            return None
        raise


def rabbitmq_connection(vhost="/"):
    import pika

    params = pika.ConnectionParameters(
        host="127.0.0.1", port=RABBITMQ_PORT, virtual_host=vhost,
        credentials=pika.PlainCredentials("guest", "guest"), connection_attempts=1,
        socket_timeout=5, blocked_connection_timeout=10,
    )
    return pika.BlockingConnection(params)


def body_for(i, prefix):
    """JSON mostly; some plain text, binary and empty: the shapes that break tools."""
    if i % 7 == 6:
        return b""
    if i % 5 == 2:
        return ("order %s-%04d could not be parsed: unexpected end of input" % (prefix, i)).encode()
    if i % 4 == 3:
        return bytes([0x0A, 0x80, 0xFF, i % 256]) + b"\x00protobuf"
    return json.dumps({"type": "order.created", "order_id": "%s-%04d" % (prefix, i), "total": 10 + i}).encode()


def seed_rabbitmq(vhost=SEED_VHOST):
    import pika

    quote = urllib.parse.quote(vhost, safe="")
    management("PUT", "/api/vhosts/" + quote)
    management("PUT", "/api/permissions/%s/guest" % quote, {"configure": ".*", "write": ".*", "read": ".*"})
    conn = rabbitmq_connection(vhost)
    ch = conn.channel()
    ch.exchange_declare("orders", "topic", durable=True)
    ch.exchange_declare("orders.dlx", "topic", durable=True)
    ch.queue_declare("orders.dlq", durable=True, arguments={"x-message-ttl": 14 * 24 * 3600 * 1000})
    ch.queue_bind("orders.dlq", "orders.dlx", "#")
    dlx = {"x-dead-letter-exchange": "orders.dlx"}

    def publish(exchange, key, i, prefix, **props):
        headers = {"tenant": ["acme", "globex"][i % 2], "attempt": 1}
        ch.basic_publish(exchange, key, body_for(i, prefix), pika.BasicProperties(
            message_id="%s-%04d" % (prefix, i), correlation_id="corr-%d" % i, content_type="application/json",
            delivery_mode=2, app_id="orders-api", timestamp=int(time.time()), headers=headers, **props))

    def reject_all(queue, count, requeue=False):
        done = 0
        while done < count:
            method, _, _ = ch.basic_get(queue)
            if method is None:
                time.sleep(0.05)
                continue
            ch.basic_nack(method.delivery_tag, requeue=requeue)
            done += 1

    # Rejected by the consumer of a classic queue.
    ch.queue_declare("orders", durable=True, arguments=dlx)
    ch.queue_bind("orders", "orders", "order.*")
    for i in range(12):
        publish("orders", "order.created" if i % 3 else "order.updated", i, "rejected")
    reject_all("orders", 12)

    # Expired: per-message TTL.
    ch.queue_declare("orders.delayed", durable=True, arguments=dlx)
    for i in range(5):
        publish("", "orders.delayed", i, "expired", expiration="100")

    # Overflow of a max-length queue (drop-head dead-letters the oldest).
    ch.queue_declare("orders.priority", durable=True, arguments=dict(dlx, **{"x-max-length": 2}))
    for i in range(6):
        publish("", "orders.priority", i, "maxlen")

    # A quorum queue's delivery limit.
    ch.queue_declare("payments", durable=True, arguments=dict(dlx, **{"x-queue-type": "quorum", "x-delivery-limit": 1}))
    for i in range(3):
        publish("", "payments", i, "delivery-limit")
    wait_for("payments to hold 3", lambda: ch.queue_declare("payments", passive=True).method.message_count == 3)
    # Requeue until the broker dead-letters them; a requeued message can be briefly
    # invisible to the count, so stop only after a second of seeing nothing.
    deadline, quiet_since = time.monotonic() + 30, None
    while time.monotonic() < deadline:
        method, _, _ = ch.basic_get("payments")
        if method is not None:
            ch.basic_nack(method.delivery_tag, requeue=True)
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 1.0:
            break
        else:
            time.sleep(0.05)

    # A DLX set by policy, with a dead-letter routing key that differs from the original key.
    management("PUT", "/api/policies/%s/invoices-dlx" % quote, {
        "pattern": "^invoices$", "apply-to": "queues",
        "definition": {"dead-letter-exchange": "orders.dlx", "dead-letter-routing-key": "dead.invoices"}})
    ch.queue_declare("invoices", durable=True)
    ch.queue_bind("invoices", "orders", "invoice.*")
    time.sleep(0.5)  # let the policy reach the queue before anything is rejected
    for i in range(3):
        publish("orders", "invoice.created", i, "policy")
    reject_all("invoices", 3)

    # Died twice: rejected from orders.validate, then expired in orders.retry.
    ch.queue_declare("orders.retry", durable=True, arguments=dict(dlx, **{"x-message-ttl": 200}))
    ch.queue_declare("orders.validate", durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders.retry"})
    for i in range(2):
        publish("", "orders.validate", i, "twice")
    reject_all("orders.validate", 2)

    total = 12 + 5 + 4 + 3 + 3 + 2
    wait_for("orders.dlq to hold %d" % total,
             lambda: ch.queue_declare("orders.dlq", passive=True).method.message_count == total)
    conn.close()
    return {
        "vhost": vhost,
        "dlq": "orders.dlq",
        "total": total,
        "by_last_reason": {"rejected": 15, "expired": 7, "maxlen": 4, "delivery_limit": 3},
        "by_first_reason": {"rejected": 17, "expired": 5, "maxlen": 4, "delivery_limit": 3},
        "by_source": {"orders": 12, "orders.delayed": 5, "orders.priority": 4, "payments": 3, "invoices": 3,
                      "orders.validate": 2},
        "died_twice": 2,
        "policy_dlx": {"queue": "invoices", "original_routing_key": "invoice.created",
                       "dead_letter_routing_key": "dead.invoices", "count": 3},
    }


def reset_rabbitmq():
    management("DELETE", "/api/vhosts/" + urllib.parse.quote(SEED_VHOST, safe=""))


# --- SQS and CloudWatch (LocalStack) -------------------------------------------------------------

def aws(service):
    import boto3

    return boto3.client(service, endpoint_url=LOCALSTACK, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


SQS_QUEUES = ["orders-queue", "orders-dlq", "orders.fifo", "orders-dlq.fifo", "orders-fulfilment-dlq",
              "orders-events-dlq", "audit-queue"]
ALARMS = ["orders-dlq-depth", "orders-dlq-age", "orders-fulfilment-dlq-depth"]


def seed_sqs():
    sqs = aws("sqs")
    cw = aws("cloudwatch")

    def create(name, **attrs):
        attrs = {k: str(v) for k, v in attrs.items()}
        url = sqs.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        return url, arn

    def depth(url):
        a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                                                      "ApproximateNumberOfMessagesNotVisible"])
        return int(a["Attributes"]["ApproximateNumberOfMessages"]), int(a["Attributes"]["ApproximateNumberOfMessagesNotVisible"])

    def fail_until_dead_lettered(source, dlq, count):
        """Receive without deleting until SQS moves every message past maxReceiveCount."""
        deadline = time.monotonic() + 60
        while depth(dlq)[0] < count:
            if time.monotonic() > deadline:
                raise SystemExit("seed: SQS did not dead-letter %d messages" % count)
            sqs.receive_message(QueueUrl=source, MaxNumberOfMessages=10, VisibilityTimeout=0,
                                WaitTimeSeconds=0, AttributeNames=["All"])

    attributes = lambda i: {
        "tenant": {"DataType": "String", "StringValue": ["acme", "globex"][i % 2]},
        "attempt": {"DataType": "Number", "StringValue": str(i)},
        "trace": {"DataType": "Binary", "BinaryValue": bytes([0, 255, i])},
    }
    text = lambda i, prefix: json.dumps({"type": "order.created", "order_id": "%s-%04d" % (prefix, i)})

    # Standard pair dead-lettered for real by receiving past maxReceiveCount.
    dlq_url, dlq_arn = create("orders-dlq", MessageRetentionPeriod=14 * 86400)
    src_url, _ = create("orders-queue", MessageRetentionPeriod=4 * 86400, RedrivePolicy=json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3}))
    for i in range(10):
        sqs.send_message(QueueUrl=src_url, MessageBody=text(i, "sqs"), MessageAttributes=attributes(i))
    fail_until_dead_lettered(src_url, dlq_url, 10)

    # FIFO pair with three message groups.
    fdlq_url, fdlq_arn = create("orders-dlq.fifo", FifoQueue="true", MessageRetentionPeriod=14 * 86400)
    fsrc_url, _ = create("orders.fifo", FifoQueue="true", MessageRetentionPeriod=4 * 86400,
                         RedrivePolicy=json.dumps({"deadLetterTargetArn": fdlq_arn, "maxReceiveCount": 2}))
    for i in range(9):
        group = "customer-%d" % (i % 3)
        sqs.send_message(QueueUrl=fsrc_url, MessageBody=text(i, "fifo"), MessageGroupId=group,
                         MessageDeduplicationId="fifo-%d" % i)
    fail_until_dead_lettered(fsrc_url, fdlq_url, 9)

    # A Lambda asynchronous-invocation DLQ: the error rides in message attributes.
    lambda_url, _ = create("orders-fulfilment-dlq", MessageRetentionPeriod=14 * 86400)
    lambda_errors = [("200", "Task timed out after 30.00 seconds"),
                     ("200", "Unhandled: TypeError: Cannot read properties of undefined (reading 'sku')"),
                     ("429", "Rate Exceeded.")]
    for i in range(6):
        code, message = lambda_errors[i % 3]
        sqs.send_message(QueueUrl=lambda_url, MessageBody=text(i, "lambda"), MessageAttributes={
            "RequestID": {"DataType": "String", "StringValue": "req-%08d" % i},
            # As Lambda writes it: a Number attribute holding a 3-digit HTTP code.
            "ErrorCode": {"DataType": "Number", "StringValue": code},
            "ErrorMessage": {"DataType": "String", "StringValue": message}})

    # An EventBridge target DLQ.
    events_url, _ = create("orders-events-dlq", MessageRetentionPeriod=14 * 86400)
    for i in range(3):
        sqs.send_message(QueueUrl=events_url, MessageBody=text(i, "events"), MessageAttributes={
            "RULE_ARN": {"DataType": "String", "StringValue": "arn:aws:events:us-east-1:000000000000:rule/orders"},
            "TARGET_ARN": {"DataType": "String", "StringValue": "arn:aws:lambda:us-east-1:000000000000:function:fulfil"},
            "ERROR_CODE": {"DataType": "String", "StringValue": "SDK_CLIENT_ERROR"},
            "ERROR_MESSAGE": {"DataType": "String", "StringValue": "Unable to invoke Lambda function"},
            "EXHAUSTED_RETRY_CONDITION": {"DataType": "String", "StringValue": "MaximumRetryAttempts"},
            "RETRY_ATTEMPTS": {"DataType": "String", "StringValue": "185"}})

    # A source queue with no DLQ at all, for lint.
    create("audit-queue")

    # Alarms on some DLQs and not others.
    def alarm(name, queue, metric, threshold):
        cw.put_metric_alarm(AlarmName=name, Namespace="AWS/SQS", MetricName=metric,
                            Dimensions=[{"Name": "QueueName", "Value": queue}], Statistic="Maximum",
                            Period=60, EvaluationPeriods=1, Threshold=threshold,
                            ComparisonOperator="GreaterThanThreshold")

    alarm("orders-dlq-depth", "orders-dlq", "ApproximateNumberOfMessagesVisible", 0)
    alarm("orders-dlq-age", "orders-dlq", "ApproximateAgeOfOldestMessage", 3600)
    alarm("orders-fulfilment-dlq-depth", "orders-fulfilment-dlq", "ApproximateNumberOfMessagesVisible", 10)

    counts = {"orders-dlq": 10, "orders-dlq.fifo": 9, "orders-fulfilment-dlq": 6, "orders-events-dlq": 3}
    for name, expected in counts.items():
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        wait_for("%s to hold %d" % (name, expected), lambda: sum(depth(url)) == expected)
    return {
        "dlqs": counts,
        "sources": {"orders-dlq": ["orders-queue"], "orders-dlq.fifo": ["orders.fifo"]},
        "max_receive_count": {"orders-queue": 3, "orders.fifo": 2},
        "fifo_groups": {"customer-0": 3, "customer-1": 3, "customer-2": 3},
        "lambda_error_codes": {"200": 4, "429": 2},
        "without_dlq": ["audit-queue"],
        "alarms": {"orders-dlq": ["depth", "age"], "orders-fulfilment-dlq": ["depth (threshold 10)"],
                   "orders-dlq.fifo": [], "orders-events-dlq": []},
    }


def reset_sqs():
    sqs = aws("sqs")
    for name in SQS_QUEUES:
        try:
            sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=name)["QueueUrl"])
        except sqs.exceptions.QueueDoesNotExist:
            pass
    aws("cloudwatch").delete_alarms(AlarmNames=ALARMS)


# --- Kafka (Tansu) --------------------------------------------------------------------------------

KAFKA_TOPICS = {"orders": 3, "orders.DLT": 3, "dlq-orders-jdbc-sink": 1}


def kafka_admin():
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": KAFKA})


def seed_kafka():
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    admin = kafka_admin()
    futures = admin.create_topics([
        NewTopic(name, partitions, 1, config={"retention.ms": str(DLT_RETENTION_MS)} if name != "orders" else {})
        for name, partitions in KAFKA_TOPICS.items()])
    for f in futures.values():
        f.result(timeout=30)
    producer = Producer({"bootstrap.servers": KAFKA, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5})
    failures = []

    def delivered(err, _msg):
        if err is not None:
            failures.append(err)

    for i in range(20):
        producer.produce("orders", key="customer-%d" % (i % 7), value=body_for(i, "orders"), partition=i % 3,
                         on_delivery=delivered)

    exceptions = [
        ("org.springframework.kafka.listener.ListenerExecutionFailedException",
         "com.fasterxml.jackson.databind.exc.MismatchedInputException", "Cannot deserialize value of type BigDecimal"),
        ("org.springframework.kafka.listener.ListenerExecutionFailedException",
         "java.lang.IllegalStateException", "inventory service returned 503"),
        ("org.springframework.kafka.support.serializer.DeserializationException",
         "org.apache.kafka.common.errors.SerializationException", "Unknown magic byte!"),
    ]
    null_values = null_keys = 0
    by_exception = {}
    for i in range(30):
        partition = i % 3
        cls, cause, message = exceptions[i % 3]
        headers = [
            ("kafka_dlt-exception-fqcn", cls.encode()),
            ("kafka_dlt-exception-cause-fqcn", cause.encode()),
            ("kafka_dlt-exception-message", message.encode()),
            ("kafka_dlt-exception-stacktrace", ("%s: %s\n\tat com.example.OrderListener.on(OrderListener.java:42)\n" % (cls, message)).encode()),
            ("kafka_dlt-original-topic", b"orders"),
            ("kafka_dlt-original-partition", struct.pack(">i", partition)),
            ("kafka_dlt-original-offset", struct.pack(">q", 1000 + i)),
            ("kafka_dlt-original-timestamp", str(int(time.time() * 1000) - 5000).encode()),
            ("kafka_dlt-original-timestamp-type", b"CreateTime"),
            ("kafka_dlt-original-consumer-group", b"orders-service"),
        ]
        if i % 10 == 5:  # the key failed to deserialize, not the value
            headers.append(("kafka_dlt-key-exception-fqcn", b"org.apache.kafka.common.errors.SerializationException"))
            headers.append(("kafka_dlt-key-exception-message", b"Can't deserialize data from topic [orders]"))
        key = None if i % 10 == 0 else ("customer-%d" % (i % 7)).encode()
        value = None if i % 9 == 4 else body_for(i, "dlt")
        null_keys += key is None
        null_values += value is None
        by_exception[cls] = by_exception.get(cls, 0) + 1
        producer.produce("orders.DLT", key=key, value=value, partition=partition, headers=headers,
                         on_delivery=delivered)

    for i in range(10):
        exception, message = [("org.apache.kafka.connect.errors.DataException", "Converting byte[] to Kafka Connect data failed"),
                              ("java.sql.SQLIntegrityConstraintViolationException", "Duplicate entry for key 'PRIMARY'")][i % 2]
        headers = [(k, v.encode()) for k, v in [
            ("__connect.errors.topic", "orders"), ("__connect.errors.partition", str(i % 3)),
            ("__connect.errors.offset", str(2000 + i)), ("__connect.errors.connector.name", "orders-jdbc-sink"),
            ("__connect.errors.task.id", "0"), ("__connect.errors.stage", "VALUE_CONVERTER"),
            ("__connect.errors.class.name", "org.apache.kafka.connect.json.JsonConverter"),
            ("__connect.errors.exception.class.name", exception),
            ("__connect.errors.exception.message", message),
            ("__connect.errors.exception.stacktrace", exception + ": " + message)]]
        producer.produce("dlq-orders-jdbc-sink", key=("customer-%d" % i).encode(), value=body_for(i, "connect"),
                         headers=headers, on_delivery=delivered)

    if producer.flush(30) or failures:
        raise SystemExit("seed: Kafka produce failed: %s" % failures)
    verify_kafka_depth({"orders.DLT": 30, "dlq-orders-jdbc-sink": 10})
    return {
        "topics": KAFKA_TOPICS,
        "dlts": {
            "orders.DLT": {"total": 30, "per_partition": {"0": 10, "1": 10, "2": 10}, "null_keys": null_keys,
                           "null_values": null_values, "by_exception": by_exception, "key_exceptions": 3},
            "dlq-orders-jdbc-sink": {"total": 10, "by_exception": {
                "org.apache.kafka.connect.errors.DataException": 5,
                "java.sql.SQLIntegrityConstraintViolationException": 5}},
        },
    }


def verify_kafka_depth(expected):
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": KAFKA, "group.id": "dlqctl-seed-check"})
    try:
        for topic, total in expected.items():
            found = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                        for p in range(KAFKA_TOPICS[topic]))
            if found != total:
                raise SystemExit("seed: %s holds %d records, expected %d" % (topic, found, total))
    finally:
        consumer.close()


def reset_kafka():
    # Deleting any topic on Tansu 0.6.0 deletes all of them (see drop_namespace); for a reset
    # that is what we want, so only "unknown topic" answers for the rest are tolerated below.
    admin = kafka_admin()
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [t for t in KAFKA_TOPICS if t in existing]
    if doomed:
        from confluent_kafka import KafkaError, KafkaException

        for f in admin.delete_topics(doomed).values():
            try:
                f.result(timeout=30)
            except KafkaException as e:
                # Already gone with the first deletion (see above).
                if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
        wait_for("topics to be deleted",
                 lambda: not set(doomed) & set(kafka_admin().list_topics(timeout=10).topics), timeout=30)


# --- conformance fixtures: one isolated DLQ holding given letters, as real dead letters ----------

def letters_from_jsonl(stream):
    """(seq, body bytes or None, string/int headers) from dlqctl archive lines."""
    out = []
    for line in stream:
        if not line.strip():
            continue
        record = json.loads(line)
        body = record.get("body")
        if body is not None:
            body = base64.b64decode(body) if record.get("body_encoding") == "base64" else body.encode()
        headers = {}
        for k, v in record.get("headers", {}).items():
            if isinstance(v, dict) and set(v) == {"$bytes"}:
                headers[k] = base64.b64decode(v["$bytes"])
            elif isinstance(v, (str, int)) and not isinstance(v, bool):
                headers[k] = v
        out.append((headers.get("seq"), body, headers))
    return out


def fixture_rabbitmq(namespace, letters, exchange=""):
    """Letters rejected from queue `source` into `dlq`; published through `exchange` (a topic
    exchange with key order.created) when one is named, else straight to the queue."""
    import pika

    quote = urllib.parse.quote(namespace, safe="")
    management("PUT", "/api/vhosts/" + quote)
    management("PUT", "/api/permissions/%s/guest" % quote, {"configure": ".*", "write": ".*", "read": ".*"})
    conn = rabbitmq_connection(namespace)
    ch = conn.channel()
    ch.queue_declare("dlq", durable=True)
    ch.queue_declare("source", durable=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    key = "source"
    if exchange:
        ch.exchange_declare(exchange, "topic", durable=True)
        ch.queue_bind("source", exchange, "order.*")
        key = "order.created"
    for seq, body, headers in letters:
        ch.basic_publish(exchange, key, body or b"", pika.BasicProperties(
            message_id="conf-%s" % seq, delivery_mode=2, headers=headers))
    # Reject them all for real, a window at a time: one nack covers everything up to its tag.
    ch.basic_qos(prefetch_count=1000)
    rejected = 0
    for method, _props, _body in ch.consume("source", inactivity_timeout=60) if letters else []:
        if method is None:
            raise SystemExit("fixture: source stopped delivering after %d of %d" % (rejected, len(letters)))
        rejected += 1
        if rejected % 500 == 0 or rejected == len(letters):
            ch.basic_nack(method.delivery_tag, multiple=True, requeue=False)
        if rejected == len(letters):
            break
    ch.cancel()
    wait_for("dlq to hold %d" % len(letters),
             lambda: ch.queue_declare("dlq", passive=True).method.message_count == len(letters))
    conn.close()
    return "rabbitmq://guest:guest@127.0.0.1:%d/%s/dlq" % (RABBITMQ_PORT, quote)


def fixture_sqs(namespace, letters, fifo=False):
    """Letters dead-lettered for real from `NS-src` into `NS-dlq` (maxReceiveCount 1); with
    `fifo`, a FIFO pair, each letter in the message group named by its `group` header."""
    sqs = aws("sqs")
    suffix, attrs = (".fifo", {"FifoQueue": "true"}) if fifo else ("", {})
    dlq = sqs.create_queue(QueueName=namespace + "-dlq" + suffix, Attributes=attrs)["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    src = sqs.create_queue(QueueName=namespace + "-src" + suffix, Attributes=dict(attrs, RedrivePolicy=json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})))["QueueUrl"]
    entries = []

    def send(batch):
        failed = sqs.send_message_batch(QueueUrl=src, Entries=batch).get("Failed")
        if failed:
            raise SystemExit("fixture: SQS refused %s" % failed)

    for seq, body, headers in letters:
        # SQS bodies are non-empty text: an SQS DLQ never holds an empty or binary body.
        try:
            text = body.decode() if body else "(empty)"
        except UnicodeDecodeError:
            text = base64.b64encode(body).decode()
        attributes = {k: {"DataType": "Binary", "BinaryValue": v} if isinstance(v, bytes) else
                      {"DataType": "Number" if isinstance(v, int) else "String", "StringValue": str(v)}
                      for k, v in headers.items()}
        extra = {"MessageGroupId": str(headers.get("group", "g")), "MessageDeduplicationId": str(seq)} if fifo else {}
        entries.append(dict(Id=str(len(entries) % 10), MessageBody=text, MessageAttributes=attributes, **extra))
    # A FIFO queue keeps its groups in the order they were sent: one batch at a time. A standard
    # queue keeps none, and LocalStack answers several callers at once (the bench's 20,000
    # letters: 45 s one call at a time).
    callers = 1 if fifo else 4
    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(send, (entries[i:i + 10] for i in range(0, len(entries), 10))))

    def drain():
        while sqs.receive_message(QueueUrl=src, MaxNumberOfMessages=10, VisibilityTimeout=0,
                                  WaitTimeSeconds=0).get("Messages"):
            pass

    def moved():
        # Each receive past maxReceiveCount moves what it would have returned: keep receiving
        # while there is something to receive, and only then look at the DLQ.
        with ThreadPoolExecutor(callers) as pool:
            list(pool.map(lambda _: drain(), range(callers)))
        a = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
        return int(a["Attributes"]["ApproximateNumberOfMessages"]) == len(letters)

    wait_for("SQS to dead-letter %d messages" % len(letters), moved, timeout=600)
    # Now that they are dead letters, let tests read the source (redriven copies) without
    # each read pushing the copies back to the DLQ.
    sqs.set_queue_attributes(QueueUrl=src, Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1000})})
    return "sqs://%s-dlq%s?endpoint=%s&region=us-east-1" % (namespace, suffix, LOCALSTACK)


def fixture_kafka(namespace, letters, partitions=1, with_source=True):
    """Letters in `NS.DLT` with Spring headers naming `NS` as their original topic (created
    too unless `with_source` is false), spread over `partitions` partitions by seq."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    topic = namespace + ".DLT"
    admin = kafka_admin()  # must outlive its futures
    # Topics take records up to 16 MB, as production DLTs for large payloads are configured.
    big = {"max.message.bytes": str(16 * 1024 * 1024)}
    topics = [NewTopic(topic, partitions, 1, config=big)] + \
        ([NewTopic(namespace, partitions, 1, config=big)] if with_source else [])
    for f in admin.create_topics(topics).values():
        f.result(timeout=30)
    producer = Producer({"bootstrap.servers": KAFKA, "enable.idempotence": True, "acks": "all",
                         "message.max.bytes": 16 * 1024 * 1024})
    for seq, body, headers in letters:
        spring = [("kafka_dlt-exception-fqcn", b"java.lang.IllegalStateException"),
                  ("kafka_dlt-original-topic", namespace.encode()),
                  ("kafka_dlt-original-partition", struct.pack(">i", 0)),
                  ("kafka_dlt-original-offset", struct.pack(">q", int(seq or 0)))]
        producer.produce(topic, key=str(seq).encode(), value=body, partition=int(seq or 0) % partitions,
                         headers=[(k, v if isinstance(v, bytes) else str(v).encode()) for k, v in headers.items()] + spring)
    # Tansu writes a few MB a second into SQLite, so 100,000 letters take minutes on a slow
    # machine: wait while deliveries progress, fail only on 30 s without one.
    pending = producer.flush(30)
    while pending:
        before, pending = pending, producer.flush(30)
        if pending >= before:
            raise SystemExit("fixture: Kafka produce stalled with %d letters undelivered" % pending)
    return "kafka://%s/%s" % (KAFKA, topic)


def drop_namespace(broker, namespace):
    if broker.startswith("rabbitmq"):
        management("DELETE", "/api/vhosts/" + urllib.parse.quote(namespace, safe=""))
    elif broker.startswith("sqs"):
        sqs = aws("sqs")
        for url in sqs.list_queues(QueueNamePrefix=namespace).get("QueueUrls", []):
            sqs.delete_queue(QueueUrl=url)
    # Kafka: nothing. Tansu 0.6.0's SQLite engine deletes every topic of the cluster when asked
    # to delete one (topic_delete_by.sql matches on the cluster only), which would wipe the
    # topics of tests running in parallel. Test topics have unique names and are cleared by
    # the next `scripts/brokers seed` or `reset`.


def fixture_rabbitmq_story(namespace, _letters):
    seed_rabbitmq(namespace)
    return "rabbitmq://guest:guest@127.0.0.1:%d/%s/orders.dlq" % (RABBITMQ_PORT, urllib.parse.quote(namespace, safe=""))


FIXTURES = {
    "rabbitmq": fixture_rabbitmq,
    # The same, through a topic exchange named `orders`, which tests may delete.
    "rabbitmq-exchange": lambda ns, letters: fixture_rabbitmq(ns, letters, exchange="orders"),
    # The whole seeded RabbitMQ story in a vhost of its own, for tests that change it.
    "rabbitmq-story": fixture_rabbitmq_story,
    "sqs": fixture_sqs,
    "sqs-fifo": lambda ns, letters: fixture_sqs(ns, letters, fifo=True),
    "kafka": fixture_kafka,
    "kafka-3": lambda ns, letters: fixture_kafka(ns, letters, partitions=3),
    # Letters whose original topic does not exist.
    "kafka-orphan": lambda ns, letters: fixture_kafka(ns, letters, with_source=False),
}


# --- readiness checks and Tansu's index ------------------------------------------------------------

def check(broker):
    if broker == "rabbitmq":
        rabbitmq_connection().close()
    elif broker.startswith("sqs"):
        aws("sqs").list_queues()
    elif broker == "kafka":
        kafka_admin().list_topics(timeout=5)
    elif broker == "kafka-secure":
        from confluent_kafka.admin import AdminClient

        tls = os.path.join(os.environ["DLQCTL_BROKERS_DIR"], "tls")
        AdminClient({
            "bootstrap.servers": "127.0.0.1:%s" % os.environ.get("DLQCTL_KAFKA_SECURE_PORT", "9094"),
            "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "dlqctl", "sasl.password": os.environ["KAFKA_SCRAM_PASSWORD"],
            "ssl.ca.location": tls + "/ca.pem", "ssl.certificate.location": tls + "/client.pem",
            "ssl.key.location": tls + "/client.key", "log_level": 0,
        }).list_topics(timeout=5)
    else:
        raise SystemExit("unknown broker " + broker)


def index_tansu(db):
    if not os.path.exists(db):
        raise SystemExit(1)
    conn = sqlite3.connect(db, timeout=10)
    try:
        if not conn.execute("select 1 from sqlite_master where type='table' and name='header'").fetchone():
            raise SystemExit(1)
        conn.execute("create index if not exists header_topition_offset on header (topition, offset_id)")
        conn.commit()
    finally:
        conn.close()


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check").add_argument("broker")
    sub.add_parser("index-tansu").add_argument("db")
    sub.add_parser("seed").add_argument("--out", required=True)
    sub.add_parser("reset")
    fix = sub.add_parser("fixture", help="create NAMESPACE holding the JSONL letters on stdin; print its target")
    fix.add_argument("broker", choices=sorted(FIXTURES))
    fix.add_argument("namespace")
    drop = sub.add_parser("drop", help="delete everything in NAMESPACE")
    drop.add_argument("broker", choices=sorted(FIXTURES))
    drop.add_argument("namespace")
    args = parser.parse_args()
    if args.cmd == "fixture":
        print(FIXTURES[args.broker](args.namespace, letters_from_jsonl(sys.stdin)))
    elif args.cmd == "drop":
        drop_namespace(args.broker, args.namespace)
    elif args.cmd == "check":
        check(args.broker)
    elif args.cmd == "index-tansu":
        index_tansu(args.db)
    elif args.cmd == "reset":
        reset_rabbitmq(); reset_sqs(); reset_kafka()
    elif args.cmd == "seed":
        reset_rabbitmq(); reset_sqs(); reset_kafka()
        started = time.monotonic()
        counts = {"rabbitmq": seed_rabbitmq(), "sqs": seed_sqs(), "kafka": seed_kafka()}
        with open(args.out, "w") as f:
            json.dump(counts, f, indent=2, sort_keys=True)
        log("seeded in %.1f s: RabbitMQ %s %d, SQS %s, Kafka %s; counts in %s" % (
            time.monotonic() - started, counts["rabbitmq"]["dlq"], counts["rabbitmq"]["total"],
            counts["sqs"]["dlqs"], {k: v["total"] for k, v in counts["kafka"]["dlts"].items()}, args.out))


if __name__ == "__main__":
    main()
