"""The CRDs (schemas, defaults, printer columns) and the mapping of their specs onto
the master's dataset and job specs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from openapi_schema_validator import OAS30Validator

from shoal.core.types import CachePolicy
from shoal.errors import InvalidArgument
from shoal.operator import crds, manifests

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "deploy" / "helm" / "shoal" / "crds"
EXAMPLES = ROOT / "deploy" / "examples"


def crd(plural: str) -> dict[str, Any]:
    return yaml.safe_load((CRDS / f"{plural}.shoal.io.yaml").read_text())  # type: ignore[no-any-return]


def strictify(schema: dict[str, Any]) -> dict[str, Any]:
    """What a structural schema means on a real API server: unknown fields are not
    allowed (pruned) unless preserved; here they are errors, so typos are caught."""
    s = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        preserved = node.get("x-kubernetes-preserve-unknown-fields")
        if node.get("type") == "object" and "properties" in node and not preserved:
            node.setdefault("additionalProperties", False)
        for child in (node.get("properties") or {}).values():
            walk(child)
        if isinstance(node.get("items"), dict):
            walk(node["items"])
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"])

    walk(s)
    return s


def defaulted(schema: dict[str, Any], obj: Any) -> Any:
    """Apply the schema's defaults the way the API server does."""
    if not isinstance(obj, dict) or schema.get("type") != "object":
        return obj
    out = dict(obj)
    for key, sub in (schema.get("properties") or {}).items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = defaulted(sub, out[key])
    return out


