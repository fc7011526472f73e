#!/usr/bin/env python3
"""A Schema Registry for the tests: the REST subset the connector and confluent-kafka's clients use, as a
real HTTP server on a port.

    schema_registry.py serve PORT STATE_FILE [USER:PASSWORD | --bearer-file PATH] [--tls CERT KEY]
                             [--unavailable]
        Serves until killed. Every write is saved to STATE_FILE and read back at start, so a registry
        killed and started again on the same port answers as before (the "registry down and back" tests).
        With USER:PASSWORD every request needs that HTTP basic auth; with --bearer-file every request
        needs `Authorization: Bearer T`, T being PATH's content when the request arrives (less one
        trailing line break), so that a test rotates the token by replacing the file; 401 otherwise.
        With --tls it serves HTTPS (Python's ssl module) with the PEM certificate CERT and its key KEY.
        With --unavailable it answers every request 503 (up, but serving nothing: a registry that
        lost its backing store, or a load balancer in front of none).

    schema_registry.py decode URL [USER:PASSWORD | --bearer-file PATH] [--ca-file PEM] < lines
        Reads JSON lines {"topic", "format": "avro" | "protobuf" | "json", "field": "value" | "key",
        "hex"} and writes one JSON line per record: the value decoded by confluent-kafka's own
        deserializer (AvroDeserializer, ProtobufDeserializer, JSONDeserializer) with its own
        SchemaRegistryClient pointed at URL, and the schema id from the frame. Decimals, dates, times,
        UUIDs and bytes come out as text so that the test compares them exactly. The client sends
        USER:PASSWORD as basic auth, or PATH's content (read once, at start) as its static bearer
        token, and trusts the CA certificates in PEM (its `ssl.ca.location`).

    schema_registry.py subject STRATEGY TOPIC FORMAT SCHEMA_FILE [PROTO_NAME]
        Prints the value subject that confluent-kafka's own serializer computes for a schema under
        its STRATEGY (record_name: record_subject_name_strategy, topic_record_name:
        topic_record_subject_name_strategy) for a record in TOPIC, one line per record type: FORMAT
        avro: SCHEMA_FILE holds the schema's JSON, one line (AvroSerializer's record name, the full
        name); FORMAT protobuf: SCHEMA_FILE is protoc's FileDescriptorSet (--include_imports), one
        line for each top-level message of its file PROTO_NAME, in the file's order, which is the
        message-index order (ProtobufSerializer's record name, the message's full name). The
        serializer is stopped where its strategy answers: no registry is asked.

Why Python: the independent decoder the issue asks for is confluent-kafka's Python package, already
installed beside the registry; http.server is in the standard library. Implemented endpoints, as
Confluent documents them:
    GET  /subjects                              GET  /subjects/{s}/versions
    GET  /subjects/{s}/versions/{v|latest}      POST /subjects/{s}/versions   (register; same schema: same id)
    GET  /schemas/ids/{id}[?subject=…]          GET  /schemas/ids/{id}/versions
    POST /subjects/{s}   (look a schema up)     GET  /config, /config/{s}
Errors are Confluent's: 40101 unauthorized, 40401 subject not found, 40402 version not found, 40403
schema not found; --unavailable's 503 carries 50301, a code of ours.
`?format=serialized` (what confluent-kafka's Protobuf deserializer asks for) answers a Protobuf schema as
its base64 FileDescriptorProto, which this registry cannot compute from .proto text (that takes protoc): a
test registering a Protobuf schema also sends it, in the body's `serialized` field (an extension of ours).
"""

