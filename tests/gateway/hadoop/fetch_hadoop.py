"""Fetch, once, the Hadoop client that the WebHDFS gateway's tests run, and print its
Java classpath as the last line of output.

Hadoop's client jars (3.5.0) ship inside the pyspark source distribution on PyPI
(``deps/jars/``, about 456 MB): it is downloaded with pip, only the jars FsShell
needs are kept (about 50 MB) under ``$SHOAL_HADOOP_CACHE`` (default
``~/.cache/shoal/hadoop``), keyed by pyspark's version, and the sdist is deleted. The
small Java helpers beside this file are compiled with javac into the same cache, keyed
by their source's hash.

Exit status 0: the classpath is the last line. 3: the Hadoop client cannot be had here
(no java/javac, PyPI unreachable); the reason is the last line, and the tests skip.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

PYSPARK = "4.3.0"
#: the jars of deps/jars/ that hadoop's FsShell over webhdfs:// loads
JARS = re.compile(
    r"^pyspark-[^/]+/deps/jars/(hadoop-client-(api|runtime)-[\d.]+|slf4j-api-[\d.]+)\.jar$"
)
HERE = Path(__file__).resolve().parent
SKIP = 3


class Unavailable(Exception):
    pass


def fetch_timeout() -> float:
    """Seconds the download may take ($SHOAL_HADOOP_FETCH_TIMEOUT, default 900)."""
    return float(os.environ.get("SHOAL_HADOOP_FETCH_TIMEOUT") or 900)


def cache_dir() -> Path:
    root = os.environ.get("SHOAL_HADOOP_CACHE") or Path.home() / ".cache" / "shoal" / "hadoop"
    return Path(root) / f"pyspark-{PYSPARK}"


def jars(cache: Path) -> Path:
    done = cache / "jars" / ".complete"
    if done.exists():
        return done.parent
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="fetch-") as tmp:
        t0 = time.monotonic()
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            tmp,
            f"pyspark=={PYSPARK}",
        ]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=fetch_timeout())
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            err = getattr(exc, "stderr", b"") or b""
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or [
                f"no answer in {fetch_timeout():.0f}s"
            ]
            raise Unavailable(f"cannot download pyspark {PYSPARK} from PyPI: {tail[0]}") from None
        sdist = next(Path(tmp).glob("pyspark-*.tar.gz"))
        size = sdist.stat().st_size
        out = Path(tmp) / "jars"
        out.mkdir()
        with tarfile.open(sdist) as tar:
            for m in tar:
                if m.isfile() and JARS.match(m.name):
                    src = tar.extractfile(m)
                    assert src is not None
                    with open(out / Path(m.name).name, "wb") as f:
                        shutil.copyfileobj(src, f, 1 << 20)
        if len(list(out.glob("*.jar"))) != 3:
            raise Unavailable(f"pyspark {PYSPARK}'s sdist lacks the Hadoop client jars")
        (out / ".complete").write_text(
            f"pyspark {PYSPARK} sdist {size} bytes, fetched in {time.monotonic() - t0:.1f}s\n"
        )
        final = cache / "jars"
        shutil.rmtree(final, ignore_errors=True)
        out.rename(final)
    print(
        f"fetched the Hadoop client: {(final / '.complete').read_text().strip()}", file=sys.stderr
    )
    return final


def classes(cache: Path, jar_dir: Path) -> Path:
    sources = sorted(HERE.glob("*.java"))
    key = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    out = cache / f"classes-{key}"
    if (out / ".complete").exists():
        return out
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix="javac-"))
    cp = os.pathsep.join(str(p) for p in sorted(jar_dir.glob("*.jar")))
    r = subprocess.run(
        ["javac", "-nowarn", "-cp", cp, "-d", str(tmp), *map(str, sources)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"javac failed: {r.stderr[-2000:]}")
    (tmp / ".complete").touch()
    for old in cache.glob("classes-*"):  # the helpers' earlier versions
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(out)
    return out


def classpath() -> str:
    for tool in ("java", "javac"):
        if shutil.which(tool) is None:
            raise Unavailable(f"no {tool} on PATH (install openjdk-17-jdk-headless)")
    cache = cache_dir()
    jar_dir = jars(cache)
    compiled = classes(cache, jar_dir)
    return os.pathsep.join([str(compiled), *(str(p) for p in sorted(jar_dir.glob("*.jar")))])


def main() -> int:
    try:
        print(classpath())
    except Unavailable as exc:
        print(exc)
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())
