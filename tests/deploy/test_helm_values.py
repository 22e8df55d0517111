"""values.schema.json and the chart's own checks: a bad values file fails `helm template`
with a message that names the bad value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

BAD: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "typo in a key",
        {"worker": {"teirs": []}},
        ["/worker", "teirs"],
    ),
    (
        "typo in a nested key",
        {"master": {"persistence": {"sise": "1Gi"}}},
        ["/master/persistence", "sise"],
    ),
    (
        "wrong type",
        {"master": {"port": "19999"}},
        ["/master/port", "integer"],
    ),
    (
        "negative drain timeout",
        {"worker": {"drainTimeoutSeconds": -5}},
        ["/worker/drainTimeoutSeconds", "minimum"],
    ),
    (
        "negative quota",
        {"worker": {"tiers": [{"name": "mem", "medium": "memory", "quota": "-1Gi"}]}},
        ["/worker/tiers/0/quota", "-1Gi"],
    ),
    (
        "unknown tier",
        {"worker": {"tiers": [{"name": "nvme", "medium": "memory", "quota": "1Gi"}]}},
        ["/worker/tiers/0/name", "'mem', 'ssd', 'hdd'"],
    ),
    (
        "watermark above 1",
        {
            "worker": {
                "tiers": [{"name": "mem", "medium": "memory", "quota": "1Gi", "highWatermark": 1.5}]
            }
        },
        ["/worker/tiers/0/highWatermark"],
    ),
    (
        "typo in a gateway key",
        {"gateway": {"s3": {"enabled": True, "credentialSecret": "x"}}},
        ["/gateway/s3", "credentialSecret"],
    ),
    (
        "unknown traffic policy",
        {"gateway": {"webhdfs": {"service": {"internalTrafficPolicy": "Node"}}}},
        ["/gateway/webhdfs/service/internalTrafficPolicy"],
    ),
    (
        "no tiers",
        {"worker": {"tiers": []}},
        ["/worker/tiers", "minItems"],
    ),
]

#: mistakes a JSON schema cannot see, caught by the templates' own checks
BAD_COMBINATIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "low above high watermark",
        {
            "worker": {
                "tiers": [
                    {
                        "name": "ssd",
                        "medium": "emptyDir",
                        "quota": "1Gi",
                        "highWatermark": 0.7,
                        "lowWatermark": 0.9,
                    }
                ]
            }
        },
        "worker.tiers[0] (ssd): lowWatermark 0.9 must be below highWatermark 0.7",
    ),
    (
        "a tier twice",
        {
            "worker": {
                "tiers": [
                    {"name": "mem", "medium": "memory", "quota": "1Gi"},
                    {"name": "mem", "medium": "memory", "quota": "2Gi"},
                ]
            }
        },
        "worker.tiers[1]: tier mem is given twice",
    ),
    (
        "hostPath without a path",
        {"worker": {"tiers": [{"name": "ssd", "medium": "hostPath", "quota": "1Gi"}]}},
        "worker.tiers[0] (ssd): medium hostPath needs a path",
    ),
    (
        "no token source",
        {"auth": {"create": False}},
        "auth: set auth.existingSecret when auth.create is false",
    ),
    (
        "tls without a certificate",
        {"tls": {"enabled": True}},
        "tls: tls.enabled needs tls.existingSecret or tls.certManager.enabled",
    ),
]


def _values(tmp_path: Path, values: dict[str, Any]) -> Path:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    return f


@pytest.mark.parametrize(("case", "values", "expected"), BAD, ids=[b[0] for b in BAD])
def test_schema_rejects_bad_values_readably(
    chart: Any, tmp_path: Path, case: str, values: dict[str, Any], expected: list[str]
) -> None:
    err = chart.template_error(_values(tmp_path, values))
    assert "values don't meet the specifications of the schema" in err, err
    for text in expected:
        assert text in err, f"{case}: {text!r} not in {err}"
    # one short message, not a Go stack
    assert len(err.splitlines()) < 8, err


@pytest.mark.parametrize(
    ("case", "values", "expected"), BAD_COMBINATIONS, ids=[b[0] for b in BAD_COMBINATIONS]
)
def test_templates_reject_bad_combinations_readably(
    chart: Any, tmp_path: Path, case: str, values: dict[str, Any], expected: str
) -> None:
    err = chart.template_error(_values(tmp_path, values))
    assert expected in err, err


def test_a_good_values_file_with_every_tier_medium_renders(chart: Any, tmp_path: Path) -> None:
    values = {
        "worker": {
            "tiers": [
                {"name": "mem", "medium": "memory", "quota": "512Mi"},
                {"name": "ssd", "medium": "emptyDir", "quota": "10Gi"},
                {"name": "hdd", "medium": "hostPath", "path": "/mnt/hdd", "quota": "1.5Ti"},
            ]
        }
    }
    docs = chart.template(_values(tmp_path, values))
    assert any(d["kind"] == "DaemonSet" for d in docs)
