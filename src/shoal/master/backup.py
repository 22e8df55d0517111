"""Master backup and restore: one archive holds everything a new master needs.

A backup is a tar file with, in this order:

- ``backup.json`` -- the format, the shoal version, when it was taken, counts, and the
  size and sha256 of every other member;
- ``master.db`` -- datasets (policies, mounts, generations), worker registrations and
  their key hashes, the ring epoch;
- ``jobs.db`` -- jobs, their tasks and the cron schedules;
- ``manifests/<dataset>.msgpack`` -- every dataset's manifest, so a restored master
  lists a million-file dataset again without listing the store.

Consistency: the master's state calls run synchronously on its event loop, so
:func:`snapshot` (also synchronous) sees both databases and the manifest directory at
one instant: SQLite's online backup API copies each database while the master keeps
its connections open, and manifests are hard-linked (a manifest is replaced by
rename, never rewritten in place, so the link keeps the version of that instant). The
tar itself is written afterwards, off the loop.

:func:`restore` checks the archive before it touches the target: only the members
above, every size and checksum as recorded, both databases pass SQLite's integrity
check; then it moves them into the state directory in one rename. A master started on
the restored directory serves the same datasets, schedules and jobs; workers keep
their cached pages (keyed by file version, which the restored manifests still name).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import sqlite3
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import shoal
from shoal.errors import InvalidArgument
from shoal.master.lease import LOCK_NAME, in_use

FORMAT = 1
INDEX = "backup.json"
DATABASES = ("master.db", "jobs.db")
MANIFESTS = "manifests"
_MANIFEST_NAME = re.compile(r"^manifests/[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.msgpack$")
#: largest member a restore accepts (a manifest of tens of millions of files fits)
MAX_MEMBER = 16 << 30


class BadBackup(InvalidArgument):
    """The archive is not a shoal master backup, or it is damaged."""


@dataclass(frozen=True)
class BackupInfo:
    path: str
    size: int
    datasets: int
    jobs: int
    manifests: int
    created: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "datasets": self.datasets,
            "jobs": self.jobs,
            "manifests": self.manifests,
            "created": self.created,
        }


def copy_db(conn: sqlite3.Connection, dest: str) -> None:
    """SQLite's online backup of ``conn`` into a new database file at ``dest``."""
    out = sqlite3.connect(dest)
    try:
        conn.backup(out)
    finally:
        out.close()


#: writes one database's copy to the given path (MasterState/JobState.backup_into)
CopyDb = Callable[[str], None]


def snapshot(master_db: CopyDb, jobs_db: CopyDb, state_dir: str) -> str:
    """Copy the state at this instant into a new directory under ``state_dir`` and
    return its path (the caller removes it). Synchronous on purpose: see the module."""
    work = tempfile.mkdtemp(prefix=".backup-", dir=state_dir)
    try:
        master_db(os.path.join(work, "master.db"))
        jobs_db(os.path.join(work, "jobs.db"))
        src = os.path.join(state_dir, MANIFESTS)
        dst = os.path.join(work, MANIFESTS)
        os.mkdir(dst)
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(src):
                if name.endswith(".msgpack") and not name.startswith("."):
                    try:
                        os.link(os.path.join(src, name), os.path.join(dst, name))
                    except FileNotFoundError:
                        continue  # dropped since the listing: not part of this instant
                    except OSError:
                        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return work


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _count(db: str, table: str) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def _members(work: str) -> list[str]:
    names = list(DATABASES)
    names += sorted(f"{MANIFESTS}/{n}" for n in os.listdir(os.path.join(work, MANIFESTS)))
    return names


