"""``shoal fluid ...``: shoal as a Fluid generic CacheRuntime (deploy/fluid/).

Fluid starts shoal's pods from the CacheRuntimeClass and hands each one its view of the
Dataset and the CacheRuntime in ``$FLUID_RUNTIME_CONFIG_PATH`` (runtime.json) and the
``FLUID_*`` environment. These commands map that onto shoal's own configuration:

- ``mount-ufs`` (the class's ``executionEntries.mountUFS``, run in ``<runtime>-master-0``):
  creates the shoal dataset ``<namespace>.<name>`` from the Dataset's mounts and prints
  ``{"mounted": [...]}``, the JSON Fluid waits for;
- ``worker`` and ``fuse``: start ``shoal worker`` with the tiers of ``tieredStoreLevels``
  and ``shoal mount`` on Fluid's target path;
- ``load`` (the class's DataLoad operation): one load job per path of
  ``$FLUID_DATALOAD_DATA_PATH``, followed to the end;
- ``label-node``: the node labels Fluid's scheduling reads (``fluid.io/s-<ns>-<ds>``...),
  set by the worker pod on its own node (and removed with ``--remove``).

The mapping is a set of pure functions of (runtime.json, environment); the commands only
carry them out.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from shoal.cli.common import master_url
from shoal.client import Client
from shoal.core.jobs import DONE, FINAL, STOPPED, JobSpec
from shoal.core.types import Mount, check_name
from shoal.errors import DatasetNotFound, InvalidArgument, PermissionDenied, Unavailable

DEFAULT_CONFIG = "/etc/fluid/config/runtime.json"
MASTER_PORT = 19999
WORKER_PORT = 29999
#: CacheRuntime options with this prefix set the dataset's cache policy
#: (dataset.replicas: "2" -> replicas=2); every other option belongs to a component
POLICY_PREFIX = "dataset."
#: Fluid's medium types onto shoal's tier names
MEDIUM_TIERS = {"MEM": "mem", "SSD": "ssd", "HDD": "hdd"}
#: the runtime type in Fluid's runtime-specific node label
RUNTIME_TYPE = "shoal"
_SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def register(sub: Any) -> None:
    p = sub.add_parser("fluid", help="run shoal under Fluid (a generic CacheRuntime)")
    fsub = p.add_subparsers(dest="fluid_command", metavar="ACTION", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--config", type=Path, default=None, help=f"runtime.json (default {DEFAULT_CONFIG})"
        )
        q.add_argument("--master", metavar="URL", help="master URL (default: from Fluid)")

    q = fsub.add_parser("mount-ufs", help="create the dataset; print Fluid's mounted JSON")
    common(q)
    q.add_argument("--check", action="store_true", help="list each mount before creating")
    q.set_defaults(handler=cmd_mount_ufs)
    q = fsub.add_parser("worker", help="start a worker with the tiers Fluid gives")
    common(q)
    q.set_defaults(handler=cmd_worker)
    q = fsub.add_parser("fuse", help="mount the dataset on Fluid's target path")
    common(q)
    q.set_defaults(handler=cmd_fuse)
    q = fsub.add_parser("load", help="run Fluid's DataLoad: load each path, wait")
    common(q)
    q.set_defaults(handler=cmd_load)
    q = fsub.add_parser("label-node", help="set (or --remove) Fluid's labels on this node")
    q.add_argument("--remove", action="store_true", help="remove this dataset's labels")
    q.add_argument("--node", default=None, help="node name (default $SHOAL_NODE)")
    q.set_defaults(handler=cmd_label_node, config=None, master=None)


# -- the mapping (pure) -------------------------------------------------------------


def read_config(path: Path | None, env: dict[str, str]) -> dict[str, Any]:
    f = path or Path(env.get("FLUID_RUNTIME_CONFIG_PATH") or DEFAULT_CONFIG)
    try:
        data = json.loads(f.read_text())
    except OSError as exc:
        raise InvalidArgument(f"cannot read Fluid's runtime config {f}: {exc.strerror}") from None
    except ValueError as exc:
        raise InvalidArgument(f"Fluid's runtime config {f} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"Fluid's runtime config {f} is not a JSON object")
    return data


def fluid_dataset(config: dict[str, Any], env: dict[str, str]) -> tuple[str, str]:
    """(namespace, name) of the Fluid Dataset: the FLUID_DATASET_* environment, else the
    runtime's component names (a Fluid runtime is named after its dataset)."""
    name = env.get("FLUID_DATASET_NAME", "")
    if not name:
        master = (config.get("master") or {}).get("name", "")
        name = master.removesuffix("-master")
    ns = env.get("FLUID_DATASET_NAMESPACE") or env.get("POD_NAMESPACE", "")
    if not ns and (_SA / "namespace").exists():
        ns = (_SA / "namespace").read_text().strip()
    if not name or not ns:
        raise InvalidArgument(
            "no Fluid dataset: set FLUID_DATASET_NAME and FLUID_DATASET_NAMESPACE"
        )
    return ns, name


