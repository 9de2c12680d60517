"""The other side's own code: Confluent's Python serializers and deserializers
(confluent-kafka with fastavro, protobuf and jsonschema) against the real registry.

  confluent.py decode FORMAT TOPIC N    read N records of TOPIC with Confluent's deserializer;
                                        one JSON line each: {"message_id", "schema_id", "value"}
  confluent.py produce FORMAT TOPIC N   write N records with Confluent's serializer (schema
                                        auto-registered under <TOPIC>-value) and our four
                                        standard headers; prints {"schema_id"}

FORMAT is avro, protobuf or json-schema. Run by tests/schemas/interop.rs; environment:
SCHEMA_REGISTRY_URL, KAFKA_BOOTSTRAP_SERVERS.
"""
import json
import os
import sys
import time
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.json_format import MessageToDict
from google.protobuf.message_factory import GetMessageClass

REGISTRY = os.environ.get("SCHEMA_REGISTRY_URL", "http://127.0.0.1:18081/apis/ccompat/v7")
BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
NAMING = {"subject.name.strategy.type": "TOPIC"}

# The same contract as tests/schemas/contract.rs.
AVRO = json.dumps({
    "type": "record", "name": "OrderCreated", "namespace": "com.acme",
    "fields": [{"name": "order_id", "type": "string"}, {"name": "total_cents", "type": "long"},
               {"name": "note", "type": ["null", "string"], "default": None}]})
JSON_SCHEMA = json.dumps({
    "title": "OrderCreated", "type": "object", "required": ["order_id", "total_cents"],
    "properties": {"order_id": {"type": "string"}, "total_cents": {"type": "integer", "minimum": 0},
                   "note": {"type": "string"}},
    "additionalProperties": False})


def order_class():
    """acme.OrderCreated, built from a descriptor (no protoc)."""
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="acme_order.proto", package="acme", syntax="proto3")
    m = fdp.message_type.add(name="OrderCreated")
    m.field.add(name="order_id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, json_name="orderId")
    m.field.add(name="total_cents", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL, json_name="totalCents")
    m.field.add(name="note", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, json_name="note")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return GetMessageClass(pool.FindMessageTypeByName("acme.OrderCreated"))


def decode(fmt, topic, n):
    sr = SchemaRegistryClient({"url": REGISTRY})
    if fmt == "avro":
        de = AvroDeserializer(sr, conf=NAMING)
    elif fmt == "json-schema":
        de = JSONDeserializer(None, schema_registry_client=sr, conf=NAMING)
    else:
        de = ProtobufDeserializer(order_class(), conf=NAMING)
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "interop-" + uuid.uuid4().hex[:8],
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    seen, deadline = 0, time.time() + 60
    while seen < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        value = de(m.value(), SerializationContext(topic, MessageField.VALUE))
        if fmt == "protobuf":
            value = MessageToDict(value, preserving_proto_field_name=True)
        headers = dict((k, v.decode()) for k, v in (m.headers() or []))
        print(json.dumps({"message_id": headers.get("message_id"),
                          "schema_id": int.from_bytes(m.value()[1:5], "big"), "value": value}))
        seen += 1
    c.close()
    if seen < n:
        sys.exit(f"read {seen} of {n} records")


def produce(fmt, topic, n):
    sr = SchemaRegistryClient({"url": REGISTRY})
    conf = dict(NAMING, **{"auto.register.schemas": True})
    if fmt == "avro":
        ser, make = AvroSerializer(sr, AVRO, conf=conf), dict
    elif fmt == "json-schema":
        ser, make = JSONSerializer(JSON_SCHEMA, sr, conf=conf), dict
    else:
        cls = order_class()
        ser, make = ProtobufSerializer(cls, sr, conf=conf), lambda **kw: cls(**kw)
    p = Producer({"bootstrap.servers": BOOTSTRAP})
    schema_id = None
    for i in range(n):
        value = ser(make(order_id=f"PY-{i}", total_cents=100 * i, note="from python"),
                    SerializationContext(topic, MessageField.VALUE))
        schema_id = int.from_bytes(value[1:5], "big")
        key = f"PY-{i}"
        p.produce(topic, key=key, value=value, headers=[
            ("message_type", b"order_created"), ("entity_id", key.encode()),
            ("message_id", str(uuid.uuid4()).encode()), ("timestamp", b"2026-12-02T06:00:00Z")])
    if p.flush(30) != 0:
        sys.exit("records left unsent")
    print(json.dumps({"schema_id": schema_id}))


if __name__ == "__main__":
    verb, fmt, topic, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    {"decode": decode, "produce": produce}[verb](fmt, topic, n)
