"""The README's Python section runs as written: every ``python`` code block of
"Using shoal from Python" is taken from README.md and run in a fresh interpreter
against a real cluster holding the datasets the examples name (``imagenet`` over S3,
``tables`` and ``laion`` over local directories). The only substitutions: the
master's URL for the README's ``http://127.0.0.1:19999``, and fewer epochs and
DataLoader workers in the training loop. The torchvision block runs with PyPI's torch
and torchvision, in an overlay over this environment (``shoal.testing.overlay``): this
venv holds the CPU build of torch, beside which PyPI's torchvision does not import."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from shoal.core.types import Mount
from shoal.testing.cluster import S3_ENV, TestCluster
from shoal.testing.s3 import MotoServer, make_bucket

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "### Using shoal from Python (fsspec, PyTorch)"
README_MASTER = "http://127.0.0.1:19999"
#: (README text, what the test runs instead): the loop's size only
SMALLER = [("range(90)", "range(2)"), ("num_workers=8", "num_workers=2")]
#: what a training loop must have produced by its end (appended to the block)
LOOP_CHECK = (
    "\n    assert tuple(images.shape[1:]) == (3, 224, 224) and images.dtype == torch.float32, images.shape"
    "\n    assert set(labels) <= {'n01440764', 'n01443537'} and len(labels) == images.shape[0], labels\n"
)


def python_blocks() -> list[str]:
    text = README.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start)
    section = text[start : end if end >= 0 else None]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


BLOCKS = python_blocks()


def block_id(code: str) -> str:
    keys = ("load_dataset", "webdataset", "read_parquet", "torchvision", "DataLoader", "shoal::", "fsspec")  # fmt: skip
    for key in keys:
        if key in code:
            return key.strip(":").replace("_", "-")
    return "block"


def jpeg(shade: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (shade, 100, 0)).save(buf, format="JPEG")
    return buf.getvalue()


def shard(first: int, n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for i in range(first, first + n):
            for ext, data in (("txt", f"caption {i}".encode()), ("cls", str(i % 3).encode())):
                ti = tarfile.TarInfo(f"{i:06d}.{ext}")
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def readme_env(
    tmp_path_factory: pytest.TempPathFactory, moto: MotoServer, module_cluster: TestCluster
) -> dict[str, Any]:
    pytest.importorskip("PIL")
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    root = tmp_path_factory.mktemp("readme")
    images = {"train/n01440764/x.jpg": jpeg(0)}
    for cls in ("n01440764", "n01443537"):
        for i in range(4):
            images[f"train/{cls}/{i}.jpg"] = jpeg(30 * i)
    make_bucket(moto.endpoint, "bucket", images)
    tables = root / "tables"
    tables.mkdir()
    n = 1000
    df = pd.DataFrame({"user": [f"u{i % 17}" for i in range(n)], "score": range(n)})
    df.to_parquet(tables / "part-0.parquet", row_group_size=250)
    shards = root / "shards"
    shards.mkdir()
    for s in range(2):
        (shards / f"train-{s:04d}.tar").write_bytes(shard(4 * s, 4))
    with module_cluster.client() as cl:
        s3 = {"endpoint_url": moto.endpoint}
        cl.create_dataset("imagenet", [Mount("train", "s3://bucket/train", s3)])
        cl.create_dataset("tables", [Mount("data", tables.as_uri())])
        cl.create_dataset("laion", [Mount("shards", shards.as_uri())])
    return {"master": module_cluster.master_url, "root": root}


def test_the_section_has_every_example() -> None:
    ids = {block_id(b) for b in BLOCKS}
    want = {"load-dataset", "webdataset", "read-parquet", "torchvision", "DataLoader", "shoal"}
    assert want <= ids


@pytest.fixture(scope="session")
def torchvision_python() -> Path:
    """An interpreter with PyPI's torch and torchvision over this environment."""
    from shoal.testing import overlay

    python = overlay.overlay_python("torchvision", overlay.TORCHVISION, timeout=900)
    if python is None:
        pytest.skip(overlay.LAST_ERROR)
    return python


@pytest.mark.timeout(900)  # the torchvision overlay is built once (~1 min from local wheels)
@pytest.mark.parametrize("code", BLOCKS, ids=[block_id(b) for b in BLOCKS])
def test_readme_example_runs_as_written(
    readme_env: dict[str, Any], code: str, request: pytest.FixtureRequest
) -> None:
    python = sys.executable
    if "torchvision" in code:
        python = str(request.getfixturevalue("torchvision_python"))
    if "load_dataset" in code:
        pytest.importorskip("datasets")
    if "webdataset" in code:
        pytest.importorskip("webdataset")
    if "torch" in code:
        pytest.importorskip("torch")
    code = code.replace(README_MASTER, readme_env["master"])
    for old, new in SMALLER:
        code = code.replace(old, new)
    if "for images, labels in loader" in code:
        code += LOOP_CHECK
    env = {
        **os.environ,
        **S3_ENV,
        "SHOAL_MASTER": readme_env["master"],
        "HF_HOME": str(readme_env["root"] / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    proc = subprocess.run(
        [python, "-c", code],
        cwd=readme_env["root"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
