"""The operator's command line: ``python -m shoal.operator`` and ``shoal operator``."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from shoal.cli import operator as cli_operator
from shoal.errors import InvalidArgument
from shoal.operator.context import OperatorSettings


def test_shoal_operator_subcommand_takes_the_module_flags() -> None:
    p = argparse.ArgumentParser(prog="shoal")
    cli_operator.register(p.add_subparsers(dest="command"))
    args = p.parse_args(
        [
            "operator",
            "--master",
            "http://m:7070",
            "--webhook-port",
            "8443",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--namespace",
            "ml",
            "--namespace",
            "cv",
            "--interval",
            "5",
        ]
    )
    assert args.handler is cli_operator.cmd_operator
    assert (args.master, args.webhook_port, args.namespace, args.interval) == (
        "http://m:7070",
        8443,
        ["ml", "cv"],
        5.0,
    )
    assert p.parse_args(["operator", "--master", "http://m:7070"]).webhook_port is None


def test_settings_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="master URL"):
        OperatorSettings(master="m:7070")
    with pytest.raises(InvalidArgument, match="tls-cert"):
        OperatorSettings(master="http://m:7070", webhook_port=8443)
    with pytest.raises(InvalidArgument, match="interval"):
        OperatorSettings(master="http://m:7070", interval=0)


def test_module_entry_point_reports_bad_settings() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "shoal.operator", "--master", "http://m:1", "--webhook-port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "needs --tls-cert and --tls-key" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "shoal.operator", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "--webhook-port" in r.stdout
