"""The custom resources' specs mapped onto the master's API, as pure functions.

Dataset ``<ns>/<name>`` is dataset ``<ns>.<name>`` in the master (a namespace holds no
'.', so the mapping is one to one and reversible); its PersistentVolumeClaim is
``<name>`` in ``<ns>``; nodes that hold some of its cache carry the label
``shoal.io/s-<ns>-<name>=true``; a pod asks for those nodes strictly with the label
``shoal.io/dataset.<name>.sched=required``.

A DataLoad maps onto one job spec (``load``, ``free`` or ``sync``, as ``shoal load``
builds it) and, with ``policy: Cron``, a master-owned schedule.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shoal.core import cron
from shoal.core.jobs import JobSpec
from shoal.core.types import CachePolicy, Mount, check_name
from shoal.errors import InvalidArgument

GROUP = "shoal.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
DATASETS = "datasets"
RUNTIMES = "runtimes"
DATALOADS = "dataloads"
#: the CSI driver that publishes ``<node mount root>/<dataset>`` into a pod
CSI_DRIVER = "csi.shoal.io"
#: label on the PV and PVC the operator made for a Dataset: its master name
DATASET_LABEL = "shoal.io/dataset"
#: where the chart mounts the Secrets that mounts name (``<root>/<secret>/<key>``)
SECRETS_ROOT = "/etc/shoal/secrets"

#: Dataset ``spec.policy`` key -> ``shoal dataset create --option`` key
_POLICY_KEYS = {
    "placement": "placement",
    "replicas": "replicas",
    "tiers": "tiers",
    "ttl": "ttl",
    "eviction": "eviction",
    "pin": "pin",
    "pageSize": "page_size",
    "staleness": "staleness",
    "readahead": "readahead",
}
_OPERATIONS = {"Load": "load", "Free": "free", "Sync": "sync"}
_POLICIES = ("Once", "Cron", "RunAfter")


def master_name(namespace: str, name: str) -> str:
    """The master's name of Dataset ``namespace/name``."""
    return check_name("dataset", f"{namespace}.{name}")


def node_label(namespace: str, name: str) -> str:
    """``shoal.io/s-<ns>-<name>``; a name part over the 63 characters a label allows is
    shortened, keeping it unique with a hash."""
    part = f"s-{namespace}-{name}"
    if len(part) > 63:
        digest = hashlib.sha256(part.encode()).hexdigest()[:10]
        part = f"{part[:52].rstrip('-.')}-{digest}"
    return f"{GROUP}/{part}"


def sched_label(name: str) -> str:
    """The pod label whose value ``required`` makes locality to Dataset ``name`` strict."""
    return f"{GROUP}/dataset.{name}.sched"


def policy_options(policy: Mapping[str, Any] | None) -> dict[str, str]:
    """``spec.policy`` as ``--option`` strings; unknown keys are InvalidArgument."""
    out: dict[str, str] = {}
    for key, value in (policy or {}).items():
        if key not in _POLICY_KEYS:
            raise InvalidArgument(
                f"unknown policy field {key!r}; known: {', '.join(sorted(_POLICY_KEYS))}"
            )
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list | tuple):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        out[_POLICY_KEYS[key]] = text
    CachePolicy().with_options(out)  # the master's own checks, before any request
    return out


def desired_policy(policy: Mapping[str, Any] | None) -> dict[str, Any]:
    """The full cache policy ``spec.policy`` means (defaults filled in), as the master
    reports it in ``Dataset.to_dict()['policy']``: compared to decide on an update."""
    return CachePolicy().with_options(policy_options(policy)).to_dict()


def mounts(spec: Mapping[str, Any], secrets_root: str = SECRETS_ROOT) -> list[Mount]:
    """``spec.mounts`` as the master's mounts; a Secret reference becomes the mount's
    ``credentials_file`` (the file where the chart mounts that Secret key)."""
    out = []
    for m in spec.get("mounts") or []:
        options = {str(k): str(v) for k, v in (m.get("options") or {}).items()}
        creds = m.get("credentials")
        if creds:
            secret = str(creds["secretName"])
            key = str(creds.get("key") or "credentials")
            if "/" in secret or "/" in key or key.startswith("."):
                raise InvalidArgument(f"invalid credentials reference {secret}/{key}")
            options["credentials_file"] = posixpath.join(secrets_root, secret, key)
            if creds.get("profile"):
                options["profile"] = str(creds["profile"])
        out.append(Mount(str(m["name"]), str(m["uri"]), options))
    if not out:
        raise InvalidArgument("a Dataset needs at least one mount")
    return out


@dataclass(frozen=True)
class DataLoadPlan:
    """What a DataLoad asks the master for."""

    job: dict[str, Any]
    policy: str
    schedule: str | None
    run_after: str | None


def dataload_plan(spec: Mapping[str, Any], namespace: str) -> DataLoadPlan:
    """The job spec (``JobSpec.to_dict()``) and policy of a DataLoad ``spec``."""
    op = spec.get("operation") or "Load"
    if op not in _OPERATIONS:
        raise InvalidArgument(f"unknown operation {op!r}: use Load, Free or Sync")
    policy = spec.get("policy") or "Once"
    if policy not in _POLICIES:
        raise InvalidArgument(f"unknown policy {policy!r}: use Once, Cron or RunAfter")
    paths = tuple(str(p).strip("/") for p in spec.get("paths") or ()) or ("",)
    is_load = op == "Load"
    job = JobSpec(
        kind=_OPERATIONS[op],
        dataset=master_name(namespace, str(spec["dataset"])),
        paths=paths,
        glob=spec.get("glob") or None,
        metadata_only=bool(spec.get("metadataOnly")) and is_load,
        replicas=spec.get("replicas") if is_load else None,
        verify=bool(spec.get("verify")) and is_load,
    )
    schedule = None
    if policy == "Cron":
        schedule = str(spec.get("schedule") or "")
        cron.check(schedule)
    run_after = None
    if policy == "RunAfter":
        run_after = str((spec.get("runAfter") or {}).get("name") or "")
        if not run_after:
            raise InvalidArgument("policy RunAfter needs runAfter.name")
    return DataLoadPlan(job.to_dict(), policy, schedule, run_after)


def same_job(view_spec: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """Whether a job the master holds was made from ``job`` (to adopt it after a
    restart rather than start it twice)."""
    keys = ("kind", "dataset", "paths", "glob", "files", "metadata_only", "replicas", "verify")
    return all(_norm(view_spec.get(k)) == _norm(job.get(k)) for k in keys)


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v