def dataset_name(ns: str, name: str) -> str:
    """The shoal dataset behind Fluid Dataset ns/name (the operator uses the same name)."""
    out = f"{ns}.{name}"
    check_name("dataset", out)
    return out


def _mount_name(m: dict[str, Any]) -> str:
    path = (m.get("path") or "").strip("/")
    name = path or m.get("name") or ""
    if "/" in name:
        raise InvalidArgument(f"mount {m.get('name')!r}: path {m['path']!r} must be one level")
    if not name:
        raise InvalidArgument(
            f"mount {m.get('mountPoint')!r}: shoal shows each mount as a directory; give it "
            "a name (path '/' is not supported)"
        )
    return name


def mounts_from_config(config: dict[str, Any]) -> list[Mount]:
    """shoal mounts from runtime.json's (the Dataset's) mounts; credentials stay files."""
    out = []
    for m in config.get("mounts") or []:
        options = {k: str(v) for k, v in (m.get("options") or {}).items()}
        for key, secret_file in (m.get("encryptOptions") or {}).items():
            if key != "credentials_file":
                raise InvalidArgument(
                    f"mount {m.get('name')!r}: encryptOption {key!r} is not supported: put an "
                    "AWS-style credentials file in the Secret and name the option "
                    "credentials_file"
                )
            options["credentials_file"] = secret_file  # a path to the mounted Secret
        out.append(Mount(_mount_name(m), m["mountPoint"], options))
    if not out:
        raise InvalidArgument("the Fluid Dataset has no mounts")
    return out


def policy_from_config(config: dict[str, Any]) -> dict[str, str]:
    opts = (config.get("master") or {}).get("options") or {}
    return {k[len(POLICY_PREFIX) :]: str(v) for k, v in opts.items() if k.startswith(POLICY_PREFIX)}


def master_from_config(config: dict[str, Any], ns: str) -> str:
    master = config.get("master") or {}
    service = (master.get("service") or {}).get("name") or master.get("name")
    if not service:
        raise InvalidArgument("runtime config names no master: pass --master URL")
    port = (master.get("options") or {}).get("port", MASTER_PORT)
    return f"http://{service}.{ns}.svc:{port}"


def worker_argv(config: dict[str, Any], env: dict[str, str]) -> list[str]:
    """``shoal worker`` for this pod: tiers from tieredStoreLevels, options from Fluid."""
    worker = config.get("worker") or {}
    opts = worker.get("options") or {}
    argv = ["shoal", "worker", "--host=0.0.0.0", f"--port={opts.get('port', WORKER_PORT)}"]
    if env.get("POD_IP"):
        argv.append(f"--advertise-host={env['POD_IP']}")
    argv.append(f"--dir={opts.get('dir', '/var/lib/shoal/worker')}")
    if "ufsConcurrency" in opts:
        argv.append(f"--ufs-concurrency={opts['ufsConcurrency']}")
    argv.append("--url-file=/run/shoal/worker.json")
    for i, level in enumerate(worker.get("tieredStoreLevels") or []):
        medium = str(level.get("mediumType", "")).upper()
        if medium not in MEDIUM_TIERS:
            raise InvalidArgument(f"tieredStore level {i}: medium {medium!r}: use MEM, SSD or HDD")
        paths, quotas = level.get("mountPaths") or [], level.get("quotas") or []
        if len(paths) != 1 or len(quotas) != 1:
            raise InvalidArgument(
                f"tieredStore level {i} ({medium}): shoal takes one path and one quota per tier"
            )
        flag = f"{MEDIUM_TIERS[medium]}:{paths[0]}:{quotas[0]}"
        high, low = level.get("high"), level.get("low")
        if high or low:
            flag += f":{high or 0.95}:{low or 0.8}"
        argv.append(f"--tier={flag}")
    return argv


