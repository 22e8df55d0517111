"""``shoal dataset create|ls|show|update|rm``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from shoal.cli.common import client, parse_kv
from shoal.cli.output import (
    add_json,
    add_master,
    emit_json,
    fmt_staleness,
    fmt_ttl,
    human_bytes,
    table,
)
from shoal.client import Client
from shoal.core.types import Dataset, Mount, check_name
from shoal.errors import InvalidArgument, ShoalError, Unavailable

_POLICY_HELP = (
    "cache policy: placement=hash|local, replicas=N, tiers=mem,ssd,hdd, ttl=1d (0: never), "
    "eviction=lru|lfu|fifo, pin=true|false, page_size=1MiB, staleness=never|always|SECONDS, "
    "readahead=PAGES"
)


def register(sub: Any) -> None:
    ds = sub.add_parser("dataset", help="manage datasets")
    dsub = ds.add_subparsers(dest="dataset_command", metavar="ACTION", required=True)

    p = dsub.add_parser("create", help="create a dataset")
    p.add_argument("name", help="dataset name (letters, digits, '-', '_', '.')")
    p.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="NAME=URI",
        required=True,
        help="mount under storage at /<dataset>/<NAME> (repeatable)",
    )
    p.add_argument(
        "--mount-option",
        action="append",
        default=[],
        metavar="[MOUNT.]KEY=VALUE",
        help="driver option, e.g. endpoint_url=http://..., for one mount or all",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=_POLICY_HELP + " (repeatable)",
    )
    p.add_argument(
        "--no-check",
        action="store_true",
        help="do not check that each mount is reachable before creating",
    )
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_create)

    p = dsub.add_parser("ls", help="list datasets")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_ls)

    p = dsub.add_parser("show", help="show one dataset")
    p.add_argument("name", help="dataset name")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_show)

    p = dsub.add_parser("update", help="change a dataset's cache policy")
    p.add_argument("name", help="dataset name")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        required=True,
        help=_POLICY_HELP + " (repeatable)",
    )
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_update)

    p = dsub.add_parser("rm", help="delete a dataset and drop its cache")
    p.add_argument("name", help="dataset name")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_rm)


def build_mounts(specs: list[str], options: list[str]) -> list[Mount]:
    mounts: dict[str, str] = {}
    for spec in specs:
        name, sep, uri = spec.partition("=")
        if not sep or not name or not uri:
            raise InvalidArgument(f"invalid --mount {spec!r}: expected NAME=URI")
        check_name("mount", name)
        if name in mounts:
            raise InvalidArgument(f"mount {name!r} given twice")
        mounts[name] = uri
    per: dict[str, dict[str, str]] = {n: {} for n in mounts}
    for key, value in parse_kv(options, "--mount-option").items():
        target, dot, opt = key.partition(".")
        if dot and target in mounts:
            per[target][opt] = value
        else:  # no mount prefix: the option applies to every mount
            for m in per.values():
                m[key] = value
    return [Mount(n, uri, per[n]) for n, uri in mounts.items()]


def unprefixed(options: list[str]) -> list[str]:
    """The --mount-option keys given without a MOUNT. prefix (they apply to every mount)."""
    return [k for k in parse_kv(options, "--mount-option") if "." not in k]


def _hint(m: Mount, mounts: list[Mount], loose: list[str]) -> str:
    others = [o.name for o in mounts if o.name != m.name]
    keys = [k for k in loose if k in m.options]
    if not keys or not others:
        return ""
    return (
        f"; --mount-option {keys[0]}=... has no MOUNT. prefix, so it applies to every "
        f"mount: write {others[0]}.{keys[0]}=... to give it to mount {others[0]} only"
    )


async def check_mounts(mounts: list[Mount], loose: list[str] | None = None) -> None:
    """Fail early, with the store's own words, when a mount cannot be read.

    ``loose``: the option keys given without a mount prefix, named in the error of a
    mount whose driver refused one of them.
    """
    from shoal.ufs.registry import open_store

    for m in mounts:
        hint = _hint(m, mounts, loose or [])
        try:
            store = open_store(m)
        except ShoalError as exc:
            raise type(exc)(f"mount {m.name} ({m.uri}): {exc.message}{hint}") from None
        except (ValueError, TypeError) as exc:
            # e.g. botocore's "Invalid endpoint: notaurl" for a malformed endpoint_url
            raise InvalidArgument(f"mount {m.name} ({m.uri}): {exc}{hint}") from None
        try:
            await store.ls("")
        except ShoalError as exc:
            raise type(exc)(f"mount {m.name} ({store.describe()}): {exc.message}") from None
        except (ValueError, TypeError) as exc:  # a malformed option, e.g. endpoint_url
            raise InvalidArgument(f"mount {m.name} ({store.describe()}): {exc}") from None
        except Exception as exc:
            # a driver error not translated into shoal's errors still means the mount
            # cannot be read: say so in one line rather than as an internal error
            raise Unavailable(
                f"mount {m.name} ({store.describe()}): cannot list it: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            await store.close()


def _row(d: Dataset) -> list[str]:
    p = d.policy
    mounts = " ".join(f"{m.name}={m.uri}" for m in d.mounts)
    return [
        d.name,
        mounts,
        p.placement,
        str(p.replicas),
        p.eviction,
        fmt_staleness(p.staleness),
        fmt_ttl(p.ttl),
    ]


_COLS = ["name", "mounts", "placement", "replicas", "eviction", "staleness", "ttl"]


def _policy_rows(d: Dataset) -> list[tuple[str, str]]:
    """The policy as ``show`` prints it: the same words as ``ls`` and the options."""
    p = d.policy
    out = []
    for k, v in p.to_dict().items():
        if k == "staleness":
            text = fmt_staleness(p.staleness)
        elif k == "ttl":
            text = fmt_ttl(p.ttl)
        elif k == "page_size":
            text = human_bytes(p.page_size)
        elif k == "tiers":
            text = ",".join(p.tiers)
        elif isinstance(v, bool):
            text = "true" if v else "false"
        else:
            text = str(v)
        out.append((k, text))
    return out


def _warn_replicas(c: Client, d: Dataset) -> None:
    """More replicas than workers is accepted (workers may join later) but said."""
    try:
        workers = len(c.report().get("workers", []))
    except ShoalError:
        return
    if workers and d.policy.replicas > workers:
        print(
            f"shoal: warning: replicas={d.policy.replicas} but the cluster has {workers} "
            f"worker(s): each file is cached at most {workers} time(s) until more join",
            file=sys.stderr,
        )


def cmd_create(args: argparse.Namespace) -> int:
    check_name("dataset", args.name)
    mounts = build_mounts(args.mount, args.mount_option)
    options = parse_kv(args.option, "--option")
    loose = unprefixed(args.mount_option)
    if not args.no_check:
        asyncio.run(check_mounts(mounts, loose))
    with client(args) as c:
        ds = c.create_dataset(args.name, mounts, options)
        _warn_replicas(c, ds)
    if args.json:
        emit_json(ds.to_dict())
    else:
        print(
            f"created dataset {ds.name}: "
            + ", ".join(f"/{ds.name}/{m.name} -> {m.uri}" for m in ds.mounts)
        )
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    with client(args) as c:
        items = c.datasets()
    if args.json:
        emit_json({"datasets": [d.to_dict() for d in items]})
    else:
        table(None, _COLS, [_row(d) for d in items])
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    check_name("dataset", args.name)  # the name goes into a URL path
    with client(args) as c:
        d = c.dataset(args.name)
    if args.json:
        emit_json(d.to_dict())
    else:
        table(
            None,
            ["key", "value"],
            [
                ("name", d.name),
                *[(f"mount {m.name}", m.uri) for m in d.mounts],
                *_policy_rows(d),
            ],
        )
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    check_name("dataset", args.name)  # the name goes into a URL path
    with client(args) as c:
        d = c.update_dataset(args.name, parse_kv(args.option, "--option"))
        _warn_replicas(c, d)
    if args.json:
        emit_json(d.to_dict())
    else:
        print(f"updated dataset {d.name} (generation {d.generation})")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    check_name("dataset", args.name)  # the name goes into a URL path
    with client(args) as c:
        c.delete_dataset(args.name)
    if args.json:
        emit_json({"deleted": args.name})
    else:
        print(f"deleted dataset {args.name}")
    return 0
