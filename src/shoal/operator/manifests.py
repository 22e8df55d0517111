"""The Kubernetes objects the operator creates for a Dataset, as pure functions.

Each Dataset gets a PersistentVolume served by the CSI driver ``csi.shoal.io``
(volumeAttributes ``dataset`` = the master's dataset name: the node plugin bind-mounts
``<node mount root>/<dataset>`` read-only into the pod) and a PersistentVolumeClaim of
the Dataset's name bound to it, which pods mount. The PVC is owned by the Dataset; the
PV is cluster-scoped (it cannot have a namespaced owner) and is deleted by the
Dataset's finalizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.operator.crds import API_VERSION, CSI_DRIVER, DATASET_LABEL

#: a nominal size: the cache has no fixed size, but a PV must state one
CAPACITY = "1Pi"
STORAGE_CLASS = "shoal"


def pv_name(namespace: str, name: str) -> str:
    return f"shoal-{namespace}-{name}"[:253]


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "Dataset",
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def persistent_volume(
    namespace: str, name: str, dataset: str, node_affinity: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "capacity": {"storage": CAPACITY},
        "accessModes": ["ReadOnlyMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": STORAGE_CLASS,
        "claimRef": {"namespace": namespace, "name": name},
        "csi": {
            "driver": CSI_DRIVER,
            "volumeHandle": dataset,
            "readOnly": True,
            "volumeAttributes": {"dataset": dataset},
        },
    }
    required = (node_affinity or {}).get("required")
    if required:
        spec["nodeAffinity"] = {"required": dict(required)}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name(namespace, name), "labels": {DATASET_LABEL: dataset}},
        "spec": spec,
    }


def persistent_volume_claim(body: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": {DATASET_LABEL: dataset},
            "ownerReferences": [owner_reference(body)],
        },
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": STORAGE_CLASS,
            "volumeName": pv_name(meta["namespace"], meta["name"]),
            "resources": {"requests": {"storage": CAPACITY}},
        },
    }
