"""kubernetes-validate's schemas -> files kubeconform can compile from disk.

usage: k8s_schemas.py DIR

The wheel's schemas name themselves with an `$id` under https://kubernetes.io/api/ and point
at `/api/_definitions.json`, which its own Python resolver maps; kubeconform would fetch those
URLs. Without the `$id` and with a relative reference, every file resolves its definitions
from the same directory. Rewritten in place.
"""
import json
import os
import sys


def fix(node):
    if isinstance(node, dict):
        node.pop("$id", None)
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("/api/_definitions.json#"):
            node["$ref"] = ref[len("/api/"):]
        for v in node.values():
            fix(v)
    elif isinstance(node, list):
        for v in node:
            fix(v)
    return node


def main(d):
    n = 0
    for name in os.listdir(d):
        if name.endswith(".json"):
            p = os.path.join(d, name)
            with open(p) as f:
                s = json.load(f)
            with open(p, "w") as f:
                json.dump(fix(s), f)
            n += 1
    if n == 0:
        sys.exit(f"no schema in {d}")


if __name__ == "__main__":
    main(sys.argv[1])
