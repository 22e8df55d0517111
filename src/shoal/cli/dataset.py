"""``shoal dataset create|ls|show|update|rm``."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from shoal.cli.common import client, parse_kv
from shoal.cli.output import add_json, add_master, emit_json, table
from shoal.core.types import Dataset, Mount, check_name
from shoal.errors import InvalidArgument, ShoalError


def register(sub: Any) -> None:
    ds = sub.add_parser("dataset", help="manage datasets")
    dsub = ds.add_subparsers(dest="dataset_command", metavar="ACTION", required=True)

    p = dsub.add_parser("create", help="create a dataset")
    p.add_argument("name")
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
        help="cache policy: placement, replicas, tiers, ttl, eviction, pin, "
        "page_size, staleness, readahead",
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
    p.add_argument("name")
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_show)

    p = dsub.add_parser("update", help="change a dataset's cache policy")
    p.add_argument("name")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", required=True)
    add_master(p)
    add_json(p)
    p.set_defaults(handler=cmd_update)

    p = dsub.add_parser("rm", help="delete a dataset and drop its cache")
    p.add_argument("name")
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


async def check_mounts(mounts: list[Mount]) -> None:
    """Fail early, with the store's own words, when a mount cannot be read."""
    from shoal.ufs.registry import open_store

    for m in mounts:
        store = open_store(m)
        try:
            await store.ls("")
        except ShoalError as exc:
            raise type(exc)(f"mount {m.name} ({store.describe()}): {exc.message}") from None
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
        "never" if p.staleness < 0 else f"{p.staleness:g}s",
    ]


_COLS = ["name", "mounts", "placement", "replicas", "eviction", "staleness"]


def cmd_create(args: argparse.Namespace) -> int:
    check_name("dataset", args.name)
    mounts = build_mounts(args.mount, args.mount_option)
    options = parse_kv(args.option, "--option")
    if not args.no_check:
        asyncio.run(check_mounts(mounts))
    with client(args) as c:
        ds = c.create_dataset(args.name, mounts, options)
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
                *[(k, v) for k, v in d.policy.to_dict().items()],
            ],
        )
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    with client(args) as c:
        d = c.update_dataset(args.name, parse_kv(args.option, "--option"))
    if args.json:
        emit_json(d.to_dict())
    else:
        print(f"updated dataset {d.name} (generation {d.generation})")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    with client(args) as c:
        c.delete_dataset(args.name)
    if args.json:
        emit_json({"deleted": args.name})
    else:
        print(f"deleted dataset {args.name}")
    return 0
