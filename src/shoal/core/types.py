"""The data model: datasets, mounts, cache policy, file versions and page keys.

Everything here is plain data that crosses process boundaries as JSON/msgpack
(``to_dict``/``from_dict``); validation raises :class:`~shoal.errors.InvalidArgument`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, field, fields, replace
from typing import Any, Literal, NamedTuple

from shoal.core.records import record
from shoal.errors import InvalidArgument, PathOutsideDataset

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MiB = 1 << 20

#: option keys that would put a secret into state; credentials go by reference only
SECRET_OPTION_KEYS = frozenset(
    {
        "key",
        "secret",
        "token",
        "password",
        "aws_access_key_id",
        "aws_secret_access_key",
        "access_key",
        "secret_key",
        "session_token",
        "aws_session_token",
    }
)

Placement = Literal["hash", "local"]
Eviction = Literal["lru", "lfu", "fifo"]
TIERS = ("mem", "ssd", "hdd")

#: staleness bound: seconds a cached listing/stat may be used without asking the store;
#: NEVER means "never revalidate" (explicit sync only), 0 means always revalidate.
NEVER = -1


def check_name(kind: str, name: str) -> str:
    if not NAME_RE.match(name):
        raise InvalidArgument(
            f"invalid {kind} name {name!r}: use letters, digits, '.', '_' or '-' (max 128)"
        )
    return name


def parse_size(text: str | int) -> int:
    """'64MiB', '1g', '4096' -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*", text.lower())
    if not m:
        raise InvalidArgument(f"invalid size {text!r}: expected e.g. 4096, 64MiB, 10GB")
    num, unit, _ = m.groups()
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}[unit]
    return int(float(num) * mult)


def parse_duration(text: str | int | float) -> float:
    """'30s', '5m', '2h', '1d', '10' -> seconds; 'never' -> NEVER; 'always' -> 0."""
    if isinstance(text, int | float):
        return float(text)
    t = text.strip().lower()
    if t in ("never", "none", "-1"):
        return float(NEVER)
    if t in ("always", "0"):
        return 0.0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?", t)
    if not m:
        raise InvalidArgument(f"invalid duration {text!r}: expected e.g. 30s, 5m, 2h, never")
    num, unit = m.groups()
    mult = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}[unit]
    return float(num) * mult