import base64
import io
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class Store:
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        try:
            with open(path) as f:
                state = json.load(f)
        except FileNotFoundError:
            state = {"subjects": {}, "schemas": []}
        self.subjects = state["subjects"]  # subject -> [{"version", "id"}]
        self.schemas = state["schemas"]  # index id-1 -> {"schema", "schemaType", "references"}

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"subjects": self.subjects, "schemas": self.schemas}, f)
        import os

        os.replace(tmp, self.path)

    def schema_id(self, schema):
        for i, known in enumerate(self.schemas):
            if known == schema:
                return i + 1
        self.schemas.append(schema)
        return len(self.schemas)

    def register(self, subject, schema):
        with self.lock:
            sid = self.schema_id(schema)
            versions = self.subjects.setdefault(subject, [])
            for v in versions:
                if v["id"] == sid:
                    return sid
            versions.append({"version": len(versions) + 1, "id": sid})
            self.save()
            return sid

    def version(self, subject, version):
        versions = self.subjects.get(subject)
        if not versions:
            return None, (40401, f"Subject '{subject}' not found.")
        if version in ("latest", "-1"):
            chosen = versions[-1]
        else:
            matches = [v for v in versions if str(v["version"]) == version]
            if not matches:
                return None, (40402, f"Version {version} not found.")
            chosen = matches[0]
        return self.body(subject, chosen), None

    def body(self, subject, entry):
        schema = self.schemas[entry["id"] - 1]
        out = {"subject": subject, "version": entry["version"], "id": entry["id"], "schema": schema["schema"]}
        if schema.get("schemaType", "AVRO") != "AVRO":
            out["schemaType"] = schema["schemaType"]
        if schema.get("references"):
            out["references"] = schema["references"]
        return out


def normalize(body):
    out = {
        "schema": body["schema"],
        "schemaType": body.get("schemaType") or "AVRO",
        "references": body.get("references") or [],
    }
    if body.get("serialized"):
        out["serialized"] = body["serialized"]
    return out


def formatted(body, schema, query):
    """`body` with the schema text as `?format=` asks for it."""
    if "format=serialized" in query and schema.get("serialized"):
        body["schema"] = schema["serialized"]
    return body


def secret_in_file(path):
    """PATH's content less one trailing line break, as the connector reads a secret file."""
    with open(path) as f:
        text = f.read()
    if text.endswith("\n"):
        text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
    return text


def serve(port, state_file, credentials, bearer_file, tls, unavailable):
    store = Store(state_file)

    def expected():
        """The Authorization header a request needs, read now (None: any request is served)."""
        if credentials:
            return "Basic " + base64.b64encode(credentials.encode()).decode()
        if bearer_file:
            return "Bearer " + secret_in_file(bearer_file)
        return None

    context = None
    if tls:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile=tls[0], keyfile=tls[1])

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            # The handshake happens here, on the request's own thread: a client that refuses the
            # certificate (or a port probe) fails alone, and never stalls the accepting thread.
            if context:
                self.request = context.wrap_socket(self.request, server_side=True)
            super().setup()

        def log_message(self, fmt, *args):
            sys.stderr.write("registry: " + (fmt % args) + "\n")

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def error(self, status, code, message):
            self.reply(status, {"error_code": code, "message": message})

        def authorized(self):
            if unavailable:
                self.error(503, 50301, "Service Unavailable")
                return False
            wanted = expected()
            if wanted and self.headers.get("Authorization") != wanted:
                self.error(401, 40101, "Unauthorized")
                return False
            return True

        def parts(self):
            url = urlparse(self.path)
            return [unquote(p) for p in url.path.strip("/").split("/") if p]

        def do_GET(self):
            if not self.authorized():
                return
            p = self.parts()
            if p == ["subjects"]:
                return self.reply(200, sorted(store.subjects))
            if p[:1] == ["config"]:
                return self.reply(200, {"compatibilityLevel": "NONE"})
            if len(p) == 3 and p[0] == "subjects" and p[2] == "versions":
                versions = store.subjects.get(p[1])
                if not versions:
                    return self.error(404, 40401, f"Subject '{p[1]}' not found.")
                return self.reply(200, [v["version"] for v in versions])
            if len(p) == 4 and p[0] == "subjects" and p[2] == "versions":
                body, err = store.version(p[1], p[3])
                if err:
                    return self.error(404, *err)
                schema = store.schemas[body["id"] - 1]
                return self.reply(200, formatted(body, schema, urlparse(self.path).query))
            if len(p) >= 3 and p[:2] == ["schemas", "ids"] and p[2].isdigit():
                sid = int(p[2])
                if not 1 <= sid <= len(store.schemas):
                    return self.error(404, 40403, f"Schema {sid} not found")
                if len(p) == 4 and p[3] == "versions":
                    found = [
                        {"subject": s, "version": v["version"]}
                        for s, vs in store.subjects.items()
                        for v in vs
                        if v["id"] == sid
                    ]
                    return self.reply(200, found)
                schema = store.schemas[sid - 1]
                out = {"schema": schema["schema"]}
                if schema.get("schemaType", "AVRO") != "AVRO":
                    out["schemaType"] = schema["schemaType"]
                if schema.get("references"):
                    out["references"] = schema["references"]
                return self.reply(200, formatted(out, schema, urlparse(self.path).query))
            return self.error(404, 404, f"no route {self.path}")

        def do_POST(self):
            if not self.authorized():
                return
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            p = self.parts()
            if len(p) == 3 and p[0] == "subjects" and p[2] == "versions":
                return self.reply(200, {"id": store.register(p[1], normalize(body))})
            if len(p) == 2 and p[0] == "subjects":
                wanted = normalize(body)
                for v in store.subjects.get(p[1], []):
                    known = store.schemas[v["id"] - 1]
                    if {k: known[k] for k in wanted} == wanted:
                        return self.reply(200, store.body(p[1], v))
                return self.error(404, 40403, "Schema not found")
            return self.error(404, 404, f"no route {self.path}")

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            # One line (a refused handshake, a closed connection), not a traceback per port probe.
            print(f"registry: {client_address}: {sys.exc_info()[1]!r}", file=sys.stderr, flush=True)

    server = Server(("127.0.0.1", port), Handler)
    scheme = "https" if context else "http"
    print(f"registry: serving {scheme} on {port}", file=sys.stderr, flush=True)
    server.serve_forever()


