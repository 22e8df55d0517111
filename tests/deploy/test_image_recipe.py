"""The container image recipe: what the Containerfile copies and runs exists, and the
commands the chart starts in the image are commands shoal has (building the image is
`make image`, too slow for the test suite; docs/kubernetes.md records a build)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "deploy" / "image"
CHART = ROOT / "deploy" / "helm" / "shoal"


def test_containerfile_builds_from_the_context_build_sh_makes() -> None:
    text = (IMAGE / "Containerfile").read_text()
    build = (IMAGE / "build.sh").read_text()
    assert re.search(r"^ARG BASE=localhost/shoal-base:bookworm$", text, re.M)
    assert "COPY wheels/ /tmp/wheels/" in text and '"$ctx/wheels"' in build
    assert "--no-index --find-links /tmp/wheels" in text  # no network inside the build
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert "fuse3" in text and "mmdebstrap" in build
    # the project's own build refuses to run with a broken script
    assert subprocess.run(["bash", "-n", str(IMAGE / "build.sh")]).returncode == 0
    assert (IMAGE / "build.sh").stat().st_mode & 0o111
    # the extras the image installs exist
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in re.search(r'"shoal\[([a-z0-9,]+)\]"', text).group(1).split(","):  # type: ignore[union-attr]
        assert re.search(rf"^{extra} = \[", pyproject, re.M), extra


def test_smoke_script_checks_the_worker_as_the_chart_probes_it(chart: Any) -> None:
    smoke = (IMAGE / "smoke.sh").read_text()
    assert subprocess.run(["bash", "-n", str(IMAGE / "smoke.sh")]).returncode == 0
    assert "shoal --version" in smoke
    docs = chart.template()
    worker = next(
        d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-worker")
    )
    probe = worker["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]
    # both read the worker's --url-file and ask its /health on the metrics port
    for part in ("metrics_port", "/health", "json.load"):
        assert part in probe["command"][-1] and part in smoke, part


def test_make_image_runs_the_build_script() -> None:
    make = (ROOT / "Makefile").read_text()
    target = re.search(r"^image:.*\n((?:\t.*\n)+)", make, re.M)
    assert target, "no image target"
    assert "deploy/image/build.sh" in target.group(1)
    assert "mmdebstrap" in target.group(1)


def _shoal_commands(docs: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    out = []
    for d in docs:
        spec = (d.get("spec") or {}).get("template", {}).get("spec")
        if not spec:
            continue
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            argv = list(c.get("command") or []) + list(c.get("args") or [])
            if argv and argv[0] == "shoal":
                out.append((f"{d['metadata']['name']}/{c['name']}", argv[1:]))
            probe = (c.get("lifecycle") or {}).get("preStop", {}).get("exec", {}).get("command")
            if probe and probe[0] == "shoal":
                out.append((f"{d['metadata']['name']}/{c['name']} preStop", probe[1:]))
    return out


def test_every_shoal_command_the_chart_runs_parses(chart: Any) -> None:
    from shoal.cli.main import _parser

    docs = chart.template(CHART / "examples" / "dedicated-cache-nodes.yaml")
    commands = _shoal_commands(docs)
    assert {w.split("/")[-1].split()[0] for w, _ in commands} >= {"master", "worker", "fuse"}
    parser = _parser()
    known = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    missing = []
    for where, argv in commands:
        if argv[0] not in known:
            missing.append(f"{where}: shoal {argv[0]}")  # csi, operator: other issues
            continue
        argv = [re.sub(r"\$\((\w+)\)", "x", a) for a in argv]
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `shoal {' '.join(argv)}` does not parse")
    assert not [m for m in missing if "master" in m or "worker" in m or "mount" in m]


def test_the_operator_command_the_chart_runs_parses(chart: Any) -> None:
    import argparse

    operator_main = pytest.importorskip("shoal.operator.__main__")
    docs = chart.template()
    dep = next(d for d in docs if d["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["python3", "-m", "shoal.operator"]
    p = argparse.ArgumentParser()
    operator_main.add_arguments(p)
    args = p.parse_args(c["args"])
    assert args.master == "http://shoal-master.shoal-system.svc:19999"
    assert args.webhook_port == 9443 and args.tls_cert == "/etc/shoal/webhook/tls.crt"


def test_tier_flags_are_what_the_worker_parses(chart: Any) -> None:
    from shoal.config import TierSpec
    from shoal.errors import InvalidArgument

    docs = chart.template(CHART / "examples" / "dedicated-cache-nodes.yaml")
    worker = next(
        d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-worker")
    )
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = [a.split("=", 1)[1] for a in args if a.startswith("--tier=")]
    plain = [f for f in flags if f.count(":") == 2]
    assert [TierSpec.parse(f).capacity for f in plain] == [16 << 30, 8 << 40]
    marked = [TierSpec.parse(f) for f in flags if f.count(":") == 4]
    assert marked, "the example sets watermarks on at least one tier"
    for spec in marked:
        assert (spec.high_watermark, spec.low_watermark) == (0.9, 0.75)
    with pytest.raises(InvalidArgument):
        TierSpec.parse("ssd:/cache:1GiB:0.5:0.9")  # low above high
