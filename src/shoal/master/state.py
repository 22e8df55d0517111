"""The master's durable state: datasets, workers and counters in one SQLite file.

``<state_dir>/master.db`` in WAL mode holds three tables:

- ``datasets(name PK, json, generation)`` -- ``Dataset.to_dict()``; mounts carry no
  secrets because :class:`~shoal.core.types.Mount` refuses secret option keys;
- ``workers(id PK, json, state, last_heartbeat)`` -- registration (host, port, uds,
  node, tiers) plus the latest stats; ``last_heartbeat`` is wall-clock, informational;
- ``meta(key PK, value)`` -- ``ring_epoch`` and ``datasets_generation``;
- ``worker_keys(id PK, key_hash)`` -- the sha256 of the key each worker id first
  registered with: a later registration of that id must present the same key, so no
  one can take over a worker's place on the ring by registering its id.

Every change commits before the caller answers, so a restarted master sees what it
acknowledged. Calls are synchronous: each is a small transaction on a local file, which
costs less than handing it to a thread, and the master is off the data path.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from shoal.core.membership import DRAINING, EXPIRED, LEFT, LIVE, WorkerInfo, WorkerRecord
from shoal.core.types import CachePolicy, Dataset
from shoal.errors import DatasetExists, DatasetNotFound
from shoal.master.backup import copy_db

log = logging.getLogger("shoal.master.state")

DB_NAME = "master.db"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (
    name TEXT PRIMARY KEY,
    json TEXT NOT NULL,
    generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    json TEXT NOT NULL,
    state TEXT NOT NULL,
    last_heartbeat REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS worker_keys (
    id TEXT PRIMARY KEY,
    key_hash TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class StoredWorker:
    """A worker row as loaded: its record (clock-free) and its wall-clock last heartbeat."""

    info: WorkerInfo
    state: str
    last_heartbeat_wall: float
    stats: dict[str, Any]

    def record(self, now: float) -> WorkerRecord:
        """The membership record on the caller's clock, heard from at ``now``.

        A reloaded worker gets one full expiry period from the restart to heartbeat.
        """
        known = {EXPIRED: EXPIRED, DRAINING: DRAINING, LEFT: LEFT}
        state = known.get(self.state, LIVE)  # type: ignore[call-overload]
        return WorkerRecord(self.info, state, now, self.stats)


class MasterState:
    """Open (creating if needed) the master database in ``state_dir``."""

    def __init__(self, state_dir: str) -> None:
        os.makedirs(state_dir, exist_ok=True)
        self.path = os.path.join(state_dir, DB_NAME)
        #: called after a committed change moved ``datasets_generation`` (wakes watchers)
        self.on_generation: Callable[[], None] = lambda: None
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE in _tx)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        with self._tx() as cur:
            cur.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
                (SCHEMA_VERSION,),
            )
        version = self._meta("schema_version")
        if version > SCHEMA_VERSION:
            log.warning(
                "state %s has schema %d, newer than this master's %d",
                self.path,
                version,
                SCHEMA_VERSION,
            )

    def close(self) -> None:
        self._db.close()

    def backup_into(self, dest: str) -> None:
        """An online, consistent copy of the database as a new file at ``dest``."""
        copy_db(self._db, dest)

    def _tx(self) -> _Tx:
        return _Tx(self._db)

    def _meta(self, key: str, default: int = 0) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else default

    # --- counters ------------------------------------------------------------------------

    @property
    def ring_epoch(self) -> int:
        return self._meta("ring_epoch")

    @property
    def datasets_generation(self) -> int:
        return self._meta("datasets_generation")

    # --- datasets ------------------------------------------------------------------------

    def create_dataset(self, ds: Dataset) -> Dataset:
        """Store a new dataset at generation 1; DatasetExists if the name is taken."""
        ds = replace(ds, generation=1)
        with self._tx() as cur:
            try:
                cur.execute(
                    "INSERT INTO datasets(name, json, generation) VALUES (?, ?, ?)",
                    (ds.name, json.dumps(ds.to_dict()), ds.generation),
                )
            except sqlite3.IntegrityError:
                raise DatasetExists(f"dataset {ds.name!r} already exists") from None
            _bump(cur, "datasets_generation")
        self.on_generation()
        return ds

    def get_dataset(self, name: str) -> Dataset:
        row = self._db.execute("SELECT json FROM datasets WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise DatasetNotFound(f"no dataset named {name!r}")
        return Dataset.from_dict(json.loads(row[0]))

    def list_datasets(self) -> list[Dataset]:
        rows = self._db.execute("SELECT json FROM datasets ORDER BY name").fetchall()
        return [Dataset.from_dict(json.loads(r[0])) for r in rows]

    def update_policy(self, name: str, policy: CachePolicy) -> Dataset:
        """Replace a dataset's policy; its generation goes up by one."""
        return self._update(name, policy=policy)

    def set_manifest(self, name: str, manifest_id: str) -> Dataset:
        """Point a dataset at a new manifest; its generation goes up by one."""
        return self._update(name, manifest=manifest_id)

    def _update(self, name: str, **changes: Any) -> Dataset:
        with self._tx() as cur:
            row = cur.execute("SELECT json FROM datasets WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise DatasetNotFound(f"no dataset named {name!r}")
            old = Dataset.from_dict(json.loads(row[0]))
            new = replace(old, generation=old.generation + 1, **changes)
            cur.execute(
                "UPDATE datasets SET json = ?, generation = ? WHERE name = ?",
                (json.dumps(new.to_dict()), new.generation, name),
            )
            _bump(cur, "datasets_generation")
        self.on_generation()
        return new

    def delete_dataset(self, name: str) -> None:
        with self._tx() as cur:
            cur.execute("DELETE FROM datasets WHERE name = ?", (name,))
            if cur.rowcount == 0:
                raise DatasetNotFound(f"no dataset named {name!r}")
            _bump(cur, "datasets_generation")
        self.on_generation()

    # --- workers -------------------------------------------------------------------------

    def save_workers(
        self, workers: Iterable[tuple[WorkerRecord, float]], epoch: int | None = None
    ) -> None:
        """Upsert ``(record, wall-clock last heartbeat)`` pairs and, when given, the epoch.

        One transaction, so a restarted master never sees an epoch that disagrees with
        the set of live workers it stored.
        """
        with self._tx() as cur:
            for rec, wall in workers:
                body = rec.info.to_dict()
                body["stats"] = dict(rec.stats)
                cur.execute(
                    "INSERT INTO workers(id, json, state, last_heartbeat) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(id) DO UPDATE SET json = excluded.json, "
                    "state = excluded.state, last_heartbeat = excluded.last_heartbeat",
                    (rec.info.id, json.dumps(body), rec.state, wall),
                )
            if epoch is not None:
                # max(): the epoch never goes backwards, whatever the caller holds
                cur.execute(
                    "INSERT INTO meta(key, value) VALUES ('ring_epoch', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)",
                    (epoch,),
                )

    def bind_worker_key(self, worker_id: str, key_hash: str) -> bool:
        """Bind ``worker_id`` to ``key_hash`` on its first registration; True if the id is
        (now) bound to that hash, False if another key holds it."""
        with self._tx() as cur:
            cur.execute(
                "INSERT OR IGNORE INTO worker_keys(id, key_hash) VALUES (?, ?)",
                (worker_id, key_hash),
            )
            row = cur.execute(
                "SELECT key_hash FROM worker_keys WHERE id = ?", (worker_id,)
            ).fetchone()
        return bool(row) and hmac.compare_digest(str(row[0]), key_hash)

    def worker_key_matches(self, worker_id: str, key_hash: str) -> bool:
        """Whether ``worker_id`` is bound to ``key_hash`` (binds nothing)."""
        row = self._db.execute(
            "SELECT key_hash FROM worker_keys WHERE id = ?", (worker_id,)
        ).fetchone()
        return bool(row) and hmac.compare_digest(str(row[0]), key_hash)

    def load_workers(self) -> list[StoredWorker]:
        rows = self._db.execute(
            "SELECT json, state, last_heartbeat FROM workers ORDER BY id"
        ).fetchall()
        out: list[StoredWorker] = []
        for body_text, state, wall in rows:
            body = json.loads(body_text)
            stats = body.get("stats")
            try:
                info = WorkerInfo.from_dict(body)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("skipping unreadable worker row in %s: %s", self.path, exc)
                continue
            out.append(
                StoredWorker(
                    info, str(state), float(wall), stats if isinstance(stats, dict) else {}
                )
            )
        return out


def _bump(cur: sqlite3.Cursor, key: str) -> int:
    cur.execute(
        "INSERT INTO meta(key, value) VALUES (?, 1) "
        "ON CONFLICT(key) DO UPDATE SET value = value + 1",
        (key,),
    )
    row = cur.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return int(row[0])


class _Tx:
    """``with`` block around BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._cur = db.cursor()

    def __enter__(self) -> sqlite3.Cursor:
        self._cur.execute("BEGIN IMMEDIATE")
        return self._cur

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self._cur.execute("COMMIT")
        else:
            self._cur.execute("ROLLBACK")
        self._cur.close()