def validator(plural: str) -> tuple[OAS30Validator, dict[str, Any]]:
    version = crd(plural)["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    return OAS30Validator(strictify(schema)), schema


@pytest.mark.parametrize("plural", ["datasets", "runtimes", "dataloads"])
def test_crds_are_well_formed(plural: str) -> None:
    doc = crd(plural)
    assert doc["kind"] == "CustomResourceDefinition"
    assert doc["metadata"]["name"] == f"{plural}.shoal.io"
    assert doc["spec"]["group"] == crds.GROUP and doc["spec"]["names"]["plural"] == plural
    (version,) = doc["spec"]["versions"]
    assert version["name"] == crds.VERSION and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    OAS30Validator.check_schema(version["schema"]["openAPIV3Schema"])
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names[-1] == "Age"


def test_dataset_printer_columns_match_the_issue() -> None:
    cols = crd("datasets")["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in cols] == ["Phase", "Size", "Cached", "Hit Ratio", "Age"]
    status = crd("datasets")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "status"
    ]
    for c in cols[:-1]:
        assert c["jsonPath"].removeprefix(".status.") in status["properties"]


def test_examples_validate_and_defaults_match_the_master() -> None:
    docs = [d for p in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]
    kinds = {d["kind"] for d in docs if d}
    assert {"Dataset", "DataLoad", "Runtime"} <= kinds
    for d in docs:
        if not d or d.get("apiVersion") != crds.API_VERSION:
            continue
        v, schema = validator(d["kind"].lower() + "s")
        v.validate(d)
        v.validate(defaulted(schema, d))
    # an empty policy defaults to exactly the master's default policy
    _, schema = validator("datasets")
    ds = defaulted(schema, {"spec": {"mounts": [{"name": "m", "uri": "s3://b"}]}})
    assert crds.desired_policy(ds["spec"]["policy"]) == CachePolicy().to_dict()


@pytest.mark.parametrize(
    ("plural", "bad"),
    [
        ("datasets", {"spec": {"mounts": []}}),
        ("datasets", {"spec": {"mounts": [{"name": "m", "uri": "nope"}]}}),
        (
            "datasets",
            {"spec": {"mounts": [{"name": "m", "uri": "s3://b"}], "policy": {"replicas": 0}}},
        ),
        (
            "datasets",
            {"spec": {"mounts": [{"name": "m", "uri": "s3://b"}], "policy": {"evict": "lru"}}},
        ),
        ("datasets", {"spec": {"mounts": [{"name": "m", "uri": "s3://b", "secretKey": "x"}]}}),
        ("dataloads", {"spec": {"dataset": "d", "operation": "Copy"}}),
        ("dataloads", {"spec": {"dataset": "d", "policy": "Hourly"}}),
        ("dataloads", {"spec": {"dataset": "D_"}}),
        (
            "runtimes",
            {"spec": {"worker": {"tiers": [{"medium": "nvme", "path": "/x", "quota": "1G"}]}}},
        ),
    ],
)
def test_schemas_refuse_bad_resources(plural: str, bad: dict[str, Any]) -> None:
    v, _ = validator(plural)
    assert not v.is_valid(bad)


def test_policy_maps_onto_dataset_create_options() -> None:
    policy = {
        "placement": "local",
        "replicas": 2,
        "tiers": ["mem", "ssd"],
        "ttl": "1d",
        "eviction": "lfu",
        "pin": True,
        "pageSize": "4MiB",
        "staleness": "300s",
        "readahead": 4,
    }
    opts = crds.policy_options(policy)
    assert opts == {
        "placement": "local",
        "replicas": "2",
        "tiers": "mem,ssd",
        "ttl": "1d",
        "eviction": "lfu",
        "pin": "true",
        "page_size": "4MiB",
        "staleness": "300s",
        "readahead": "4",
    }
    p = CachePolicy().with_options(opts)
    assert (p.replicas, p.tiers, p.ttl, p.page_size, p.staleness) == (
        2,
        ("mem", "ssd"),
        86400.0,
        4 << 20,
        300.0,
    )
    with pytest.raises(InvalidArgument, match="unknown policy field 'evict'"):
        crds.policy_options({"evict": "lru"})
    with pytest.raises(InvalidArgument, match="replicas"):
        crds.policy_options({"replicas": 40})


def test_mounts_take_credentials_by_secret_reference_only() -> None:
    spec = {
        "mounts": [
            {
                "name": "train",
                "uri": "s3://bucket/train",
                "options": {"endpoint_url": "http://minio:9000"},
                "credentials": {"secretName": "s3-creds", "profile": "ml"},
            },
            {"name": "val", "uri": "file:///data/val"},
        ]
    }
    m = crds.mounts(spec, "/etc/shoal/secrets")
    assert m[0].options == {
        "endpoint_url": "http://minio:9000",
        "credentials_file": "/etc/shoal/secrets/s3-creds/credentials",
        "profile": "ml",
    }
    assert m[1].options == {} and m[1].uri == "file:///data/val"
    with pytest.raises(InvalidArgument, match="would store a secret"):
        crds.mounts({"mounts": [{"name": "x", "uri": "s3://b", "options": {"secret_key": "s"}}]})
    with pytest.raises(InvalidArgument):
        crds.mounts(
            {"mounts": [{"name": "x", "uri": "s3://b", "credentials": {"secretName": "../etc"}}]}
        )


def test_names_and_labels() -> None:
    assert crds.master_name("team", "imagenet") == "team.imagenet"
    assert crds.node_label("team", "imagenet") == "shoal.io/s-team-imagenet"
    assert crds.sched_label("imagenet") == "shoal.io/dataset.imagenet.sched"
    long = crds.node_label("a" * 60, "b" * 60)
    name = long.split("/", 1)[1]
    assert len(name) <= 63 and name[-1].isalnum()
    assert long != crds.node_label("a" * 60, "b" * 59 + "c")  # still unique


def test_dataload_plans() -> None:
    p = crds.dataload_plan(
        {"dataset": "imagenet", "paths": ["/train/", "val"], "glob": "*.jpg"}, "team"
    )
    assert p.policy == "Once" and p.schedule is None
    assert p.job == {
        "kind": "load",
        "dataset": "team.imagenet",
        "paths": ["train", "val"],
        "glob": "*.jpg",
        "files": None,
        "metadata_only": False,
        "replicas": None,
        "verify": False,
    }
    p = crds.dataload_plan(
        {"dataset": "d", "metadataOnly": True, "replicas": 2, "verify": True}, "ns"
    )
    assert (p.job["paths"], p.job["metadata_only"], p.job["replicas"], p.job["verify"]) == (
        [""],
        True,
        2,
        True,
    )
    p = crds.dataload_plan(
        {"dataset": "d", "operation": "Free", "policy": "Cron", "schedule": "0 3 * * *"}, "ns"
    )
    assert p.job["kind"] == "free" and p.schedule == "0 3 * * *"
    p = crds.dataload_plan(
        {"dataset": "d", "operation": "Sync", "policy": "RunAfter", "runAfter": {"name": "warm"}},
        "ns",
    )
    assert p.job["kind"] == "sync" and p.run_after == "warm"
    with pytest.raises(InvalidArgument, match="cron"):
        crds.dataload_plan({"dataset": "d", "policy": "Cron", "schedule": "every day"}, "ns")
    with pytest.raises(InvalidArgument, match="runAfter"):
        crds.dataload_plan({"dataset": "d", "policy": "RunAfter"}, "ns")
    with pytest.raises(InvalidArgument, match="operation"):
        crds.dataload_plan({"dataset": "d", "operation": "Copy"}, "ns")


def test_pv_and_pvc_for_a_dataset() -> None:
    body = {"metadata": {"name": "imagenet", "namespace": "team", "uid": "u-1"}}
    aff = {
        "required": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
        }
    }
    pv = manifests.persistent_volume("team", "imagenet", "team.imagenet", aff)
    assert pv["metadata"]["name"] == "shoal-team-imagenet"
    assert pv["spec"]["csi"] == {
        "driver": "csi.shoal.io",
        "volumeHandle": "team.imagenet",
        "readOnly": True,
        "volumeAttributes": {"dataset": "team.imagenet"},
    }
    assert pv["spec"]["nodeAffinity"] == aff
    assert pv["spec"]["claimRef"] == {"namespace": "team", "name": "imagenet"}
    assert (
        "nodeAffinity"
        not in manifests.persistent_volume("team", "imagenet", "team.imagenet")["spec"]
    )
    pvc = manifests.persistent_volume_claim(body, "team.imagenet")
    assert pvc["spec"]["volumeName"] == "shoal-team-imagenet"
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    (owner,) = pvc["metadata"]["ownerReferences"]
    assert owner["kind"] == "Dataset" and owner["uid"] == "u-1" and owner["controller"] is True


def test_crds_and_example_manifests_are_valid_kubernetes_objects() -> None:
    import kubernetes_validate  # type: ignore[import-untyped]

    paths = [*sorted(CRDS.glob("*.yaml")), *sorted(EXAMPLES.glob("*.yaml"))]
    checked = 0
    for p in paths:
        for doc in yaml.safe_load_all(p.read_text()):
            if not doc or doc["apiVersion"].startswith(crds.GROUP):
                continue  # custom resources: validated against their CRDs above
            if doc["kind"] == "MutatingWebhookConfiguration":
                continue  # its caBundle is a placeholder there
            kubernetes_validate.validate(doc, "1.30.0", strict=True)
            checked += 1
    assert checked >= 6  # 3 CRDs, the training pod, the ClusterRole and its binding
