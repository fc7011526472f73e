#!/usr/bin/env python3
"""Decodes the connector's Avro datums with fastavro, from the schema text, and compares them.

Run by tests/avro_corpus.rs with one argument: a JSON file holding an array of the encoded corpus cases
({"file", "case", "schema", "references", "datum" (base64), "apache" (apache-avro's reading, canonical),
"expected" (canonical)}). For each, fastavro's schemaless_reader reads the datum from the schema as
registered (the references parsed first, as a registry client does), no byte may be left over, and its value
must equal the expected one; apache-avro's reading must equal it too. The canonical form is described in
tests/avro_corpus.rs. One line per failure on stdout; exit status 1 if there is any.
"""

import base64
import datetime
import decimal
import io
import json
import struct
import sys
import uuid

import fastavro

EPOCH = datetime.datetime(1970, 1, 1)
EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
NAMED = ("record", "error", "enum", "fixed")


def same(a, b):
    """Equality that tells a boolean from a number and a string from bytes (Python's == does not)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class Mismatch(Exception):
    pass


def latin1(data):
    return data.decode("latin-1")


def decimal_text(d):
    return format(d, "f")


def count(delta, unit):
    """A timedelta as a whole count of `unit`, exactly."""
    return delta // unit


class Walker:
    def __init__(self, named):
        self.named = named

    def resolve(self, schema):
        if isinstance(schema, str) and schema in self.named:
            return self.named[schema]
        return schema

    def branch_name(self, branch):
        if isinstance(branch, str):
            return branch
        if isinstance(branch, dict):
            if branch.get("type") in NAMED:
                return branch["name"]
            return self.branch_name(branch["type"])
        raise Mismatch(f"a union inside a union: {branch}")

    def walk(self, schema, got, want, path):
        schema = self.resolve(schema)
        if isinstance(schema, list):
            if want is None:
                if "null" not in schema or got is not None:
                    raise Mismatch(f"{path}: fastavro read {got!r}, expected null")
                return
            (name, inner), = want.items()
            branches = [b for b in schema if self.branch_name(b) == name]
            if not branches:
                raise Mismatch(f"{path}: the union has no branch {name}")
            return self.walk(branches[0], got, inner, f"{path}<{name}>")
        if isinstance(schema, dict):
            kind = schema["type"]
            logical = schema.get("logicalType")
            if kind in ("record", "error"):
                if not isinstance(got, dict) or set(got) != set(want):
                    raise Mismatch(f"{path}: fastavro read {got!r}, expected {want!r}")
                for field in schema["fields"]:
                    self.walk(field["type"], got[field["name"]], want[field["name"]], f"{path}.{field['name']}")
                return
            if kind == "array":
                if not isinstance(got, list) or len(got) != len(want):
                    raise Mismatch(f"{path}: fastavro read {got!r}, expected {want!r}")
                for i, (g, w) in enumerate(zip(got, want)):
                    self.walk(schema["items"], g, w, f"{path}[{i}]")
                return
            if kind == "map":
                if not isinstance(got, dict) or set(got) != set(want):
                    raise Mismatch(f"{path}: fastavro read {got!r}, expected {want!r}")
                for k in got:
                    self.walk(schema["values"], got[k], want[k], f"{path}[{k!r}]")
                return
            if kind == "enum":
                return self.leaf(got, want, path)
            if kind == "fixed":
                if logical == "decimal" and isinstance(got, decimal.Decimal):
                    return self.leaf(decimal_text(got), want, path)
                if logical == "uuid" and schema["size"] == 16:
                    return self.leaf(str(uuid.UUID(bytes=got)), want, path)
                if logical == "duration" and schema["size"] == 12:
                    months, days, millis = struct.unpack("<III", got)
                    return self.leaf({"months": months, "days": days, "millis": millis}, want, path)
                return self.leaf(latin1(got), want, path)
            if isinstance(kind, str) and logical is not None:
                return self.leaf(self.logical(kind, logical, got), want, path)
            return self.walk(kind, got, want, path)
        if schema == "bytes":
            got = latin1(got) if isinstance(got, bytes) else got
        return self.leaf(got, want, path)

    @staticmethod
    def logical(kind, logical, got):
        if isinstance(got, decimal.Decimal):
            return decimal_text(got)
        if isinstance(got, uuid.UUID):
            return str(got)
        if isinstance(got, datetime.datetime):
            unit = {"millis": datetime.timedelta(milliseconds=1), "micros": datetime.timedelta(microseconds=1)}
            per = unit[logical.rsplit("-", 1)[1]]
            return count(got - (EPOCH_UTC if got.tzinfo else EPOCH), per)
        if isinstance(got, datetime.date):
            return (got - EPOCH.date()).days
        if isinstance(got, datetime.time):
            micros = ((got.hour * 60 + got.minute) * 60 + got.second) * 1_000_000 + got.microsecond
            return micros // 1000 if logical == "time-millis" else micros
        if isinstance(got, bytes):
            return latin1(got)
        return got

    @staticmethod
    def leaf(got, want, path):
        if not same(got, want):
            raise Mismatch(f"{path}: fastavro read {got!r}, expected {want!r}")


def check(entry):
    data = base64.b64decode(entry["datum"])
    buf = io.BytesIO(data)
    problems = []
    try:
        named = {}
        for reference in entry["references"]:
            fastavro.parse_schema(reference, named_schemas=named)
        schema = fastavro.parse_schema(entry["schema"], named_schemas=named)
        got = fastavro.schemaless_reader(buf, schema, None)
        if buf.tell() != len(data):
            problems.append(f"fastavro left {len(data) - buf.tell()} of {len(data)} bytes unread")
        else:
            Walker(named).walk(schema, got, entry["expected"], "$")
    except Mismatch as e:
        problems.append(str(e))
    except Exception as e:  # a schema or datum fastavro cannot read at all
        problems.append(f"fastavro cannot read the datum {data.hex()}: {type(e).__name__}: {e}")
    if not same(entry["apache"], entry["expected"]):
        problems.append(f"apache-avro read {json.dumps(entry['apache'])}, expected {json.dumps(entry['expected'])}")
    return problems


def main():
    failures = 0
    with open(sys.argv[1], encoding="utf-8") as encoded:
        entries = json.load(encoded)
    for entry in entries:
        for problem in check(entry):
            failures += 1
            print(f"{entry['file']} {entry['case']}: {problem}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
