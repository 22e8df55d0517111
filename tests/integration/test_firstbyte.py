"""A fresh process's first reads through the sync client's blocking local path
(shoal.client.direct: no asyncio, no loop thread), against a real cluster with a
secret: the token rides the HELLO and the master's GETs (a reader token for the
dataset is served, a garbage one refused in one line by the async path it falls
back to), a file not cached yet is loaded and read right, a missing file raises
NotFound (from the async path), and a forked child reads on its own connections."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core.tokens import READER, load_secret, mint
from shoal.core.types import Mount
from shoal.testing.cluster import S3_ENV, TestCluster

pytestmark = pytest.mark.integration

#: bytes per file: ranges within and across its pages are read
SIZE = 300 << 10


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestCluster, Path]]:
    root = tmp_path_factory.mktemp("firstbyte")
    src = root / "src"
    (src / "d").mkdir(parents=True)
    for i in range(4):
        (src / "d" / f"f{i}.bin").write_bytes(os.urandom(SIZE + i))
    c = TestCluster(root / "c", workers=1, env=dict(S3_ENV), auth=True, mem="0", disk="64MiB")
    c.start()
    try:
        with c.client() as cl:  # the admin's token
            cl.create_dataset("fb", [Mount("m", f"file://{src}", {})], {"staleness": "never"})
            for i in range(3):  # f3 stays cold
                assert cl.read(f"fb/m/d/f{i}.bin") == (src / "d" / f"f{i}.bin").read_bytes()
        yield c, src
    finally:
        c.stop()


def _run(c: TestCluster, code: str, token: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(SHOAL_TOKEN=token, SHOAL_HOME=str(c.dir / "home"))
    prelude = (
        "import sys, threading\n"
        "from shoal.client import Client\n"
        f"cl = Client({c.master_url!r})\n"
        "def local_only():\n"
        "    assert 'asyncio' not in sys.modules and 'uvloop' not in sys.modules\n"
        "    assert 'shoal-client' not in [t.name for t in threading.enumerate()]\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _reader(c: TestCluster) -> str:
    return mint(load_secret(c.secret_file), "reader", READER, ["fb"])


def test_a_reader_token_is_served_without_the_loop(secured: tuple[TestCluster, Path]) -> None:
    c, src = secured
    code = (
        f"want = open({str(src / 'd' / 'f1.bin')!r}, 'rb').read()\n"
        "assert cl.read('fb/m/d/f1.bin') == want\n"
        "assert cl.read('/fb/m/d/f0.bin', 70000, 9) == "
        f"open({str(src / 'd' / 'f0.bin')!r}, 'rb').read()[70000:70009]\n"
        "assert cl.read('shoal://fb/m/d/f2.bin', 5) == "
        f"open({str(src / 'd' / 'f2.bin')!r}, 'rb').read()[5:]\n"
        "local_only()\n"
        "assert cl.counters()['short_circuit'] == 3, cl.counters()\n"
    )
    out = _run(c, code, _reader(c))
    assert out.returncode == 0, out.stderr


def test_a_garbage_token_is_refused_in_one_line(secured: tuple[TestCluster, Path]) -> None:
    c, _src = secured
    code = (
        "from shoal.errors import Unauthenticated\n"
        "try:\n"
        "    cl.read('fb/m/d/f1.bin')\n"
        "except Unauthenticated as exc:\n"
        "    print('refused:', exc)\n"
    )
    out = _run(c, code, "not.a.token")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused:") and len(out.stdout.strip().splitlines()) == 1


def test_cold_missing_and_forked_reads(secured: tuple[TestCluster, Path]) -> None:
    c, src = secured
    code = (
        "import os\n"
        "from shoal.errors import NotFound\n"
        f"cold = open({str(src / 'd' / 'f3.bin')!r}, 'rb').read()\n"
        "assert cl.read('fb/m/d/f3.bin') == cold  # loaded by the worker now\n"
        "local_only()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = cl.read('fb/m/d/f0.bin') == "
        f"open({str(src / 'd' / 'f0.bin')!r}, 'rb').read()\n"
        "    ok = ok and cl.read('fb/m/d/f3.bin', 10, 10) == cold[10:20]\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0, status\n"
        "assert cl.read('fb/m/d/f3.bin', 100, 50) == cold[100:150]  # the parent's own\n"
        "try:\n"
        "    cl.read('fb/m/d/nope.bin')\n"
        "    raise SystemExit('read a missing file')\n"
        "except NotFound:\n"
        "    pass\n"
    )
    out = _run(c, code, _reader(c))
    assert out.returncode == 0, out.stderr
