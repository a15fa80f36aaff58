"""Validates Kubernetes objects offline, for tests/tests/deploy.rs.

Reads a JSON list of {"source": ..., "object": {...}} on stdin; prints one line per object, "ok"
or "FAIL" with the reason, and exits 1 when any failed. Nothing here uses the network (the test
runs it in an empty network namespace when it can):

- Kubernetes' own kinds: kubernetes-validate's JSON schemas of the API, strict (an unknown field
  fails), against the oldest and the newest Kubernetes version the package carries.
- monitoring.coreos.com kinds: cloudcoil's pydantic models generated from the Prometheus
  Operator's CRDs (types, required fields, enums, patterns). The models ignore unknown fields, so
  an object must also come back from its model unchanged: a field the CRD does not have fails.
- Any other kind fails: no schema, no pass.
"""

import json
import sys

import kubernetes_validate
from kubernetes_validate.utils import all_versions
from cloudcoil.models.prometheus_operator import v1, v1alpha1
from cloudcoil.resources import Resource

VERSIONS = [all_versions()[0], all_versions()[-1]]
OPERATOR = {"monitoring.coreos.com/v1": v1, "monitoring.coreos.com/v1alpha1": v1alpha1}


def changes(path, given, kept):
    """Where `kept` (the object as its model returned it) differs from `given`."""
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            return [f"{path}: not an object in the schema"]
        found = []
        for key, value in given.items():
            if key not in kept:
                found.append(f"{path}.{key}: unknown field")
            else:
                found += changes(f"{path}.{key}", value, kept[key])
        return found
    if isinstance(given, list):
        if not isinstance(kept, list) or len(kept) != len(given):
            return [f"{path}: not kept as a list of {len(given)}"]
        return [c for i, (g, k) in enumerate(zip(given, kept)) for c in changes(f"{path}[{i}]", g, k)]
    return [] if given == kept else [f"{path}: {given!r} became {kept!r}"]


def validate(obj):
    """What validated `obj`; raises with the reason when it is not valid."""
    api_version = obj.get("apiVersion", "")
    if api_version in OPERATOR:
        model = getattr(OPERATOR[api_version], obj.get("kind", ""), None)
        if not (isinstance(model, type) and issubclass(model, Resource)):
            raise ValueError(f"no schema for {api_version} {obj.get('kind')}")
        kept = model.model_validate(obj).model_dump(mode="json", by_alias=True, exclude_unset=True)
        found = changes("", obj, kept)
        if found:
            raise ValueError("; ".join(found))
        return f"prometheus-operator CRD model ({model.__module__})"
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as e:
            raise ValueError(e.message) from None
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            raise ValueError(f"Kubernetes {version} schema, at {where or 'the top'}: {e.message}") from None
    return "Kubernetes " + ", ".join(VERSIONS) + " strict"


def main():
    failed = 0
    for item in json.load(sys.stdin):
        obj = item["object"]
        name = f"{item['source']} {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            print(f"ok {name}: {validate(obj)}")
        except Exception as e:  # any failure of any validator is this object's failure
            failed += 1
            print(f"FAIL {name}: {' '.join(str(e).split())}")
    sys.exit(1 if failed else 0)


main()