def fuse_argv(config: dict[str, Any], env: dict[str, str], dataset: str) -> list[str]:
    target = env.get("FLUID_RUNTIME_MOUNT_PATH") or config.get("targetPath")
    if not target:
        raise InvalidArgument("no target path: Fluid sets FLUID_RUNTIME_MOUNT_PATH")
    opts = (config.get("client") or {}).get("options") or {}
    argv = ["shoal", "mount", target, "--foreground", "--dataset", dataset]
    if opts.get("kernelOpen") == "true":
        argv.append("--kernel-open")
    if opts.get("passthrough") == "false":
        argv.append("--no-passthrough")
    if "readaheadKiB" in opts:
        argv.append(f"--readahead={opts['readaheadKiB']}")
    return argv


def load_specs(env: dict[str, str], dataset: str) -> list[JobSpec]:
    """One load job per replica count over FLUID_DATALOAD_DATA_PATH's paths ('/a:/b'),
    each a Fluid dataset path (/<mount>/<path>) inside the shoal dataset."""
    paths = [p for p in env.get("FLUID_DATALOAD_DATA_PATH", "/").split(":") if p] or ["/"]
    reps = [r for r in env.get("FLUID_DATALOAD_PATH_REPLICAS", "").split(":") if r]
    if reps and len(reps) != len(paths):
        raise InvalidArgument("FLUID_DATALOAD_PATH_REPLICAS must give one count per path")
    metadata = env.get("FLUID_DATALOAD_METADATA", "false").lower() == "true"
    groups: dict[int, list[str]] = {}
    for i, p in enumerate(paths):
        groups.setdefault(int(reps[i]) if reps else 1, []).append(p.strip("/"))
    return [
        JobSpec(kind="load", dataset=dataset, paths=tuple(ps), replicas=r, metadata_only=False)
        for r, ps in groups.items()
    ] + ([JobSpec(kind="load", dataset=dataset, metadata_only=True)] if metadata else [])


def node_labels(ns: str, ds: str) -> dict[str, str]:
    """What Fluid's scheduler plugins and webhook read for a node caching ns/ds."""
    labels = {f"fluid.io/s-{ns}-{ds}": "true", f"fluid.io/s-{RUNTIME_TYPE}-{ns}-{ds}": "true"}
    for key in labels:
        if len(key.split("/", 1)[1]) > 63:
            raise InvalidArgument(f"node label {key} is longer than 63 characters")
    return labels


def dataset_count(labels: dict[str, str]) -> int:
    """Datasets a node caches by its fluid.io/s-* labels: a runtime-typed label
    fluid.io/s-<type>-<ns>-<ds> always comes with fluid.io/s-<ns>-<ds>, so it is not
    counted twice."""
    names = {k[len("fluid.io/s-") :] for k in labels if k.startswith("fluid.io/s-")}
    return sum(1 for n in names if not any(o != n and n.endswith("-" + o) for o in names))


def label_patch(current: dict[str, str], ns: str, ds: str, remove: bool) -> dict[str, Any]:
    """The merge patch that adds (or removes) ns/ds's labels and sets dataset-num."""
    mine = node_labels(ns, ds)
    after = {k: v for k, v in current.items() if not (remove and k in mine)}
    if not remove:
        after.update(mine)
    patch: dict[str, str | None] = {k: None for k in mine} if remove else dict(mine)
    count = dataset_count(after)
    patch["fluid.io/dataset-num"] = str(count) if count else None
    return {"metadata": {"labels": patch}}


# -- the commands ---------------------------------------------------------------------


