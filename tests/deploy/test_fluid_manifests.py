"""deploy/fluid/: the CacheRuntimeClass and the worked example validate against Fluid's
CRD schemas (strict) and the Kubernetes schemas, and say what shoal needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

FLUID = Path(__file__).resolve().parents[2] / "deploy" / "fluid"
MANIFESTS = sorted(FLUID.rglob("*.yaml"))
#: where Fluid embeds a core/v1 PodTemplateSpec in a CacheRuntimeClass
TEMPLATES = [("topology", c, "template") for c in ("master", "worker", "client")]


def _docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (str(p.relative_to(FLUID)), d)
        for p in MANIFESTS
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]


def _one(kind: str) -> dict[str, Any]:
    hits = [d for _, d in _docs() if d["kind"] == kind]
    assert len(hits) == 1, kind
    return hits[0]


def test_the_worked_example_is_complete() -> None:
    kinds = {d["kind"] for _, d in _docs()}
    assert {"CacheRuntimeClass", "CacheRuntime", "Dataset", "DataLoad", "Pod"} <= kinds


@pytest.mark.parametrize(("where", "doc"), _docs(), ids=[w for w, _ in _docs()])
def test_manifest_is_valid(validator: Any, where: str, doc: dict[str, Any]) -> None:
    problems = validator.errors(doc, pod_templates=TEMPLATES)
    assert not problems, "\n".join(problems)


def test_strict_fluid_schema_catches_a_typo(validator: Any) -> None:
    cls = _one("CacheRuntimeClass")
    cls["topology"]["master"]["executionEntries"]["mountUFS"]["timeoutSeconds"] = 60
    assert any("timeoutSeconds" in p for p in validator.errors(cls, pod_templates=TEMPLATES))
    cls = _one("CacheRuntimeClass")
    cls["topology"]["worker"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "x"
    assert any("imagePullPolicyy" in p for p in validator.errors(cls, pod_templates=TEMPLATES))
    load = _one("DataLoad")
    load["spec"]["policy"] = "Sometimes"
    assert any("Sometimes" in p for p in validator.errors(load))


def test_the_class_wires_shoal_commands() -> None:
    cls = _one("CacheRuntimeClass")
    topo = cls["topology"]
    mount_ufs = topo["master"]["executionEntries"]["mountUFS"]
    assert mount_ufs["command"] == ["shoal", "fluid", "mount-ufs"]
    assert mount_ufs["timeout"] >= 20  # Fluid's floor
    commands = {c: topo[c]["template"]["spec"]["containers"][0]["command"] for c in topo}
    assert commands == {
        "master": ["shoal", "master"],
        "worker": ["shoal", "fluid", "worker"],
        "client": ["shoal", "fluid", "fuse"],
    }
    assert topo["client"]["workloadType"]["kind"] == "DaemonSet"
    assert cls["fileSystemType"] == "fuse.shoal"
    ops = {o["name"]: o for o in cls["dataOperationSpecs"]}
    assert ops["DataLoad"]["command"] == ["shoal", "fluid", "load"]
    worker = topo["worker"]["template"]["spec"]
    assert worker["serviceAccountName"] == _one("ServiceAccount")["metadata"]["name"]


def test_the_example_names_one_dataset_and_keeps_secrets_out() -> None:
    ds, rt, load = _one("Dataset"), _one("CacheRuntime"), _one("DataLoad")
    assert ds["metadata"]["name"] == rt["metadata"]["name"] == load["spec"]["dataset"]["name"]
    assert rt["spec"]["runtimeClassName"] == _one("CacheRuntimeClass")["metadata"]["name"]
    text = "\n".join(p.read_text() for p in MANIFESTS).lower()
    for secretish in ("aws_secret_access_key", "secret_key", "password"):
        assert secretish not in text
    pod = _one("Pod")
    claim = pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim == ds["metadata"]["name"]  # Fluid's PVC is named after the Dataset


def test_the_shoal_commands_of_the_class_parse() -> None:
    import argparse

    from shoal.cli import fluid
    from shoal.cli.main import _parser

    p = argparse.ArgumentParser()
    fluid.register(p.add_subparsers(dest="command", required=True))
    cls = _one("CacheRuntimeClass")
    argvs = [cls["topology"]["master"]["executionEntries"]["mountUFS"]["command"]]
    argvs += [o["command"] for o in cls["dataOperationSpecs"]]
    for component in cls["topology"].values():
        c = component["template"]["spec"]["containers"][0]
        argvs.append(c["command"] + c.get("args", []))
        for hook in (c.get("lifecycle") or {}).values():
            cmd = hook["exec"]["command"]
            argvs.append(cmd[2].split(" || ")[0].split() if cmd[0] == "sh" else cmd)
    checked = 0
    for argv in argvs:
        if argv[:2] == ["shoal", "fluid"]:
            p.parse_args(argv[1:])
            checked += 1
        elif argv[0] == "shoal" and argv[1] != "umount":
            _parser().parse_args(argv[1:])
            checked += 1
    assert checked >= 6
