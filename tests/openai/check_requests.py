#!/usr/bin/env python3
"""Validates request bodies against OpenAI's own description of the Responses API.

usage: check_requests.py SCHEMA BODIES

SCHEMA is tests/fixtures/openai-openapi/create-response.schema.json (the CreateResponse
schema of openai/openai-openapi's openapi.json and every schema it refers to; see the
README beside it); BODIES a file holding a JSON list of request bodies. The schema lets
unknown top-level keys through, so they are checked apart: every key of a body must be
one of CreateResponse's properties. Prints one line per body, "ok" or what is wrong, and
exits 1 when any body is wrong.
"""
import json
import sys

from jsonschema import Draft202012Validator


def properties(node, schemas, seen):
    """The property names a schema allows at its top level, through allOf and $ref."""
    names = set()
    if not isinstance(node, dict):
        return names
    ref = node.get("$ref")
    if ref and ref not in seen:
        seen.add(ref)
        names |= properties(schemas[ref.split("/")[-1]], schemas, seen)
    names |= set(node.get("properties", {}))
    for part in node.get("allOf", []):
        names |= properties(part, schemas, seen)
    return names


def main():
    schema = json.load(open(sys.argv[1]))
    bodies = json.load(open(sys.argv[2]))
    schemas = schema["components"]["schemas"]
    known = properties(schemas["CreateResponse"], schemas, set())
    validator = Draft202012Validator(schema)
    wrong = 0
    for body in bodies:
        errors = [
            f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:300]}"
            for e in validator.iter_errors(body)
        ]
        errors += [f"unknown top-level key {key!r}" for key in sorted(set(body) - known)]
        print("ok" if not errors else "; ".join(errors))
        wrong += bool(errors)
    sys.exit(1 if wrong else 0)


main()
