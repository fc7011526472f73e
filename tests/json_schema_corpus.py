#!/usr/bin/env python3
"""Reads the JSON Schema corpus with Python's jsonschema and confluent-kafka's JSONDeserializer.

Run by tests/json_schema_corpus.rs with one argument: a JSON file holding an array of cases ({"file", "case",
"schema" (text), "references" ([{"name", "subject", "version", "references", "schema" (text)}]),
"refused_schema", "payload" (text), "id", "framed" (base64, where the connector accepted the payload), "valid",
"python", "confluent_python", "why"}). Each payload is read twice, from the untouched texts:

- the draft's reading: jsonschema's validator class for the schema's draft as Confluent's registry selects it
  (a `$schema` naming a draft by http or https, with or without `#`, `json-schema.org/schema` as draft-04;
  any other, or none: draft-07; the `$schema` is spelled as jsonschema knows that draft, or dropped), the
  schema checked against its meta-schema first, no format checker (confluent-kafka passes none), each
  reference a resource under its name and, where the root has an `$id`, under the name resolved against it
  (where Confluent's Java serializers register it), read in its own `$schema`'s draft or else the root's;
  the payload read exactly by Python's json (integers of any size). Its verdict must be `python` if given,
  else `valid`;
- a consumer's reading: confluent-kafka's JSONDeserializer (validation on, its default) on the framed record,
  its registry a MockSchemaRegistryClient holding each reference under its subject and the schema under the
  framed id (a refused payload is framed here the same way). Its verdict must be `confluent_python` if given,
  else `valid`. Nothing is fetched: the deserializer's fetcher for unknown `$ref` URLs is replaced by one
  that finds nothing.

The framing of an accepted payload must be 0x00, the id (4 bytes, big-endian), then the payload text's bytes.
A departure (`python`, `confluent_python`) must differ from `valid`, so a stale one fails. One line per
failure on stdout; exit status 1 if there is any.
"""

import base64
import json
import sys
import warnings
from collections import OrderedDict
from urllib.parse import urljoin

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
from confluent_kafka.schema_registry import Schema, SchemaReference
from confluent_kafka.schema_registry._sync import json_schema as confluent_json_schema
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry._sync.mock_schema_registry_client import MockSchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

warnings.simplefilter("ignore", DeprecationWarning)  # validator_for on a $schema it does not know
warnings.simplefilter("ignore", FutureWarning)  # Python's re on `[[`, `&&` in a class: literal, as ECMA-262 reads them

DRAFTS = {
    "json-schema.org/draft-04/schema": jsonschema.Draft4Validator,
    "json-schema.org/schema": jsonschema.Draft4Validator,  # the former "latest", as Confluent's registry reads it
    "json-schema.org/draft-06/schema": jsonschema.Draft6Validator,
    "json-schema.org/draft-07/schema": jsonschema.Draft7Validator,
    "json-schema.org/draft/2019-09/schema": jsonschema.Draft201909Validator,
    "json-schema.org/draft/2020-12/schema": jsonschema.Draft202012Validator,
}


def named_draft(schema):
    """The validator class of the draft `schema`'s `$schema` names, or None."""
    if not isinstance(schema, dict) or not isinstance(schema.get("$schema"), str):
        return None
    uri = schema["$schema"]
    uri = uri[:-1] if uri.endswith("#") else uri
    for scheme in ("http://", "https://"):
        if uri.startswith(scheme):
            return DRAFTS.get(uri[len(scheme):])
    return None


def as_draft(schema, cls):
    """`schema` with its `$schema` spelled as jsonschema knows `cls`'s (or without one: it reads in `cls`)."""
    if not isinstance(schema, dict) or "$schema" not in schema:
        return schema
    schema = dict(schema)
    if named_draft(schema) is cls:
        schema["$schema"] = cls.ID_OF(cls.META_SCHEMA)
    else:
        del schema["$schema"]
    return schema


class DraftReading:
    """jsonschema with the draft's validator, from the schema and reference texts (see the module doc)."""

    def __init__(self, schema_text, references):
        root = json.loads(schema_text)
        self.cls = named_draft(root) or jsonschema.Draft7Validator
        root = as_draft(root, self.cls)
        self.cls.check_schema(root)
        spec = referencing.jsonschema.specification_with(self.cls.ID_OF(self.cls.META_SCHEMA))
        base = self.cls.ID_OF(root) if isinstance(root, dict) else None
        registry = referencing.Registry()
        for reference in references:
            contents = json.loads(reference["schema"])
            own = named_draft(contents) or self.cls
            resource = referencing.Resource.from_contents(as_draft(contents, own), default_specification=spec)
            registry = registry.with_resource(reference["name"], resource)
            if base:
                registry = registry.with_resource(urljoin(base, reference["name"]), resource)
        self.validator = self.cls(root, registry=registry)

    def verdict(self, payload_text):
        return self.validator.is_valid(json.loads(payload_text))