def _parse_bool(key: str, text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise InvalidArgument(f"invalid value for {key}: {text!r} (expected true or false)")


@record(slots=False)
class CachePolicy:
    """How a dataset is cached."""

    #: "hash": each file lives on its ring owners; "local": on the worker next to the reader
    placement: Placement = "hash"
    #: number of ring owners that keep a copy
    replicas: int = 1
    #: tiers the dataset may use, fastest first
    tiers: tuple[str, ...] = TIERS
    #: seconds after caching that data expires; 0 = never
    ttl: float = 0.0
    eviction: Eviction = "lru"
    #: pinned data is never evicted
    pin: bool = False
    #: unit of fetching, accounting and eviction
    page_size: int = MiB
    #: seconds a cached stat/listing is trusted; NEVER (-1) = until explicit sync; 0 = always ask
    staleness: float = float(NEVER)
    #: pages fetched ahead of a sequential reader
    readahead: int = 16

    def __post_init__(self) -> None:
        if self.placement not in ("hash", "local"):
            raise InvalidArgument(f"invalid placement {self.placement!r}: use hash or local")
        if not 1 <= self.replicas <= 16:
            raise InvalidArgument(f"invalid replicas {self.replicas}: use 1..16")
        bad = [t for t in self.tiers if t not in TIERS]
        if bad or not self.tiers:
            raise InvalidArgument(f"invalid tiers {','.join(self.tiers)!r}: use mem, ssd, hdd")
        if self.eviction not in ("lru", "lfu", "fifo"):
            raise InvalidArgument(f"invalid eviction {self.eviction!r}: use lru, lfu or fifo")
        if (
            self.page_size < 4096
            or self.page_size > 64 * MiB
            or self.page_size & (self.page_size - 1)
        ):
            raise InvalidArgument(
                f"invalid page_size {self.page_size}: a power of two from 4KiB to 64MiB"
            )
        if self.ttl < 0:
            raise InvalidArgument("invalid ttl: must be >= 0 (0 = never expire)")
        if self.staleness < 0 and self.staleness != NEVER:
            raise InvalidArgument("invalid staleness: seconds >= 0, or never")
        if not 0 <= self.readahead <= 256:
            raise InvalidArgument(f"invalid readahead {self.readahead}: use 0..256 pages")

    def with_options(self, options: dict[str, str]) -> CachePolicy:
        """Apply KEY=VALUE options from the command line; unknown keys are errors."""
        known = {f.name for f in fields(self)}
        changes: dict[str, Any] = {}
        for key, value in options.items():
            k = key.replace("-", "_")
            if k not in known:
                raise InvalidArgument(
                    f"unknown policy option {key!r}; known: {', '.join(sorted(known))}"
                )
            try:
                if k in ("replicas", "readahead"):
                    changes[k] = int(value)
                elif k == "page_size":
                    changes[k] = parse_size(value)
                elif k in ("ttl", "staleness"):
                    changes[k] = parse_duration(value)
                elif k == "pin":
                    changes[k] = _parse_bool(k, value)
                elif k == "tiers":
                    changes[k] = tuple(t.strip() for t in value.split(",") if t.strip())
                else:
                    changes[k] = value
            except ValueError:
                raise InvalidArgument(f"invalid value for {key}: {value!r}") from None
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tiers"] = list(self.tiers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CachePolicy:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        if "tiers" in kw:
            kw["tiers"] = tuple(kw["tiers"])
        return cls(**kw)


@record(slots=False)
class Mount:
    """One under-storage location mounted under a dataset: /<dataset>/<name>/..."""

    name: str
    uri: str
    #: driver options (endpoint_url, region, anon, credentials_file, profile, ...); never secrets
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name("mount", self.name)
        if "://" not in self.uri and not self.uri.startswith("/"):
            raise InvalidArgument(
                f"malformed URI {self.uri!r}: expected scheme://location, e.g. s3://bucket/prefix"
            )
        secrets = sorted(k for k in self.options if k.lower() in SECRET_OPTION_KEYS)
        if secrets:
            raise InvalidArgument(
                f"mount option {secrets[0]!r} would store a secret; pass credentials through "
                "the environment or credentials_file=PATH instead"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "uri": self.uri, "options": dict(self.options)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Mount:
        return cls(name=d["name"], uri=d["uri"], options=dict(d.get("options") or {}))


@record(slots=False)
class Dataset:
    name: str
    mounts: tuple[Mount, ...]
    policy: CachePolicy = field(default_factory=CachePolicy)
    #: bumped by every update; workers and clients compare it to notice changes
    generation: int = 1
    #: id of the dataset's current manifest ("" = none yet); set by metadata loads
    manifest: str = ""

    def __post_init__(self) -> None:
        check_name("dataset", self.name)
        if not self.mounts:
            raise InvalidArgument(f"dataset {self.name!r} needs at least one --mount NAME=URI")
        names = [m.name for m in self.mounts]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"dataset {self.name!r} has duplicate mount names")

    def mount(self, name: str) -> Mount:
        for m in self.mounts:
            if m.name == name:
                return m
        raise PathOutsideDataset(f"dataset {self.name!r} has no mount {name!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mounts": [m.to_dict() for m in self.mounts],
            "policy": self.policy.to_dict(),
            "generation": self.generation,
            "manifest": self.manifest,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Dataset:
        return cls(
            name=d["name"],
            mounts=tuple(Mount.from_dict(m) for m in d["mounts"]),
            policy=CachePolicy.from_dict(d.get("policy") or {}),
            generation=int(d.get("generation", 1)),
            manifest=str(d.get("manifest") or ""),
        )


class Mtime(float):
    """Seconds since the epoch that remember their exact nanoseconds (``ns``).

    A float holds a current time only to ~240 ns; code that copies ``info.mtime`` into
    a new :class:`FileInfo` (as many layers do) keeps the nanoseconds this way.
    """

    __slots__ = ("ns",)
    ns: int

    def __new__(cls, ns: int) -> Mtime:
        self = super().__new__(cls, ns / 1e9)
        self.ns = ns
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (Mtime, (self.ns,))


def mtime_ns_of(mtime: float) -> int:
    """Nanoseconds of a modification time in seconds (exact for an :class:`Mtime`)."""
    if isinstance(mtime, Mtime):
        return mtime.ns
    return round(mtime * 1e9) if mtime else 0


@record
class FileInfo:
    """A file or directory as under storage describes it.

    ``version`` is the ETag where the store has one, else "<size>-<mtime_ns>"; pages are
    keyed by it, so a changed object can never be served from stale pages.

    ``mtime_ns`` is the modification time in integer nanoseconds (0: unknown), exact
    end to end; ``mtime`` is the same in float seconds, kept for compatibility. Give
    either: the other is derived (an ``mtime`` given as :class:`Mtime` is exact).

    ``link`` is set for a symbolic link in the source (file:// only) that leads to a
    file inside the mount root: the target's path relative to that root ("." for the
    root). The other fields describe the target, as stat(2) does, so readers that do
    not know links read the target's bytes; the mount shows it as a link.
    """

    path: str
    size: int
    version: str
    mtime: float = 0.0
    is_dir: bool = False
    mtime_ns: int = 0
    link: str = ""

    def __post_init__(self) -> None:
        ns, m = self.mtime_ns, self.mtime
        if isinstance(m, Mtime):
            if not ns:
                object.__setattr__(self, "mtime_ns", m.ns)
            elif m.ns != ns:  # replace(info, mtime_ns=...): the integer is what changed
                object.__setattr__(self, "mtime", Mtime(ns))
        elif m and (not ns or abs(round(m * 1e9) - ns) > 1000):
            # a float only (or a float that disagrees: replace(info, mtime=...))
            object.__setattr__(self, "mtime_ns", round(m * 1e9))
        elif ns:
            object.__setattr__(self, "mtime", Mtime(ns))

    def to_wire(self) -> list[Any]:
        # the float stays fourth for readers that know five fields
        w = [self.path, self.size, self.version, float(self.mtime), self.is_dir, self.mtime_ns]
        if self.link:
            w.append(self.link)
        return w

    @classmethod
    def from_wire(cls, w: list[Any]) -> FileInfo:
        ns = int(w[5]) if len(w) > 5 and w[5] else 0
        link = str(w[6]) if len(w) > 6 and w[6] else ""
        return cls(w[0], w[1], w[2], w[3], w[4], ns, link)


class FileKey(NamedTuple):
    """One version of one file of one dataset: the unit of caching identity.

    A named tuple, not a dataclass: the store looks these keys (and :class:`PageKey`)
    up in its catalog, eviction order and index for every page it puts, locates or
    touches, and a tuple's C hash and comparison made those lookups 2.7x faster than
    a frozen dataclass's generated ``__hash__``/``__eq__`` (8 bytes more per key)."""

    dataset: str
    path: str  # "<mount>/<relative path>"
    version: str

    def page(self, index: int) -> PageKey:
        return PageKey(self, index)


class PageKey(NamedTuple):
    file: FileKey
    index: int  # type: ignore[assignment]  # the page number shadows tuple.index()


@record
class NsPath:
    """A namespace path /<dataset>/<mount>/<rel> split into its parts."""

    dataset: str
    mount: str  # "" for the dataset root
    rel: str  # "" for the mount root

    @property
    def key_path(self) -> str:
        """The path inside the dataset used for keys and placement: '<mount>/<rel>'."""
        return f"{self.mount}/{self.rel}" if self.rel else self.mount

    def __str__(self) -> str:
        parts = [self.dataset, self.mount, self.rel]
        return "/" + "/".join(p for p in parts if p)


def split_path(path: str) -> NsPath:
    """Split '/<dataset>/<mount>/<rel>' (leading slash optional, 'shoal://' allowed)."""
    p = path
    if p.startswith("shoal://"):
        p = p[len("shoal://") :]
    parts = [s for s in p.split("/") if s not in ("", ".")]
    if any(s == ".." for s in parts):
        raise PathOutsideDataset(f"path {path!r} may not contain '..'")
    if not parts:
        raise PathOutsideDataset(
            f"path {path!r} does not name a dataset: use /<dataset>/<mount>/..."
        )
    ds = parts[0]
    check_name("dataset", ds)
    mount = parts[1] if len(parts) > 1 else ""
    rel = "/".join(parts[2:])
    return NsPath(ds, mount, rel)
