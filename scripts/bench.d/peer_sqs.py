"""The export an SRE writes with boto3: every message of a queue with its attributes, one JSON
line each (SQS bodies are text), each held invisible while the read goes on, then made
visible again so the queue is left as it was."""
import base64, json, sys
import boto3

url = sys.argv[1]
sqs = boto3.client("sqs")
out = sys.stdout
receipts = []
while True:
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300, WaitTimeSeconds=1,
                              AttributeNames=["All"], MessageAttributeNames=["All"]).get("Messages", [])
    if not got:
        break
    for m in got:
        receipts.append(m["ReceiptHandle"])
        attrs = {k: v.get("StringValue") or base64.b64encode(v.get("BinaryValue", b"")).decode()
                 for k, v in m.get("MessageAttributes", {}).items()}
        out.write(json.dumps({"id": m["MessageId"], "attributes": m.get("Attributes", {}), "headers": attrs,
                              "body": m["Body"]}))
        out.write("\n")
for i in range(0, len(receipts), 10):
    sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": str(j), "ReceiptHandle": r, "VisibilityTimeout": 0} for j, r in enumerate(receipts[i:i + 10])])