def refuse_retrieval(uri):
    raise referencing.exceptions.NoSuchResource(ref=uri)


class ConsumerReading:
    """confluent-kafka's JSONDeserializer, its registry a mock holding the schema under `schema_id`."""

    def __init__(self, schema_text, references, schema_id):
        confluent_json_schema._retrieve_via_httpx = refuse_retrieval
        self.client = MockSchemaRegistryClient({"url": "mock://corpus"})
        by_name = {r["name"]: r for r in references}

        def refs(names):
            return [SchemaReference(n, by_name[n]["subject"], by_name[n]["version"]) for n in names]

        for reference in references:
            version = self.client.register_schema_full_response(
                reference["subject"], Schema(reference["schema"], "JSON", refs(reference["references"]))).version
            assert version == reference["version"], reference
        # The mock numbers schemas one after another: the schema gets the id the connector framed with.
        self.client._store.max_id = schema_id - 1
        registered = self.client.register_schema("corpus-value", Schema(schema_text, "JSON", refs(by_name)))
        assert registered == schema_id, (registered, schema_id)
        self.deserializer = JSONDeserializer(None, schema_registry_client=self.client)
        self.context = SerializationContext("corpus", MessageField.VALUE)

    def verdict(self, framed):
        try:
            self.deserializer(framed, self.context)
            return True, None
        except Exception as e:  # a validation error, a schema error, an unreadable number: refused
            return False, one_line(e)


def one_line(e):
    """An exception as one line: its type and the first line of its message."""
    lines = str(getattr(e, "message", None) or e).splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def frame(schema_id, payload_text):
    return b"\x00" + schema_id.to_bytes(4, "big") + payload_text.encode("utf-8")


def verdicts(entries):
    """Failures of one corpus file's cases."""
    first = entries[0]
    problems = []
    try:
        draft = DraftReading(first["schema"], first["references"])
    except Exception as e:  # the draft's meta-schema refuses the schema: every payload is refused
        draft, draft_error = None, one_line(e)
    consumer = ConsumerReading(first["schema"], first["references"], first["id"])
    for entry in entries:
        at = f"{entry['file']} {entry['case']}"
        for field in ("python", "confluent_python"):
            if entry[field] is not None and entry[field] == entry["valid"]:
                problems.append(f"{at}: `{field}` repeats `valid`: a departure that is no longer one")
        if entry["framed"] is not None:
            framed = base64.b64decode(entry["framed"])
            if framed != frame(entry["id"], entry["payload"]):
                problems.append(f"{at}: the framed record {framed!r} is not 0x00, id {entry['id']}, the text")
        else:
            framed = frame(entry["id"], entry["payload"])
        if draft is None:
            got, why = False, draft_error
        else:
            try:
                got, why = draft.verdict(entry["payload"]), None
            except referencing.exceptions.Unresolvable as e:
                got, why = False, one_line(e)
        want = entry["valid"] if entry["python"] is None else entry["python"]
        if got != want:
            problems.append(f"{at}: jsonschema ({draft.cls.__name__ if draft else 'no schema'}) says "
                            f"{'valid' if got else 'invalid'}{f' ({why})' if why else ''}, expected "
                            f"{'valid' if want else 'invalid'}")
        got, why = consumer.verdict(framed)
        want = entry["valid"] if entry["confluent_python"] is None else entry["confluent_python"]
        if got != want:
            problems.append(f"{at}: confluent-kafka's JSONDeserializer {'accepts' if got else 'refuses'} "
                            f"the record{f' ({why})' if why else ''}, expected it to "
                            f"{'accept' if want else 'refuse'}")
    return problems


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        entries = json.load(f)
    files = OrderedDict()
    for entry in entries:
        files.setdefault(entry["file"], []).append(entry)
    failures = 0
    for file_entries in files.values():
        for problem in verdicts(file_entries):
            failures += 1
            print(problem)
    print(f"{len(entries)} cases in {len(files)} schemas read by jsonschema {jsonschema_version()} and "
          f"confluent-kafka's JSONDeserializer: {failures} failures", file=sys.stderr)
    sys.exit(1 if failures else 0)


def jsonschema_version():
    from importlib.metadata import version
    return version("jsonschema")


if __name__ == "__main__":
    main()
