#!/usr/bin/env python3
"""Decodes the connector's Protobuf messages with protoc-built descriptors and Python's protobuf runtime.

Run by tests/protobuf_corpus.rs with one argument: a JSON file holding
  {"builtin_dir": the writer's embedded built-in imports,
   "schemas": [{"file", "schema" (the .proto text), "references": [{"name", "schema"}]}],
   "checked": [{"file", "case", "message" (full name), "payload" (the row's JSON text),
                "datum" (base64: message-index array + message; null for a refused payload),
                "expected" (canonical, see tests/protobuf_corpus.rs), "python_accepts"}]}.

Each schema is compiled from its text by protoc (`python3 -m grpc_tools.protoc --include_imports
--descriptor_set_out`), with the references under their import paths, Google's common types
(`google/type/*.proto`) from googleapis-common-protos, and Confluent's `confluent/*` files from the
descriptors confluent-kafka itself ships (`--descriptor_set_in`): never from the writer's copies. The
message classes are built from that descriptor set (descriptor_pool + message_factory).

For a datum: the Confluent message-index array is read here (zigzag varints; a single 0x00 is [0]) and
must name the expected message; `ParseFromString` reads the rest, which must hold no unknown field at any
depth, have every required field (`IsInitialized`), re-serialize deterministically to the same bytes, equal
the expected value, and be byte for byte what Python's JSON reader (`json_format.Parse`) makes of the
payload text. A message holding a map of two or more entries is compared as a value instead of as bytes:
Python's upb runtime writes map entries in its own order, deterministic or not (the writer writes them in
key order, as protoc's C++ runtime does).
For a refusal: Python's JSON reader must refuse the payload too, or the message it makes must lack a
required field, unless the case says why the writer refuses what Python accepts.

The built-in imports the writer embeds are checked against the same sources: each google/type file
byte for byte, each confluent file by the descriptor protoc makes of it.

One line per failure on stdout; a summary on stderr; exit status 1 if there is any failure.
"""

import base64
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile

import grpc_tools
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory, text_format, unknown_fields
from google.protobuf.descriptor import FieldDescriptor

from confluent_kafka.schema_registry.confluent import meta_pb2
from confluent_kafka.schema_registry.confluent.type import decimal_pb2, variant_pb2
from confluent_kafka.schema_registry.confluent.types import decimal_pb2 as legacy_decimal_pb2

MAIN = "registered.proto"
GOOGLE_TYPE = importlib.util.find_spec("google.type").submodule_search_locations[0]
GOOGLEAPIS_INCLUDE = os.path.dirname(os.path.dirname(GOOGLE_TYPE))
PROTOBUF_INCLUDE = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
CONFLUENT = {m.DESCRIPTOR.name: m for m in (meta_pb2, decimal_pb2, variant_pb2, legacy_decimal_pb2)}


class Problem(Exception):
    pass


