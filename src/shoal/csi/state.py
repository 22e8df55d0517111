"""The node plugin's record of what it published: one JSON file in its state directory,
rewritten whole (temp file, fsync, rename) after every change, so that a restarted
plugin knows which bind mounts to watch and repair."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("shoal.csi.state")

STATE_FILE = "volumes.json"
VERSION = 1


@dataclass(frozen=True)
class Published:
    """One NodePublishVolume that succeeded and was not unpublished yet."""

    volume_id: str
    #: the pod's target path, normalised (its parent resolved)
    target: str
    dataset: str
    #: a directory inside the dataset ("" for the whole dataset)
    sub_path: str = ""

    @property
    def rel_source(self) -> str:
        """The source under the mount root: ``dataset`` or ``dataset/sub_path``."""
        return f"{self.dataset}/{self.sub_path}" if self.sub_path else self.dataset


class VolumeState:
    """Published volumes by target path, persisted in ``<state_dir>/volumes.json``."""

    def __init__(self, state_dir: str) -> None:
        self.path = Path(state_dir) / STATE_FILE
        self.volumes: dict[str, Published] = {}

    def load(self) -> None:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # a torn file cannot happen (rename); an unreadable one loses only repairs:
            # the kubelet publishes again, and unpublish works without a record
            log.warning("ignoring unreadable state file %s: %s", self.path, exc)
            return
        if doc.get("version") != VERSION:
            log.warning("ignoring state file %s of version %r", self.path, doc.get("version"))
            return
        for v in doc.get("volumes", []):
            p = Published(**v)
            self.volumes[p.target] = p

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"version": VERSION, "volumes": [asdict(v) for v in self.volumes.values()]}
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def get(self, target: str) -> Published | None:
        return self.volumes.get(target)

    def put(self, p: Published) -> None:
        self.volumes[p.target] = p
        self.save()

    def drop(self, target: str) -> None:
        if self.volumes.pop(target, None) is not None:
            self.save()
