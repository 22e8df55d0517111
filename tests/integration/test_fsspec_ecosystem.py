"""shoal:// with the libraries ML engineers already use, over a real cluster: fsspec's
standard storage options, Hugging Face datasets (imagefolder and webdataset builders,
downloaded and streaming), webdataset's opener (plain and chained URLs), chained URLs
no dataset mounts, and parquet read by column and by row group."""

from __future__ import annotations

import io
import logging
import tarfile
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest

from shoal.core.types import Mount
from shoal.errors import InvalidArgument
from shoal.fsspec import ShoalFileSystem
from shoal.testing.cluster import TestCluster
from shoal.testing.s3 import CREDENTIALS, MotoServer, make_bucket

pytestmark = pytest.mark.integration

BUCKET = "eco-src"
OTHER = "eco-unmounted"  # a bucket no dataset mounts


def shard(n: int, first: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for i in range(first, first + n):
            for ext, data in (("txt", f"sample {i}".encode()), ("cls", str(i % 2).encode())):
                ti = tarfile.TarInfo(f"s{i:04d}.{ext}")
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def png(shade: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (shade, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()


PARQUET_ROWS = 200_000  # 10 float64 columns: 16 MB, 4 row groups of ~400 KB chunks
SHARDS = {f"shards/train-{s:04d}.tar": shard(5, 5 * s) for s in range(2)}


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory, moto: MotoServer, module_cluster: TestCluster
) -> Iterator[dict[str, Any]]:
    """``eco`` over a local directory (images, shards, a parquet file); ``s3ds`` over
    a bucket (shards, for chained URLs); a second bucket that nothing mounts."""
    pytest.importorskip("PIL")
    root = tmp_path_factory.mktemp("eco")
    back = root / "back"
    for cls in ("cat", "dog"):
        (back / "img" / "train" / cls).mkdir(parents=True)
        for i in range(3):
            (back / "img" / "train" / cls / f"{i}.png").write_bytes(png(40 * i))
    for name, data in SHARDS.items():
        (back / name).parent.mkdir(parents=True, exist_ok=True)
        (back / name).write_bytes(data)
    pd = pytest.importorskip("pandas")
    np = pytest.importorskip("numpy")
    pytest.importorskip("pyarrow")
    (back / "tab").mkdir()
    cols = {f"c{i}": np.random.default_rng(i).random(PARQUET_ROWS) for i in range(10)}
    pd.DataFrame(cols).to_parquet(back / "tab" / "part-0.parquet", row_group_size=PARQUET_ROWS // 4)
    make_bucket(moto.endpoint, BUCKET, SHARDS)
    make_bucket(moto.endpoint, OTHER, {"loose/a.bin": b"a" * 1000, "loose/b.bin": b"b" * 10})
    with module_cluster.client() as cl:
        cl.create_dataset("eco", [Mount("m", back.as_uri())])
        cl.create_dataset(
            "s3ds", [Mount("data", f"s3://{BUCKET}", {"endpoint_url": moto.endpoint})]
        )
    yield {"master": module_cluster.master_url, "back": back, "moto": moto.endpoint, "root": root}


@pytest.fixture
def master_env(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SHOAL_MASTER", env["master"])
    return str(env["master"])


def s3_opts(endpoint: str) -> dict[str, Any]:
    return {
        "endpoint_url": endpoint,
        "key": CREDENTIALS["aws_access_key_id"],
        "secret": CREDENTIALS["aws_secret_access_key"],
    }


# -- storage options ------------------------------------------------------------------


def test_standard_and_foreign_storage_options_are_accepted(master_env: str) -> None:
    url = "shoal://eco/m/shards/train-0000.tar"
    # block_size, cache_type and a framework's key for another filesystem (Hugging
    # Face passes "hf" to every filesystem) used to be a TypeError
    with fsspec.open(url, block_size=1 << 16, cache_type="bytes", hf={"token": None}) as f:
        assert f.read() == SHARDS["shards/train-0000.tar"]
        assert f.blocksize == 1 << 16
        assert f.cache.name == "bytes"
    fs = fsspec.filesystem(
        "shoal",
        use_listings_cache=True,
        listings_expiry_time=60,
        skip_instance_cache=True,
        client_kwargs={"trust_env": True},
        cache_type="readahead",
    )
    names = fs.ls("eco/m/shards", detail=False)
    assert sorted(names) == ["eco/m/shards/train-0000.tar", "eco/m/shards/train-0001.tar"]
    assert "eco/m/shards" in fs.dircache  # the listings cache is honoured when asked for
    with fs.open("eco/m/shards/train-0001.tar") as f:
        assert f.cache.name == "readahead"
    # HF streaming opens with block_size=0: reads fetch exactly what is asked
    with fsspec.open(url, block_size=0) as f:
        assert f.read(10) == SHARDS["shards/train-0000.tar"][:10]
        assert f.cache.total_requested_bytes == 10
    fs.close()


@pytest.mark.parametrize(
    ("kwargs", "hint"),
    [
        ({"mastr": "http://x"}, "did you mean 'master'"),
        ({"client_option": {}}, "did you mean 'client_options'"),
        ({"client_options": {"short_circut": False}}, "did you mean 'short_circuit'"),
        ({"blocksize": 10}, "did you mean 'block_size'"),
        ({"unmounted": "cache"}, "unmounted must be one of"),
    ],
)
def test_typos_in_shoal_options_are_refused(master_env: str, kwargs: Any, hint: str) -> None:
    with pytest.raises(InvalidArgument, match=hint):
        ShoalFileSystem(skip_instance_cache=True, **kwargs)


def test_client_settings_are_accepted_at_the_top(master_env: str) -> None:
    fs = ShoalFileSystem(skip_instance_cache=True, short_circuit=False, request_timeout=5)
    assert fs.settings.short_circuit is False and fs.settings.request_timeout == 5
    assert fs.cat("eco/m/shards/train-0000.tar") == SHARDS["shards/train-0000.tar"]
    fs.close()


# -- Hugging Face datasets ------------------------------------------------------------


@pytest.fixture
def hf(env: dict[str, Any], master_env: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return datasets


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_imagefolder(hf: Any, env: dict[str, Any], streaming: bool) -> None:
    ds = hf.load_dataset(
        "imagefolder",
        data_files={"train": "shoal://eco/m/img/train/**"},
        split="train",
        streaming=streaming,
        cache_dir=str(env["root"] / "hf-img"),
    )
    rows = list(ds)
    assert len(rows) == 6
    names = ds.features["label"].names
    assert sorted(names) == ["cat", "dog"]
    assert {r["image"].size for r in rows} == {(8, 8)}


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_webdataset(hf: Any, env: dict[str, Any], streaming: bool) -> None:
    ds = hf.load_dataset(
        "webdataset",
        data_files={"train": "shoal://eco/m/shards/*.tar"},
        split="train",
        streaming=streaming,
        cache_dir=str(env["root"] / "hf-wds"),
    )
    rows = sorted(ds, key=lambda r: r["__key__"])
    assert [r["txt"] for r in rows] == [f"sample {i}" for i in range(10)]


# -- webdataset -----------------------------------------------------------------------


def test_webdataset_reads_plain_and_chained_shards(env: dict[str, Any], master_env: str) -> None:
    wds = pytest.importorskip("webdataset")
    import shoal.webdataset as swds

    plain = swds.shards("shoal://eco/m/shards/train-{0000..0001}.tar")
    assert plain == ["shoal://eco/m/shards/train-0000.tar", "shoal://eco/m/shards/train-0001.tar"]
    got = [s["txt"] for s in wds.WebDataset(plain, shardshuffle=False).decode()]
    assert got == [f"sample {i}" for i in range(10)]
    # a chained URL in a string would be split on "::" by webdataset: shards() lists it
    chained = swds.shards(f"shoal::s3://{BUCKET}/shards/train-{{0000..0001}}.tar")
    assert chained[0] == f"shoal::s3://{BUCKET}/shards/train-0000.tar"
    got = [s["__key__"] for s in wds.WebDataset(chained, shardshuffle=False)]
    assert got == [f"s{i:04d}" for i in range(10)]


# -- chained URLs no dataset mounts ---------------------------------------------------


def test_unmounted_chained_url_reads_through_the_underlying_fs(
    env: dict[str, Any], master_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"shoal::s3://{OTHER}/loose/a.bin"
    opts = {"s3": s3_opts(env["moto"]), "shoal": {"skip_instance_cache": True}}
    with caplog.at_level(logging.WARNING, logger="shoal.fsspec"):
        of = fsspec.open(url, **opts)
        with of as f:
            assert f.read() == b"a" * 1000
        fs = of.fs
        assert sorted(fs.ls(f"{OTHER}/loose", detail=False)) == [
            f"{OTHER}/loose/a.bin",
            f"{OTHER}/loose/b.bin",
        ]
        assert fs.cat([f"{OTHER}/loose/b.bin"]) == {f"{OTHER}/loose/b.bin": b"b" * 10}
        assert fs.info(f"{OTHER}/loose/b.bin")["size"] == 10
    st = fs.unmounted_stats
    assert st.reads >= 2 and st.bytes >= 1010 and st.prefixes == {OTHER}
    reads = st.reads
    warned = [r for r in caplog.records if "no shoal dataset mounts" in r.getMessage()]
    assert len(warned) == 1  # once per bucket, not per read
    assert "testing" not in warned[0].getMessage()  # no credentials in logs
    # a mounted bucket on the same filesystem still goes through the cache
    assert fs.cat_file(f"{BUCKET}/shards/train-0000.tar") == SHARDS["shards/train-0000.tar"]
    assert fs.unmounted_stats.reads == reads
    fs.close()


def test_unmounted_raise_is_file_not_found(env: dict[str, Any], master_env: str) -> None:
    opts = {
        "s3": s3_opts(env["moto"]),
        "shoal": {"unmounted": "raise", "skip_instance_cache": True},
    }
    of = fsspec.open(f"shoal::s3://{OTHER}/loose/a.bin", **opts)
    with pytest.raises(FileNotFoundError, match="no shoal dataset mounts"):
        of.open()


# -- parquet --------------------------------------------------------------------------


def test_parquet_columns_and_row_groups_equal_the_local_file(
    env: dict[str, Any], master_env: str
) -> None:
    pd = pytest.importorskip("pandas")
    pq = pytest.importorskip("pyarrow.parquet")
    local = env["back"] / "tab" / "part-0.parquet"
    url = "shoal://eco/m/tab/part-0.parquet"
    got = pd.read_parquet(url, columns=["c3", "c7"])
    pd.testing.assert_frame_equal(got, pd.read_parquet(local, columns=["c3", "c7"]))
    fs = ShoalFileSystem(skip_instance_cache=True)
    with fs.open("eco/m/tab/part-0.parquet") as f:
        table = pq.ParquetFile(f).read_row_group(2, columns=["c0", "c1"])
    assert table.equals(pq.ParquetFile(local).read_row_group(2, columns=["c0", "c1"]))
    assert fs.cat_file("eco/m/tab/part-0.parquet") == local.read_bytes()


def test_parquet_reads_fetch_about_what_they_touch(env: dict[str, Any], master_env: str) -> None:
    """A seek fetches the bytes asked for, not a 4 MiB block past them (a 2-column
    read used to fetch several times the bytes it needed)."""
    pq = pytest.importorskip("pyarrow.parquet")
    local = env["back"] / "tab" / "part-0.parquet"
    meta = pq.ParquetFile(local).metadata
    rg = meta.row_group(1)
    chunks = [rg.column(i) for i in (4, 8)]  # two columns, not adjacent
    needed = sum(c.total_compressed_size for c in chunks) + meta.serialized_size + 8
    fs = ShoalFileSystem(skip_instance_cache=True)
    with fs.open("eco/m/tab/part-0.parquet") as f:
        pq.ParquetFile(f).read_row_group(1, columns=["c4", "c8"])
        requested = f.cache.total_requested_bytes
    # pyarrow reads a 64 KiB tail for the footer; the rest is the two column chunks
    assert requested <= needed + (64 << 10), (requested, needed)
    fs.close()