def same(a, b):
    """Equality that tells a boolean from a number, a string from a number, and -0.0 from 0.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) and isinstance(b, float) and (math.isnan(a) or math.isnan(b)):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def confluent_descriptor_set(path):
    """confluent-kafka's own descriptors of the confluent/* files, for protoc's --descriptor_set_in."""
    files = descriptor_pb2.FileDescriptorSet()
    descriptor_pb2.DESCRIPTOR.CopyToProto(files.file.add())
    for module in CONFLUENT.values():
        module.DESCRIPTOR.CopyToProto(files.file.add())
    with open(path, "wb") as f:
        f.write(files.SerializeToString())


def protoc(includes, names, descriptor_set_in, out):
    args = [sys.executable, "-m", "grpc_tools.protoc", f"--descriptor_set_out={out}", "--include_imports"]
    if descriptor_set_in:
        args.append(f"--descriptor_set_in={descriptor_set_in}")
    args += [f"-I{i}" for i in includes] + list(names)
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        raise Problem(f"protoc refuses the schema: {run.stderr.strip()}")
    files = descriptor_pb2.FileDescriptorSet()
    with open(out, "rb") as f:
        files.ParseFromString(f.read())
    return files


def compile_schema(schema, work, confluent_set):
    """protoc's descriptor pool for the registered text and its references."""
    src = os.path.join(work, "src")
    for name, text in [(MAIN, schema["schema"])] + [(r["name"], r["schema"]) for r in schema["references"]]:
        path = os.path.join(src, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    files = protoc([src, GOOGLEAPIS_INCLUDE, PROTOBUF_INCLUDE], [os.path.join(src, MAIN)], confluent_set,
                   os.path.join(work, "set.pb"))
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return pool


def varint(data, pos):
    shift = result = 0
    while True:
        if pos >= len(data):
            raise Problem("the message-index array ends inside a varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def zigzag(n):
    return (n >> 1) ^ -(n & 1)


def message_indexes(data):
    """Confluent's message-index array: a zigzag count, then that many zigzag indexes; a count of 0 is [0]."""
    count, pos = varint(data, 0)
    count = zigzag(count)
    if count == 0:
        return [0], pos
    indexes = []
    for _ in range(count):
        index, pos = varint(data, pos)
        indexes.append(zigzag(index))
    return indexes, pos


def indexed_message(pool, indexes):
    file = pool.FindFileByName(MAIN)
    top = list(file.message_types_by_name.values())
    if not 0 <= indexes[0] < len(top):
        raise Problem(f"message index {indexes} names no message of the schema")
    message = top[indexes[0]]
    for index in indexes[1:]:
        if not 0 <= index < len(message.nested_types):
            raise Problem(f"message index {indexes} names no message of the schema")
        message = message.nested_types[index]
    return message


def walk(message, path="$"):
    """(path, message) of `message` and of every message inside it, with whether it holds a map of two or more
    entries (whose order on the wire is the writer's choice, and Python's upb runtime keeps its own)."""
    found = [(path, message, False)]
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            found[0] = (path, message, found[0][2] or len(value) > 1)
            value_field = field.message_type.fields_by_name["value"]
            if value_field.message_type is not None:
                for key, item in value.items():
                    found += walk(item, f"{path}.{field.name}[{key!r}]")
        elif field.type not in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
            continue
        elif field.is_repeated:
            for i, item in enumerate(value):
                found += walk(item, f"{path}.{field.name}[{i}]")
        else:
            found += walk(value, f"{path}.{field.name}")
    return found


def canonical(message, pool):
    return json_format.MessageToDict(message, preserving_proto_field_name=True, descriptor_pool=pool)


def check_datum(entry, pool):
    data = base64.b64decode(entry["datum"])
    indexes, start = message_indexes(data)
    descriptor = indexed_message(pool, indexes)
    if descriptor.full_name != entry["message"]:
        raise Problem(f"the message-index array {indexes} names {descriptor.full_name}, expected {entry['message']}")
    cls = message_factory.GetMessageClass(descriptor)
    body = data[start:]
    message = cls()
    try:
        message.ParseFromString(body)
    except Exception as e:  # the bytes are not the message at all
        raise Problem(f"ParseFromString refuses {body.hex()}: {type(e).__name__}: {e}")
    problems = []
    inside = walk(message)
    unknown = [path for path, m, _ in inside if len(unknown_fields.UnknownFieldSet(m))]
    if unknown:
        problems.append(f"unknown fields at {', '.join(unknown)} in {body.hex()}")
    if not message.IsInitialized():
        problems.append(f"required fields missing: {', '.join(message.FindInitializationErrors())}")
        return problems
    maps = any(has_maps for _, _, has_maps in inside)
    again = message.SerializeToString(deterministic=True)
    if not maps and again != body:
        problems.append(f"re-serialized as {again.hex()[:400]}, written as {body.hex()[:400]}")
    got = canonical(message, pool)
    if not same(got, entry["expected"]):
        problems.append(f"decoded {json.dumps(got)[:2000]}, expected {json.dumps(entry['expected'])[:2000]}")
    # Python's own JSON reader, on the same text, must make the same message: the same bytes, or where maps
    # hold several entries, an equal message.
    from_json = cls()
    try:
        json_format.Parse(entry["payload"], from_json, descriptor_pool=pool)
    except Exception as e:
        problems.append(f"Python's JSON reader refuses a payload the writer wrote: {type(e).__name__}: {e}")
        return problems
    theirs = from_json.SerializeToString(deterministic=True)
    if (from_json != message) if maps else (theirs != body):
        problems.append(f"Python's JSON reader makes {canonical(from_json, pool)} of the payload, {theirs.hex()[:400]}")
    return problems


def check_refusal(entry, pool):
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(entry["message"]))
    message = cls()
    accepts = entry.get("python_accepts")
    try:
        json_format.Parse(entry["payload"], message, descriptor_pool=pool)
    except Exception as e:
        if accepts:
            return [f"python_accepts says why Python accepts it, but Python refuses: {type(e).__name__}: {e}"]
        return []
    if not message.IsInitialized():
        # Python's reader does not check required fields; its runtime refuses the message it made.
        missing = ", ".join(message.FindInitializationErrors())
        try:
            message.SerializeToString()
            return [f"Python serializes a message missing {missing}"]
        except Exception as e:
            return [f"python_accepts is not needed: {type(e).__name__}: {e}"] if accepts else []
    if accepts:
        return []
    return [f"Python's reader accepts the payload the writer refuses: {json.dumps(canonical(message, pool))[:400]}"]


def normalize(file):
    """What protoc adds or a language chooses, not the types: options (go_package), json_name, sources."""
    file.ClearField("options")
    file.ClearField("source_code_info")

    def fields(message):
        for field in list(message.field) + list(message.extension):
            field.ClearField("json_name")
        for nested in message.nested_type:
            fields(nested)

    for message in file.message_type:
        fields(message)
    for extension in file.extension:
        extension.ClearField("json_name")


def one_line(proto):
    return " ".join(text_format.MessageToString(proto).split())[:1500]


def check_builtins(builtin_dir, work, confluent_set):
    problems = []
    if not os.path.isdir(builtin_dir):
        return [f"built-in imports: the writer embeds none ({builtin_dir} does not exist)"]
    embedded_type = os.path.join(builtin_dir, "google", "type")
    upstream = sorted(n for n in os.listdir(GOOGLE_TYPE) if n.endswith(".proto"))
    for name in upstream:
        ours = os.path.join(embedded_type, name)
        if not os.path.exists(ours):
            problems.append(f"built-in imports: google/type/{name} is not embedded")
            continue
        with open(ours, encoding="utf-8") as a, open(os.path.join(GOOGLE_TYPE, name), encoding="utf-8") as b:
            if a.read() != b.read():
                problems.append(f"built-in imports: google/type/{name} differs from googleapis-common-protos'")
    for name in sorted(os.listdir(embedded_type)) if os.path.isdir(embedded_type) else []:
        if name not in upstream:
            problems.append(f"built-in imports: google/type/{name} is not googleapis-common-protos'")
    for name, module in CONFLUENT.items():
        if not os.path.exists(os.path.join(builtin_dir, name)):
            problems.append(f"built-in imports: {name} is not embedded")
            continue
        try:
            files = protoc([builtin_dir, PROTOBUF_INCLUDE], [os.path.join(builtin_dir, name)], None,
                           os.path.join(work, "builtin.pb"))
        except Problem as e:
            problems.append(f"built-in imports: {name}: {e}")
            continue
        ours = next(f for f in files.file if f.name == name)
        theirs = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(theirs)
        for proto in (ours, theirs):
            normalize(proto)
        if ours != theirs:
            problems.append(f"built-in imports: {name} defines {one_line(ours)}; confluent-kafka's {one_line(theirs)}")
    return problems


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        given = json.load(f)
    failures = 0
    decoded = refusals = 0
    with tempfile.TemporaryDirectory() as tmp:
        confluent_set = os.path.join(tmp, "confluent.pb")
        confluent_descriptor_set(confluent_set)
        for problem in check_builtins(given["builtin_dir"], tmp, confluent_set):
            failures += 1
            print(problem)
        pools = {}
        for i, schema in enumerate(given["schemas"]):
            work = os.path.join(tmp, str(i))
            try:
                pools[schema["file"]] = compile_schema(schema, work, confluent_set)
            except Problem as e:
                pools[schema["file"]] = e
        for entry in given["checked"]:
            pool = pools[entry["file"]]
            try:
                if isinstance(pool, Problem):
                    raise pool
                if entry["datum"] is None:
                    problems = check_refusal(entry, pool)
                    refusals += not problems
                else:
                    problems = check_datum(entry, pool)
                    decoded += not problems
            except Problem as e:
                problems = [str(e)]
            except Exception as e:  # anything else the runtime throws is a failure of this case
                problems = [f"{type(e).__name__}: {e}"]
            for problem in problems:
                failures += 1
                print(f"{entry['file']} {entry['case']}: {problem}")
    print(f"protoc and Python protobuf decoded {decoded} messages and refused {refusals} payloads the writer "
          f"refuses; {failures} failures", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
