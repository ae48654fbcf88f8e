"""A small kustomize, enough for deploy/kubernetes/, so its manifests are rendered and validated
where no kustomize binary is installed. ``kubectl kustomize`` renders the same (a test compares
them wherever kubectl is present).

Supported: ``resources`` (files and directories), ``patches`` (strategic merge, by file, matched
on kind and name), ``labels`` (metadata only), ``images`` and ``namespace``; anything else
raises, so the renderer can never silently ignore what the real kustomize would apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

_SUPPORTED = {"apiVersion", "kind", "resources", "patches", "labels", "images", "namespace"}
# Strategic-merge keys of the lists we patch (from the Kubernetes API's patchMergeKey).
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}
_CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


def build(directory: Path) -> list[Doc]:
    """Render the kustomization in ``directory``."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(k) - _SUPPORTED
    if unsupported:
        raise NotImplementedError(f"{directory}: {sorted(unsupported)}")
    docs: list[Doc] = []
    for entry in k.get("resources", []):
        path = directory / entry
        docs += (
            build(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
        )
    for patch in k.get("patches", []):
        if set(patch) != {"path"}:
            raise NotImplementedError(f"{directory}: only patches by path: {patch}")
        body = yaml.safe_load((directory / patch["path"]).read_text())
        (i,) = [i for i, d in enumerate(docs) if _id(d) == _id(body)]
        docs[i] = merge(docs[i], body)
    for entry in k.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise NotImplementedError(f"{directory}: labels on selectors or templates")
        for d in docs:
            d["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for image in k.get("images", []):
        for container in _containers(docs):
            if _image_name(container["image"]) == image["name"]:
                container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    if "namespace" in k:
        for d in docs:
            if d["kind"] not in _CLUSTER_SCOPED:
                d["metadata"]["namespace"] = k["namespace"]
    return docs


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge patch: maps merge, lists with a merge key merge by it, others replace."""
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return patch
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif key in _MERGE_KEYS and isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], value, _MERGE_KEYS[key])
        else:
            out[key] = merge(out.get(key), value)
    return out


def _merge_list(base: list[Any], patch: list[Any], key: str) -> list[Any]:
    """Items already in ``base`` are patched in place; new ones come first, in the patch's
    order, as kubectl's strategic merge puts them."""
    out = list(base)
    new = []
    for item in patch:
        index = [i for i, b in enumerate(out) if b.get(key) == item.get(key)]
        if index:
            out[index[0]] = merge(out[index[0]], item)
        else:
            new.append(item)
    return new + out


def _id(doc: Doc) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def _image_name(image: str) -> str:
    name = image.split("@", 1)[0]
    head, _, tail = name.rpartition(":")
    return head if head and "/" not in tail else name


def _containers(docs: list[Doc]) -> list[Doc]:
    out: list[Doc] = []
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec", {})
        out += spec.get("containers", []) + spec.get("initContainers", [])
    return out