def plain(value):
    """A decoded value as JSON text the test compares exactly."""
    import datetime
    import decimal
    import uuid

    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value


def protobuf(client, data, ctx):
    """ProtobufDeserializer wants the message class up front: it is built from the writer schema the
    frame's id names (with its references), as the message the frame's index array names; the deserializer
    then reads the frame (magic byte, id, message indexes) and the message. Returned as Protobuf's
    canonical JSON."""
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from google.protobuf import descriptor_pb2, json_format
    from google.protobuf.descriptor_pool import DescriptorPool
    from google.protobuf.message_factory import GetMessageClass

    pool = DescriptorPool()

    def add(schema_str, references):
        for ref in references or []:
            registered = client.get_version(ref.subject, ref.version, fmt="serialized")
            add(registered.schema.schema_str, registered.schema.references)
        fd = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema_str))
        try:
            pool.Add(fd)
        except TypeError:
            pass  # added already, by another reference
        return fd

    writer = client.get_schema(int.from_bytes(data[1:5], "big"), fmt="serialized")
    fd = add(writer.schema_str, writer.references)
    # The deserializer parses with the class it is given: the one the frame's message-index array names,
    # read by confluent-kafka's own SchemaId (a top-level message: one index).
    from confluent_kafka.schema_registry.common.serde import SchemaId
    frame = SchemaId("PROTOBUF")
    frame.from_bytes(io.BytesIO(data))
    indexes = frame.message_indexes or [0]
    assert len(indexes) == 1, f"a nested message index {indexes}"
    name = ".".join(filter(None, [fd.package, fd.message_type[indexes[0]].name]))
    message_class = GetMessageClass(pool.FindMessageTypeByName(name))
    message = ProtobufDeserializer(message_class, {}, client)(data, ctx)
    return json_format.MessageToDict(message)


def decode(url, credentials, bearer_file, ca_file):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    conf = {"url": url}
    if credentials:
        conf["basic.auth.user.info"] = credentials
    if bearer_file:
        # A static token needs a logical cluster (Confluent Cloud's header); this registry ignores it.
        conf["bearer.auth.credentials.source"] = "STATIC_TOKEN"
        conf["bearer.auth.token"] = secret_in_file(bearer_file)
        conf["bearer.auth.logical.cluster"] = "lsrc-test"
    if ca_file:
        conf["ssl.ca.location"] = ca_file
    client = SchemaRegistryClient(conf)
    deserializers = {
        "avro": AvroDeserializer(client),
        "json": JSONDeserializer(None, schema_registry_client=client),
        "protobuf": lambda data, ctx: protobuf(client, data, ctx),
    }
    for line in sys.stdin:
        if not line.strip():
            continue
        item = json.loads(line)
        data = bytes.fromhex(item["hex"])
        field = MessageField.KEY if item.get("field") == "key" else MessageField.VALUE
        ctx = SerializationContext(item["topic"], field)
        try:
            value = deserializers[item["format"]](data, ctx)
            out = {"id": int.from_bytes(data[1:5], "big"), "value": plain(value)}
        except Exception as e:  # the test shows what the decoder said
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)


