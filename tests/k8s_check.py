#!/usr/bin/env python3
"""Validates Kubernetes manifests against a CustomResourceDefinition's openAPIV3Schema.

usage: k8s_check.py CRD.yaml MANIFEST.yaml

Checks, for every document of MANIFEST: apiVersion is the CRD's group/version (a served
version), kind is the CRD's kind, metadata.name is a DNS-1123 subdomain, and the object
satisfies the version's schema (Draft 4 JSON Schema, which the OpenAPI v3 subset of a
structural schema is), with one addition: like `kubectl apply --validate=strict`, a field
the schema does not declare is an error (an object schema with properties and without
additionalProperties or x-kubernetes-preserve-unknown-fields gets additionalProperties:
false). Prints one line per error and exits 1 if there is any, else prints "ok N document(s)".
"""
import re
import sys

import jsonschema
import yaml


def strict(node):
    if isinstance(node, dict):
        out = {k: strict(v) for k, v in node.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        if out.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        return out
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def main():
    if len(sys.argv) != 3:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        crd = yaml.safe_load(f)
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    schemas = {group + "/" + v["name"]: strict(v["schema"]["openAPIV3Schema"])
               for v in crd["spec"]["versions"] if v.get("served")}
    with open(sys.argv[2]) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    errors = []
    if not docs:
        errors.append("no document")
    name_re = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    for i, d in enumerate(docs):
        where = "document %d" % (i + 1)
        if not isinstance(d, dict):
            errors.append("%s: not a mapping" % where)
            continue
        api = d.get("apiVersion")
        if api not in schemas:
            errors.append("%s: apiVersion %r: not one of %s" % (where, api, ", ".join(sorted(schemas))))
            continue
        if d.get("kind") != kind:
            errors.append("%s: kind %r: expected %s" % (where, d.get("kind"), kind))
        name = (d.get("metadata") or {}).get("name")
        if not isinstance(name, str) or len(name) > 253 or not name_re.match(name):
            errors.append("%s: metadata.name %r: not a DNS-1123 subdomain" % (where, name))
        v = jsonschema.Draft4Validator(schemas[api])
        for e in sorted(v.iter_errors(d), key=lambda e: list(e.absolute_path)):
            path = ".".join(str(p) for p in e.absolute_path) or "(root)"
            errors.append("%s: %s: %s" % (where, path, e.message))
    for e in errors:
        print(e)
    if errors:
        return 1
    print("ok %d document(s)" % len(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
