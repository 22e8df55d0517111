"""The real Hadoop client (WebHdfsFileSystem 3.5.0 from the pyspark sdist, on Java 17)
against the WebHDFS gateway over a real cluster: ``-ls -R``, ``-cat``, ``-du``,
``-get``, ``-checksum`` and getFileBlockLocations, compared with the bytes in the
bucket. Skips, saying why, when Java or PyPI cannot be had (tests/gateway/hadoop)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_gateway_webhdfs_api import hdfs_checksum, spans

pytestmark = pytest.mark.integration

HADOOP = Path(__file__).resolve().parent / "hadoop"
BLOCK = 4 << 20
ODD = "data/odd/sp ace+plus%pct ü.txt"


@pytest.fixture(scope="session")
def hadoop_classpath() -> str:
    """Fetched once into ~/.cache/shoal/hadoop (see hadoop/fetch_hadoop.py); a fetch
    that cannot finish within the test timeout skips (run the script once by hand)."""
    env = {**os.environ, "SHOAL_HADOOP_FETCH_TIMEOUT": "200"}
    r = subprocess.run(
        [sys.executable, str(HADOOP / "fetch_hadoop.py")],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
    )
    last = (r.stdout.strip().splitlines() or [""])[-1]
    if r.returncode == 3:
        pytest.skip(f"no Hadoop client here: {last}")
    assert r.returncode == 0, r.stderr[-2000:]
    return last


@pytest.fixture(scope="module")
def gateway(gw_dataset: Any, tmp_path_factory: pytest.TempPathFactory, gwkit: Any) -> Iterator[str]:
    d = tmp_path_factory.mktemp("webhdfs-hadoop")
    ds = gw_dataset.dataset
    creds = gwkit.write_credentials(
        d / "credentials.toml", {"reader": [ds], "writer": [ds], "stranger": ["other"]}
    )
    args = ["--credentials", str(creds), "--trust-user-name", "--block-size", str(BLOCK)]
    args += ["--writable", ds, "--spool-dir", str(d)]
    url, proc = gwkit.start_gateway("webhdfs", gw_dataset.cluster.master_url, args, d / "gw.log")
    try:
        yield url
    finally:
        gwkit.stop_gateway(proc)


def hadoop(cp: str, url: str, user: str, *commands: list[str]) -> list[tuple[int, bytes]]:
    """Run FsShell commands in one JVM as Hadoop user ``user``: (rc, stdout) each."""
    fs = "webhdfs://" + url.split("://", 1)[1]
    args: list[str] = []
    for c in commands:
        args += [*(["::"] if args else []), *c]
    env = {**os.environ, "HADOOP_USER_NAME": user, "LANG": "C.UTF-8"}
    cmd = [
        "java",
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-Dfile.encoding=UTF-8",
        "-Dsun.stdout.encoding=UTF-8",
        "-Dsun.stderr.encoding=UTF-8",
        "-Dorg.apache.hadoop.shaded.javax.ws.rs.ext.RuntimeDelegate=ShoalRuntimeDelegate",
        "-cp",
        cp,
        "ShoalHadoopBatch",
        fs,
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, env=env, timeout=120)
    parts = r.stdout.split(b"@@shoal rc=")
    out, results = parts[0], []
    for p in parts[1:]:
        rc, _, rest = p.partition(b"\n")
        results.append((int(rc), out))
        out = rest
    assert len(results) == len(commands), r.stderr.decode(errors="replace")[-3000:]
    if any(rc for rc, _ in results):  # shown with a failing test's output
        print(r.stderr.decode(errors="replace")[-4000:])
    return results


def test_hadoop_fs_shell(
    hadoop_classpath: str, gateway: str, gw_dataset: Any, tmp_path: Path
) -> None:
    ds = gw_dataset.dataset
    files = gw_dataset.files
    big = f"/{ds}/data/big/large.bin"
    small = sorted(k for k in files if k.startswith("data/000/"))[7]
    got = tmp_path / "large.bin"
    got_odd = tmp_path / "odd.txt"
    ls, cat_odd, cat_small, du, dus, get, get_odd, checksum, blocks, missing = hadoop(
        hadoop_classpath,
        gateway,
        "reader",
        ["-ls", "-R", f"/{ds}"],
        ["-cat", f"/{ds}/{ODD}"],
        ["-cat", f"/{ds}/{small}"],
        ["-du", f"/{ds}/data"],
        ["-du", "-s", f"/{ds}"],
        ["-get", big, str(got)],
        ["-get", f"/{ds}/{ODD}", str(got_odd)],
        ["-checksum", big],
        ["blocks", big],
        ["-cat", f"/{ds}/data/nope"],
    )
    # -ls -R: every file with its size, every directory, raw UTF-8 names included
    assert ls[0] == 0
    listed = {}
    for line in ls[1].decode().splitlines():
        cols = line.split(None, 7)
        if len(cols) == 8:
            listed[cols[7]] = (cols[0][0], int(cols[4]))
    want = {f"/{ds}/{k}": ("-", len(v)) for k, v in files.items()}
    assert {p: v for p, v in listed.items() if v[0] == "-"} == want
    assert {p for p, v in listed.items() if v[0] == "d"} == {
        f"/{ds}/data",
        f"/{ds}/data/000",
        f"/{ds}/data/big",
        f"/{ds}/data/odd",
    }
    assert cat_odd == (0, files[ODD]) and cat_small == (0, files[small])
    # -du: per child of data/, then the dataset's total
    assert du[0] == 0
    sizes = {line.split()[-1]: int(line.split()[0]) for line in du[1].decode().splitlines()}
    per_dir: dict[str, int] = {}
    for k, v in files.items():
        top = f"/{ds}/data/" + k.split("/")[1]
        per_dir[top] = per_dir.get(top, 0) + len(v)
    assert sizes == per_dir
    assert dus[0] == 0 and int(dus[1].split()[0]) == sum(len(v) for v in files.values())
    # -get: the large file (several blocks) and the UTF-8 name, byte for byte
    assert get[0] == 0 and got.read_bytes() == files["data/big/large.bin"]
    assert get_odd[0] == 0 and got_odd.read_bytes() == files[ODD]
    # -checksum: HDFS's algorithm and bytes for this block size
    assert checksum[0] == 0
    _, algorithm, hexbytes = checksum[1].decode().split()
    assert algorithm == f"MD5-of-{BLOCK // 512}MD5-of-512CRC32C"
    assert hexbytes == hdfs_checksum(files["data/big/large.bin"], BLOCK)
    # block locations: every block on the file's owning workers
    with gw_dataset.cluster.client() as c:
        d = c.dataset(ds)
        owners = c._run(c.aio.owners(d, "data/big/large.bin"))[: d.policy.replicas]
    hosts = ",".join(w.host for w in owners)
    assert blocks[0] == 0
    want_blocks = [f"{o} {n} {hosts}" for o, n in spans(len(files["data/big/large.bin"]))]
    assert blocks[1].decode().splitlines() == want_blocks
    assert missing[0] == 1


def test_hadoop_user_outside_the_dataset(
    hadoop_classpath: str, gateway: str, gw_dataset: Any
) -> None:
    ds = gw_dataset.dataset
    (ls, _), (root, out) = hadoop(
        hadoop_classpath, gateway, "stranger", ["-ls", f"/{ds}"], ["-ls", "/"]
    )
    assert ls == 1
    assert root == 0 and ds not in out.decode()


def test_hadoop_put_and_append(
    hadoop_classpath: str, gateway: str, gw_dataset: Any, tmp_path: Path
) -> None:
    """CREATE and APPEND from the real client (``-put -d``: no ._COPYING_ file and
    rename, which object stores cannot do); last, as it adds files."""
    ds = gw_dataset.dataset
    first, more = tmp_path / "first.bin", tmp_path / "more.bin"
    first.write_bytes(os.urandom(300_000))
    more.write_bytes(b"appended\n")
    # into a directory that exists: object stores have directories only as prefixes
    dst = f"/{ds}/data/big/from-hadoop ü.bin"
    put, append, cat, denied = hadoop(
        hadoop_classpath,
        gateway,
        "writer",
        ["-put", "-d", str(first), dst],
        ["-appendToFile", str(more), dst],
        ["-cat", dst],
        ["-put", "-d", str(more), dst],  # exists
    )
    assert (put[0], append[0]) == (0, 0)
    assert cat == (0, first.read_bytes() + more.read_bytes())
    assert denied[0] == 1
    ((reader_put, _),) = hadoop(
        hadoop_classpath, gateway, "reader", ["-put", "-d", str(more), f"/{ds}/data/big/r"]
    )
    assert reader_put == 1