class Computed(Exception):
    """The subject a serializer's strategy answered: raised to stop the serializer there."""


def subject(strategy, topic, fmt, schema_file, proto_name):
    """The subjects confluent-kafka's serializer computes (see the module docs): each serializer is
    given the strategy wrapped so that its answer stops the serialization before any registry call."""
    import confluent_kafka.schema_registry as sr
    from confluent_kafka.serialization import MessageField, SerializationContext

    strategies = {
        "record_name": sr.record_subject_name_strategy,
        "topic_record_name": sr.topic_record_subject_name_strategy,
    }
    chosen = strategies[strategy]

    def stop(ctx, record_name):
        raise Computed(chosen(ctx, record_name))

    conf = {"auto.register.schemas": False, "subject.name.strategy": stop}
    # Never asked: the serializer stops at the strategy.
    client = sr.SchemaRegistryClient({"url": "http://127.0.0.1:9"})
    ctx = SerializationContext(topic, MessageField.VALUE)

    def computed(serializer, value):
        try:
            serializer(value, ctx)
        except Computed as answer:
            return answer.args[0]
        raise SystemExit("the serializer never asked its subject name strategy")

    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        with open(schema_file) as f:
            text = f.read()
        print(computed(AvroSerializer(client, text, conf=conf), {}))
    elif fmt == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from google.protobuf import descriptor_pb2
        from google.protobuf.descriptor_pool import DescriptorPool
        from google.protobuf.message_factory import GetMessageClass

        with open(schema_file, "rb") as f:
            descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        pool = DescriptorPool()
        for fd in descriptor_set.file:  # --include_imports: each file after the files it imports
            pool.Add(fd)
        (fd,) = [fd for fd in descriptor_set.file if fd.name == proto_name]
        for message in fd.message_type:
            name = ".".join(filter(None, [fd.package, message.name]))
            message_class = GetMessageClass(pool.FindMessageTypeByName(name))
            print(computed(ProtobufSerializer(message_class, client, conf=conf), message_class()))
    else:
        sys.exit(f"subject: unknown format {fmt}")


def main():
    import argparse

    parser = argparse.ArgumentParser(description="A Schema Registry for the tests (see the module docs).")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_args = commands.add_parser("serve")
    serve_args.add_argument("port", type=int)
    serve_args.add_argument("state_file")
    serve_auth = serve_args.add_mutually_exclusive_group()
    serve_auth.add_argument("credentials", nargs="?")
    serve_auth.add_argument("--bearer-file")
    serve_args.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    serve_args.add_argument("--unavailable", action="store_true")
    decode_args = commands.add_parser("decode")
    decode_args.add_argument("url")
    decode_auth = decode_args.add_mutually_exclusive_group()
    decode_auth.add_argument("credentials", nargs="?")
    decode_auth.add_argument("--bearer-file")
    decode_args.add_argument("--ca-file")
    subject_args = commands.add_parser("subject")
    subject_args.add_argument("strategy", choices=["record_name", "topic_record_name"])
    subject_args.add_argument("topic")
    subject_args.add_argument("format", choices=["avro", "protobuf"])
    subject_args.add_argument("schema_file")
    subject_args.add_argument("proto_name", nargs="?")
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.port, args.state_file, args.credentials, args.bearer_file, args.tls, args.unavailable)
    elif args.command == "decode":
        decode(args.url, args.credentials, args.bearer_file, args.ca_file)
    else:
        subject(args.strategy, args.topic, args.format, args.schema_file, args.proto_name)


if __name__ == "__main__":
    main()