def _context(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str], str, str]:
    env = dict(os.environ)
    config = read_config(args.config, env)
    ns, name = fluid_dataset(config, env)
    if args.master or env.get("SHOAL_MASTER"):
        url = master_url(args)
    else:
        url = master_from_config(config, ns)
    return config, env, dataset_name(ns, name), url


def cmd_mount_ufs(args: argparse.Namespace) -> int:
    config, _env, name, url = _context(args)
    mounts = mounts_from_config(config)
    policy = policy_from_config(config)
    if args.check:
        import asyncio

        from shoal.cli.dataset import check_mounts

        asyncio.run(check_mounts(mounts))
    with Client(url) as c:
        try:
            current = c.dataset(name)
        except DatasetNotFound:
            c.create_dataset(name, mounts, policy)
        else:
            # Fluid runs mountUFS again after restarts: same mounts, nothing to do
            have = {(m.name, m.uri) for m in current.mounts}
            want = {(m.name, m.uri) for m in mounts}
            if have != want:
                raise InvalidArgument(
                    f"dataset {name} exists with other mounts ({sorted(have)}); shoal cannot "
                    "change a dataset's mounts: delete the Fluid Dataset and create it again"
                )
            if policy:
                c.update_dataset(name, policy)
    print(json.dumps({"mounted": [f"/{m.name}" for m in mounts]}))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    config, env, _name, url = _context(args)
    argv = [*worker_argv(config, env), f"--master={url}"]
    os.execvp(argv[0], argv)
    return 1  # not reached


def cmd_fuse(args: argparse.Namespace) -> int:
    config, env, name, url = _context(args)
    argv = [*fuse_argv(config, env, name), f"--master={url}"]
    Path(argv[2]).mkdir(parents=True, exist_ok=True)
    os.execvp(argv[0], argv)
    return 1  # not reached


def cmd_load(args: argparse.Namespace) -> int:
    _config, env, name, url = _context(args)
    failed = 0
    with Client(url) as c:
        for spec in load_specs(env, name):
            view = c.submit_job(spec.to_dict())
            while view["state"] not in (*FINAL, STOPPED):
                time.sleep(1.0)
                view = c.job(view["id"])
            print(
                f"load {view['id']} of /{name}/{','.join(spec.paths)}: {view['state']}, "
                f"{view.get('files_done', 0)} files loaded, {view.get('files_failed', 0)} failed",
                flush=True,
            )
            failed += view["state"] != DONE or bool(view.get("files_failed"))
    return 1 if failed else 0


def _api() -> tuple[str, str, ssl.SSLContext | None]:
    """(base URL, bearer token, TLS context) of the API server from inside a pod."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        raise InvalidArgument("label-node runs in a pod (no KUBERNETES_SERVICE_HOST)")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token = (_SA / "token").read_text().strip()
    return f"https://{host}:{port}", token, ssl.create_default_context(cafile=str(_SA / "ca.crt"))


def _kube(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One call to the API server with the pod's service account."""
    base, token, ctx = _api()
    req = urllib.request.Request(base + path, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        req.add_header("Content-Type", "application/merge-patch+json")
    try:
        with urllib.request.urlopen(req, data=data, context=ctx, timeout=30) as resp:
            result: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise PermissionDenied(
                f"the API server refused {method} {path} ({exc.code}): bind the pod's "
                "ServiceAccount to the node-label role (deploy/fluid/rbac.yaml)"
            ) from None
        raise Unavailable(f"the API server answered {method} {path} with {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise Unavailable(f"cannot reach the API server for {method} {path}: {exc}") from None
    return result


def cmd_label_node(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    config = read_config(None, env) if env.get("FLUID_RUNTIME_CONFIG_PATH") else {}
    ns, name = fluid_dataset(config, env)
    node = args.node or env.get("SHOAL_NODE") or env.get("NODE_NAME")
    if not node:
        raise InvalidArgument("no node: pass --node or set SHOAL_NODE from spec.nodeName")
    current = _kube("GET", f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}
    _kube("PATCH", f"/api/v1/nodes/{node}", label_patch(current, ns, name, args.remove))
    print(
        f"node {node}: {'removed' if args.remove else 'set'} labels of {ns}/{name}", file=sys.stderr
    )
    return 0
