"""CustomResourceDefinitions -> the JSON schemas kubeconform reads, strict.

usage: crd_schemas.py CRD_DIR OUT_DIR

Each served version of each CRD in CRD_DIR (*.yaml) becomes
OUT_DIR/<group>/<kind>_<version>.json (kind in lower case), for kubeconform's
`-schema-location 'OUT_DIR/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json'`.
Strict as the API server is with a structural schema: an object that lists its properties
and does not preserve unknown fields accepts no other key, so a misspelt field is an error
rather than silently pruned.
"""
import json
import os
import sys

import yaml


def strict(node):
    if isinstance(node, dict):
        if (
            node.get("type") == "object"
            and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for v in node.values():
            strict(v)
    elif isinstance(node, list):
        for v in node:
            strict(v)
    return node


def main(src, out):
    n = 0
    for name in sorted(os.listdir(src)):
        if not name.endswith((".yaml", ".yml")):
            continue
        with open(os.path.join(src, name)) as f:
            for doc in yaml.safe_load_all(f):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                spec = doc["spec"]
                group, kind = spec["group"], spec["names"]["kind"].lower()
                for ver in spec["versions"]:
                    if not ver.get("served", True):
                        continue
                    schema = strict(ver["schema"]["openAPIV3Schema"])
                    d = os.path.join(out, group)
                    os.makedirs(d, exist_ok=True)
                    with open(os.path.join(d, f"{kind}_{ver['name']}.json"), "w") as o:
                        json.dump(schema, o)
                    n += 1
    if n == 0:
        sys.exit(f"no CustomResourceDefinition in {src}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