def write_archive(work: str, dest: str) -> BackupInfo:
    """Write the snapshot in ``work`` as a backup archive at ``dest`` (atomically)."""
    names = _members(work)
    files = {
        n: {
            "size": os.path.getsize(os.path.join(work, n)),
            "sha256": _sha256(os.path.join(work, n)),
        }
        for n in names
    }
    created = time.time()
    datasets = _count(os.path.join(work, "master.db"), "datasets")
    jobs = _count(os.path.join(work, "jobs.db"), "jobs")
    manifests = len(names) - len(DATABASES)
    index = {
        "format": FORMAT,
        "shoal": shoal.__version__,
        "created": created,
        "datasets": datasets,
        "jobs": jobs,
        "manifests": manifests,
        "files": files,
    }
    raw = json.dumps(index, indent=1, sort_keys=True).encode()
    directory = os.path.dirname(os.path.abspath(dest)) or "."
    fd, tmp = tempfile.mkstemp(prefix=".backup-", suffix=".tar", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w") as tar:
            ti = tarfile.TarInfo(INDEX)
            ti.size, ti.mtime, ti.mode = len(raw), int(created), 0o600
            tar.addfile(ti, io.BytesIO(raw))
            for n in names:
                ti = tar.gettarinfo(os.path.join(work, n), arcname=n)
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                ti.mode = 0o600
                with open(os.path.join(work, n), "rb") as src:
                    tar.addfile(ti, src)
            tar.close()
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return BackupInfo(dest, os.path.getsize(dest), datasets, jobs, manifests, created)


# -- restore ----------------------------------------------------------------------------


def _index(tar: tarfile.TarFile) -> dict[str, Any]:
    first = tar.next()
    if first is None or first.name != INDEX or not first.isfile() or first.size > 1 << 26:
        raise BadBackup("not a shoal master backup (it does not start with backup.json)")
    f = tar.extractfile(first)
    assert f is not None
    try:
        index = json.loads(f.read())
    except ValueError:
        raise BadBackup("damaged backup: backup.json is not JSON") from None
    if not isinstance(index, dict) or not isinstance(index.get("files"), dict):
        raise BadBackup("damaged backup: backup.json has no file list")
    if index.get("format") != FORMAT:
        raise BadBackup(
            f"backup format {index.get('format')!r} is not {FORMAT}: restore it with the "
            f"shoal version that wrote it ({index.get('shoal', 'unknown')})"
        )
    return index


def _allowed(name: str) -> bool:
    return name in DATABASES or bool(_MANIFEST_NAME.match(name))


def _extract(tar: tarfile.TarFile, index: dict[str, Any], work: str) -> None:
    files: dict[str, Any] = index["files"]
    seen: set[str] = set()
    os.mkdir(os.path.join(work, MANIFESTS))
    while (m := tar.next()) is not None:
        if not m.isfile() or not _allowed(m.name) or m.name in seen:
            raise BadBackup(f"damaged backup: unexpected member {m.name!r}")
        want = files.get(m.name)
        if not isinstance(want, dict) or want.get("size") != m.size or m.size > MAX_MEMBER:
            raise BadBackup(f"damaged backup: {m.name} is not the size backup.json records")
        src = tar.extractfile(m)
        assert src is not None
        h = hashlib.sha256()
        with open(os.path.join(work, m.name), "wb") as out:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != want.get("sha256"):
            raise BadBackup(f"damaged backup: {m.name} does not match its checksum")
        seen.add(m.name)
    missing = sorted(set(files) - seen)
    if missing:
        raise BadBackup(f"damaged backup: {missing[0]} is missing (truncated archive?)")
    for db in DATABASES:
        if db not in seen:
            raise BadBackup(f"damaged backup: it has no {db}")
        conn = sqlite3.connect(f"file:{os.path.join(work, db)}?mode=ro", uri=True)
        try:
            ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
        except sqlite3.DatabaseError:
            ok = "not a database"
        finally:
            conn.close()
        if ok != "ok":
            raise BadBackup(f"damaged backup: {db} fails SQLite's integrity check ({ok})")


def verify(archive: str) -> dict[str, Any]:
    """Check ``archive`` as :func:`restore` would (members, sizes, checksums, SQLite
    integrity) without installing it; returns its index less the file list."""
    with tempfile.TemporaryDirectory(
        prefix=".verify-", dir=os.path.dirname(os.path.abspath(archive))
    ) as work:
        index = _read_into(archive, work)
    return {k: v for k, v in index.items() if k != "files"}


def _read_into(archive: str, work: str) -> dict[str, Any]:
    try:
        tar = tarfile.open(archive, mode="r:")  # noqa: SIM115 (closed by the with below)
    except FileNotFoundError:
        raise InvalidArgument(f"no backup at {archive}") from None
    except (tarfile.TarError, OSError) as exc:
        raise BadBackup(f"{archive} is not a shoal master backup ({exc})") from None
    with tar:
        try:
            index = _index(tar)
            _extract(tar, index, work)
        except (tarfile.TarError, EOFError) as exc:
            raise BadBackup(f"damaged backup: {exc} (truncated archive?)") from None
    return index


def _holds_state(state_dir: Path) -> bool:
    return any((state_dir / n).exists() for n in (*DATABASES, MANIFESTS))


def _others(state_dir: Path) -> bool:
    """Whether ``state_dir`` holds anything but a master's lock file (a standby that
    waited there, or a master that stopped, leaves one)."""
    return any(p.name != LOCK_NAME for p in state_dir.iterdir())


def restore(archive: str, state_dir: str, force: bool = False) -> dict[str, Any]:
    """Check ``archive`` and install it as the master state in ``state_dir``.

    ``state_dir`` must hold no master state unless ``force``; then the old state is
    moved aside to ``<state_dir>.before-restore-<time>``, never deleted. Nothing in
    ``state_dir`` changes when the archive is bad. Returns the archive's index (less
    the file list)."""
    target = Path(state_dir)
    if target.exists() and not target.is_dir():
        raise InvalidArgument(f"{state_dir} is not a directory")
    serving = in_use(state_dir) if target.is_dir() else None
    if serving is not None:
        raise InvalidArgument(f"{state_dir} is served by a running master ({serving}): stop it")
    if target.is_dir() and _holds_state(target) and not force:
        raise InvalidArgument(
            f"{state_dir} already holds master state; stop its master and pass --force "
            "to move it aside"
        )
    if target.is_dir() and not _holds_state(target) and _others(target):
        raise InvalidArgument(f"{state_dir} is not empty and holds no master state: pick another")
    parent = target.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{target.name}.restore-", dir=parent)
    try:
        index = _read_into(archive, work)
        if target.exists():
            if _holds_state(target):
                os.rename(target, f"{target}.before-restore-{int(time.time())}")
            else:  # empty but for an unheld lock file, checked above
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target / LOCK_NAME)
                target.rmdir()
        os.rename(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return {k: v for k, v in index.items() if k != "files"}


def remove_stale(state_dir: str) -> None:
    """Remove snapshot directories and partial archives a killed master left behind."""
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(state_dir):
            if name.startswith(".backup-"):
                path = os.path.join(state_dir, name)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(path)


@contextlib.contextmanager
def snapshot_dir(master_db: CopyDb, jobs_db: CopyDb, state_dir: str) -> Iterator[str]:
    work = snapshot(master_db, jobs_db, state_dir)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
