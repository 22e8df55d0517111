"""``shoal fluid ...``: Fluid's runtime.json and environment mapped onto shoal, and the
mountUFS entry and the DataLoad operation run against a real cluster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from shoal.cli import fluid
from shoal.errors import InvalidArgument
from shoal.testing.cluster import TestCluster
from shoal.testing.s3 import MotoServer, make_bucket, write_credentials_file


def _config(mounts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """runtime.json as Fluid's CacheEngine writes it (pkg/common CacheRuntimeConfig)."""
    return {
        "mounts": mounts,
        "accessModes": ["ReadOnlyMany"],
        "targetPath": "/runtime-mnt/cache/default/imagenet/cache-fuse",
        "master": {
            "enabled": True,
            "name": "imagenet-master",
            "replicas": 1,
            "options": {"port": "19999", "dataset.replicas": "1", "dataset.staleness": "never"},
            "service": {"name": "imagenet-master"},
        },
        **extra,
    }


def _run(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    fluid.register(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    code: int = args.handler(args)
    return code


# -- the mapping ----------------------------------------------------------------------


def test_mounts_take_fluid_paths_as_names_and_credentials_as_files() -> None:
    config = _config(
        [
            {"name": "train", "mountPoint": "s3://b/train", "options": {"region": "eu-west-1"}},
            {
                "name": "x",
                "path": "/val",
                "mountPoint": "s3://b/val",
                "encryptOptions": {"credentials_file": "/etc/fluid/secrets/s3/credentials"},
            },
        ]
    )
    mounts = fluid.mounts_from_config(config)
    assert [(m.name, m.uri) for m in mounts] == [("train", "s3://b/train"), ("val", "s3://b/val")]
    assert mounts[0].options == {"region": "eu-west-1"}
    assert mounts[1].options == {"credentials_file": "/etc/fluid/secrets/s3/credentials"}
    assert fluid.policy_from_config(config) == {"replicas": "1", "staleness": "never"}


@pytest.mark.parametrize(
    ("mount", "message"),
    [
        (
            {"name": "a", "mountPoint": "s3://b/a", "encryptOptions": {"access-key": "/f"}},
            "encryptOption 'access-key' is not supported",
        ),
        ({"name": "", "path": "/", "mountPoint": "s3://b/a"}, "path '/' is not supported"),
        ({"name": "a", "path": "/a/b", "mountPoint": "s3://b/a"}, "must be one level"),
        # a secret as a plain option is refused by shoal's own Mount check
        ({"name": "a", "mountPoint": "s3://b", "options": {"secret": "x"}}, "would store a secret"),
    ],
)
def test_unusable_mounts_fail_with_the_reason(mount: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        fluid.mounts_from_config(_config([mount]))


def test_dataset_name_from_env_or_the_runtime_components() -> None:
    env = {"FLUID_DATASET_NAME": "imagenet", "FLUID_DATASET_NAMESPACE": "ml"}
    assert fluid.fluid_dataset({}, env) == ("ml", "imagenet")
    # DataLoad pods have runtime.json but maybe not FLUID_DATASET_NAME
    assert fluid.fluid_dataset(_config([]), {"POD_NAMESPACE": "ml"}) == ("ml", "imagenet")
    assert fluid.dataset_name("ml", "imagenet") == "ml.imagenet"
    assert fluid.master_from_config(_config([]), "ml") == "http://imagenet-master.ml.svc:19999"


def test_worker_tiers_from_tiered_store_levels() -> None:
    worker = {
        "options": {"ufsConcurrency": "64"},
        "tieredStoreLevels": [
            {"mediumType": "MEM", "mountPaths": ["/dev/shm/shoal"], "quotas": ["8Gi"]},
            {
                "mediumType": "SSD",
                "mountPaths": ["/mnt/nvme"],
                "quotas": ["500Gi"],
                "high": "0.9",
                "low": "0.7",
            },
        ],
    }
    argv = fluid.worker_argv(_config([], worker=worker), {"POD_IP": "10.0.0.7"})
    assert argv[:2] == ["shoal", "worker"]
    assert "--advertise-host=10.0.0.7" in argv and "--ufs-concurrency=64" in argv
    assert [a for a in argv if a.startswith("--tier=")] == [
        "--tier=mem:/dev/shm/shoal:8Gi",
        "--tier=ssd:/mnt/nvme:500Gi:0.9:0.7",
    ]
    two_paths = {"mediumType": "SSD", "mountPaths": ["/a", "/b"], "quotas": ["1Gi", "1Gi"]}
    with pytest.raises(InvalidArgument, match="one path and one quota"):
        fluid.worker_argv(_config([], worker={"tieredStoreLevels": [two_paths]}), {})


def test_fuse_mounts_the_one_dataset_on_fluids_target_path() -> None:
    config = _config([], client={"options": {"kernelOpen": "true", "readaheadKiB": "4096"}})
    argv = fluid.fuse_argv(config, {"FLUID_RUNTIME_MOUNT_PATH": "/mnt/x"}, "ml.imagenet")
    assert argv == [
        "shoal",
        "mount",
        "/mnt/x",
        "--foreground",
        "--dataset",
        "ml.imagenet",
        "--kernel-open",
        "--readahead=4096",
    ]


def test_dataload_paths_become_one_job_per_replica_count() -> None:
    env = {
        "FLUID_DATALOAD_DATA_PATH": "/train:/val:/extra/part1",
        "FLUID_DATALOAD_PATH_REPLICAS": "1:2:1",
        "FLUID_DATALOAD_METADATA": "true",
    }
    specs = fluid.load_specs(env, "ml.imagenet")
    assert [(s.paths, s.replicas, s.metadata_only) for s in specs] == [
        (("train", "extra/part1"), 1, False),
        (("val",), 2, False),
        (("",), None, True),
    ]
    assert [s.paths for s in fluid.load_specs({}, "d")] == [("",)]
    with pytest.raises(InvalidArgument, match="one count per path"):
        fluid.load_specs(
            {"FLUID_DATALOAD_DATA_PATH": "/a:/b", "FLUID_DATALOAD_PATH_REPLICAS": "1"}, "d"
        )


def test_node_labels_and_dataset_count() -> None:
    other = {"fluid.io/s-ml-coco": "true", "fluid.io/s-alluxio-ml-coco": "true"}
    patch = fluid.label_patch(other, "ml", "imagenet", remove=False)["metadata"]["labels"]
    assert patch == {
        "fluid.io/s-ml-imagenet": "true",
        "fluid.io/s-shoal-ml-imagenet": "true",
        "fluid.io/dataset-num": "2",
    }
    after = {**other, **{k: v for k, v in patch.items() if v}}
    removed = fluid.label_patch(after, "ml", "imagenet", remove=True)["metadata"]["labels"]
    assert removed == {
        "fluid.io/s-ml-imagenet": None,
        "fluid.io/s-shoal-ml-imagenet": None,
        "fluid.io/dataset-num": "1",
    }
    last = fluid.label_patch(
        {"fluid.io/s-ml-a": "true", "fluid.io/s-shoal-ml-a": "true"}, "ml", "a", remove=True
    )
    assert last["metadata"]["labels"]["fluid.io/dataset-num"] is None  # label dropped


# -- against a real master -------------------------------------------------------------


@pytest.fixture
def fluid_env(
    tmp_path: Path, moto: MotoServer, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A bucket with files, and runtime.json + FLUID_* env as in <runtime>-master-0."""
    make_bucket(
        moto.endpoint, bucket, {"train/a.jpg": b"A" * 1000, "train/b.jpg": b"B" * 50, "val/c": b"C"}
    )
    creds = write_credentials_file(tmp_path / "credentials")
    shared = {"endpoint_url": moto.endpoint, "credentials_file": creds}
    config = _config(
        [
            {"name": "train", "mountPoint": f"s3://{bucket}/train", "options": shared},
            {"name": "val", "mountPoint": f"s3://{bucket}/val", "options": shared},
        ]
    )
    path = tmp_path / "runtime.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("FLUID_RUNTIME_CONFIG_PATH", str(path))
    monkeypatch.setenv("FLUID_DATASET_NAME", bucket)
    monkeypatch.setenv("FLUID_DATASET_NAMESPACE", "ml")
    return path


def test_mount_ufs_creates_the_dataset_and_prints_what_fluid_expects(
    module_cluster: TestCluster, fluid_env: Path, bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = module_cluster.master_url
    assert _run(["fluid", "mount-ufs", "--master", url, "--check"]) == 0
    assert json.loads(capsys.readouterr().out) == {"mounted": ["/train", "/val"]}
    name = f"ml.{bucket}"
    with module_cluster.client() as c:
        ds = c.dataset(name)
        assert [m.name for m in ds.mounts] == ["train", "val"]
        assert ds.policy.replicas == 1
        assert c.cat(f"/{name}/train/a.jpg") == b"A" * 1000
    # Fluid runs it again after a master restart: the same answer, nothing changed
    assert _run(["fluid", "mount-ufs", "--master", url]) == 0
    assert json.loads(capsys.readouterr().out) == {"mounted": ["/train", "/val"]}
    config = json.loads(fluid_env.read_text())
    config["mounts"][1]["mountPoint"] = f"s3://{bucket}/other"
    fluid_env.write_text(json.dumps(config))
    with pytest.raises(InvalidArgument, match="exists with other mounts"):
        _run(["fluid", "mount-ufs", "--master", url])


def test_dataload_operation_loads_the_paths_fluid_names(
    module_cluster: TestCluster,
    fluid_env: Path,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = module_cluster.master_url
    assert _run(["fluid", "mount-ufs", "--master", url]) == 0
    monkeypatch.setenv("FLUID_DATALOAD_DATA_PATH", "/train")
    monkeypatch.setenv("FLUID_DATALOAD_PATH_REPLICAS", "1")
    assert _run(["fluid", "load", "--master", url]) == 0
    out = capsys.readouterr().out
    assert f"of /ml.{bucket}/train: done, 2 files loaded, 0 failed" in out, out


class _FakeNodes:
    """The two node calls label-node makes, against an in-memory Node (merge patch)."""

    def __init__(self, labels: dict[str, str], status: int = 200) -> None:
        import http.server
        import threading

        self.labels = dict(labels)
        self.auth: list[str] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                fake.auth.append(self.headers.get("Authorization", ""))
                if status != 200:
                    self.send_error(status)
                    return
                body = json.dumps({"metadata": {"name": "n1", "labels": fake.labels}}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer()

            def do_PATCH(self) -> None:
                assert self.headers["Content-Type"] == "application/merge-patch+json"
                patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                for k, v in patch["metadata"]["labels"].items():
                    if v is None:
                        fake.labels.pop(k, None)
                    else:
                        fake.labels[k] = v
                self._answer()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_label_node_sets_and_removes_fluids_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _FakeNodes({"kubernetes.io/hostname": "n1", "fluid.io/s-ml-coco": "true"})
    monkeypatch.setattr(fluid, "_api", lambda: (api.url, "tok", None))
    monkeypatch.setenv("FLUID_DATASET_NAME", "imagenet")
    monkeypatch.setenv("FLUID_DATASET_NAMESPACE", "ml")
    monkeypatch.delenv("FLUID_RUNTIME_CONFIG_PATH", raising=False)
    try:
        assert _run(["fluid", "label-node", "--node", "n1"]) == 0
        assert api.labels == {
            "kubernetes.io/hostname": "n1",
            "fluid.io/s-ml-coco": "true",
            "fluid.io/s-ml-imagenet": "true",
            "fluid.io/s-shoal-ml-imagenet": "true",
            "fluid.io/dataset-num": "2",
        }
        assert _run(["fluid", "label-node", "--node", "n1", "--remove"]) == 0
        assert api.labels == {
            "kubernetes.io/hostname": "n1",
            "fluid.io/s-ml-coco": "true",
            "fluid.io/dataset-num": "1",
        }
        assert set(api.auth) == {"Bearer tok"}
    finally:
        api.close()


def test_label_node_without_rights_says_which_role_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shoal.errors import PermissionDenied

    api = _FakeNodes({}, status=403)
    monkeypatch.setattr(fluid, "_api", lambda: (api.url, "tok", None))
    monkeypatch.setenv("FLUID_DATASET_NAME", "imagenet")
    monkeypatch.setenv("FLUID_DATASET_NAMESPACE", "ml")
    try:
        with pytest.raises(PermissionDenied, match=r"deploy/fluid/rbac.yaml"):
            _run(["fluid", "label-node", "--node", "n1"])
    finally:
        api.close()
