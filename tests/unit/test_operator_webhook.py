"""The scheduling webhook's decisions: the JSON patch for each kind of pod, and the
fail-open answer to anything it cannot review."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest

from shoal.operator import webhook

KNOWN = {("team", "imagenet"), ("team", "coco")}
KEY = "shoal.io/s-team-imagenet"
PREF = webhook.PREFERRED
REQ = webhook.REQUIRED


def pod(
    claims: tuple[str, ...] = ("imagenet",),
    labels: dict[str, str] | None = None,
    affinity: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    vols = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)
    ]
    vols.append({"name": "scratch", "emptyDir": {}})
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "team", "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "x"}], "volumes": vols, **spec},
    }
    if affinity is not None:
        body["spec"]["affinity"] = affinity
    return body


def admission(obj: Any, operation: str = "CREATE", namespace: str = "team") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d0e-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "namespace": namespace,
            "object": obj,
            "oldObject": None,
            "userInfo": {"username": "alice"},
        },
    }


def applied(p: dict[str, Any]) -> dict[str, Any] | None:
    """The pod after the webhook's patch (None: no patch); the review must allow."""
    answer, ok = webhook.review(admission(p), KNOWN)
    r = answer["response"]
    assert ok and r["allowed"] is True and r["uid"] == "0d0e-1"
    if "patch" not in r:
        return None
    assert r["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(r["patch"]))
    return jsonpatch.apply_patch(copy.deepcopy(p), ops)  # type: ignore[no-any-return]


def test_dataset_pvc_gets_preferred_affinity_weight_100() -> None:
    out = applied(pod())
    assert out is not None
    assert out["spec"]["affinity"]["nodeAffinity"] == {
        PREF: [
            {
                "weight": 100,
                "preference": {
                    "matchExpressions": [{"key": KEY, "operator": "In", "values": ["true"]}]
                },
            }
        ]
    }
    # nothing else of the pod changed
    out["spec"].pop("affinity")
    assert out == pod()


def test_json_patch_ops_are_adds_under_spec() -> None:
    ops = webhook.json_patch(pod(), webhook.node_affinity(pod(), "team", KNOWN) or {})
    assert [o["op"] for o in ops] == ["add"] and ops[0]["path"] == "/spec/affinity"


def test_required_label_gives_required_affinity() -> None:
    out = applied(pod(labels={"shoal.io/dataset.imagenet.sched": "required"}))
    assert out is not None
    na = out["spec"]["affinity"]["nodeAffinity"]
    assert PREF not in na
    assert na[REQ] == {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["true"]}]}
        ]
    }


def test_required_is_added_to_every_existing_term_and_other_affinity_kept() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    gpu = {"key": "gpu", "operator": "Exists"}
    aff = {
        "nodeAffinity": {
            REQ: {"nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [gpu]}]}
        },
        "podAntiAffinity": {"x": 1},
    }
    out = applied(pod(labels={"shoal.io/dataset.imagenet.sched": "required"}, affinity=aff))
    assert out is not None
    terms = out["spec"]["affinity"]["nodeAffinity"][REQ]["nodeSelectorTerms"]
    mine = {"key": KEY, "operator": "In", "values": ["true"]}
    assert terms == [{"matchExpressions": [zone, mine]}, {"matchExpressions": [gpu, mine]}]
    assert out["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}


def test_two_datasets_one_required_one_preferred() -> None:
    out = applied(pod(("imagenet", "coco"), labels={"shoal.io/dataset.coco.sched": "required"}))
    assert out is not None
    na = out["spec"]["affinity"]["nodeAffinity"]
    assert [p["preference"]["matchExpressions"][0]["key"] for p in na[PREF]] == [KEY]
    keys = [e["key"] for e in na[REQ]["nodeSelectorTerms"][0]["matchExpressions"]]
    assert keys == ["shoal.io/s-team-coco"]


@pytest.mark.parametrize(
    "own",
    [
        {
            "affinity": {
                "nodeAffinity": {
                    PREF: [
                        {
                            "weight": 5,
                            "preference": {
                                "matchExpressions": [
                                    {"key": KEY, "operator": "In", "values": ["true"]}
                                ]
                            },
                        }
                    ]
                }
            }
        },
        {
            "affinity": {
                "nodeAffinity": {
                    REQ: {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": KEY, "operator": "DoesNotExist"}]}
                        ]
                    }
                }
            }
        },
        {"nodeSelector": {KEY: "true"}},
        {"nodeName": "node-3"},
    ],
    ids=["own-preferred", "own-required", "node-selector", "node-name"],
)
def test_pod_with_its_own_locality_is_left_alone(own: dict[str, Any]) -> None:
    assert applied(pod(**own)) is None


def test_unrelated_pods_are_allowed_without_patch() -> None:
    assert applied(pod(claims=())) is None  # no PVC at all
    assert applied(pod(claims=("scratch-data",))) is None  # a PVC that is no Dataset
    # the same claim name in another namespace is not that Dataset
    answer, ok = webhook.review(admission(pod(), namespace="other"), KNOWN)
    assert ok and answer["response"] == {"uid": "0d0e-1", "allowed": True}


def test_update_operations_are_not_patched() -> None:
    answer, ok = webhook.review(admission(pod(), operation="UPDATE"), KNOWN)
    assert ok and "patch" not in answer["response"]


@pytest.mark.parametrize(
    "request_",
    [
        None,
        [],
        {"request": None},
        {
            "request": {
                "uid": "u",
                "kind": {"kind": "Pod"},
                "operation": "CREATE",
                "object": {"spec": {"volumes": "nonsense"}},
            }
        },
    ],
    ids=["null", "list", "no-request", "malformed-pod"],
)
def test_broken_requests_fail_open(request_: Any) -> None:
    answer, ok = webhook.review(request_, KNOWN)
    assert not ok
    assert answer["response"]["allowed"] is True and "patch" not in answer["response"]
    assert answer["kind"] == "AdmissionReview"


def test_webhook_configuration_is_fail_open_and_matches_the_example() -> None:
    import yaml

    from shoal.operator.crds import GROUP

    conf = webhook.configuration("shoal-operator", "shoal-system", "CA")
    (hook,) = conf["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and 1 <= hook["timeoutSeconds"] <= 10
    assert hook["clientConfig"]["service"]["path"] == webhook.PATH
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["sideEffects"] == "None"
    assert hook["name"].endswith(GROUP)
    path = Path(__file__).resolve().parents[2] / "deploy/examples/webhook.yaml"
    example = yaml.safe_load(path.read_text())
    ca = example["webhooks"][0]["clientConfig"]["caBundle"]
    assert example == webhook.configuration("shoal-operator", "shoal-system", ca)
