"""The request checks and limits of shoal.proto.wire (issue 10 items 11, 12 and 18)."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.errors import InvalidArgument, ProtocolError
from shoal.proto import wire
from shoal.proto.wire import Op

P = "data/000/f000001.bin"

VALID: dict[Op, list[Any]] = {
    Op.HELLO: [1],
    Op.STAT: ["ds", P, None],
    Op.LIST: ["ds", "data/000", 3],
    Op.READ: ["ds", P, 0, -1, None, 1 << 20, 2, False],
    Op.BATCH: ["ds", [P, P], None],
    Op.LOCATE: ["ds", P, "v1", 0, 100, True, 256 << 20, 0, None, True],
    Op.TOUCH: ["ds", [[P, "v", 1, 100], [P, "", 0, 0]]],
    Op.DROP: ["ds", P, "v", 0],
    Op.LOCATE_DIR: ["ds", None, 0, None, True],
}


@pytest.mark.parametrize("op", list(Op))
def test_what_clients_send_passes(op: Op) -> None:
    assert wire.check_args(op, VALID[op]) is VALID[op]
    # older clients send fewer optional arguments; newer ones may send more
    wire.check_args(op, [*VALID[op], "extra"])


@pytest.mark.parametrize(
    ("op", "args"),
    [
        (Op.STAT, {"a": 1}),
        (Op.STAT, ["ds"]),
        (Op.STAT, ["ds", 7]),
        (Op.READ, ["ds", P, -1, 10, None]),
        (Op.READ, ["ds", P, 0, -2, None]),
        (Op.READ, ["ds", P, 2**64 - 1, 10, None]),
        (Op.READ, ["ds", P, 0.5, 10, None]),
        (Op.LOCATE, ["ds", P, None, 0, -1, False, -5]),
        (Op.BATCH, ["ds", "not a list"]),
        (Op.BATCH, ["ds", [P, 3]]),
        (Op.TOUCH, ["ds", [[P, "v", 1]]]),
        (Op.TOUCH, ["ds", [[P, "v", "1", 1]]]),
        (Op.TOUCH, ["ds", [[P, "v", 1, 1]] * (wire.MAX_TOUCH_ITEMS + 1)]),
        (Op.DROP, ["ds", P, None, 0]),
        (Op.DROP, ["ds", P, "v", -1]),
        (Op.LOCATE_DIR, ["ds", 5]),
    ],
)
def test_wrong_shapes_are_protocol_errors(op: Op, args: Any) -> None:
    with pytest.raises(ProtocolError):
        wire.check_args(op, args)


def test_a_batch_over_its_count_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument):
        wire.check_args(Op.BATCH, ["ds", [P] * (wire.MAX_BATCH + 1), None])


def test_frame_caps_per_op() -> None:
    assert wire.max_request(Op.STAT) == wire.MAX_REQUEST < wire.MAX_REQUEST_LARGE
    assert wire.max_request(Op.BATCH) == wire.max_request(Op.TOUCH) == wire.MAX_REQUEST_LARGE
    assert wire.max_request(200) == wire.MAX_REQUEST  # unknown ops: the small cap
    assert wire.MAX_BODY >= wire.MAX_REQUEST_LARGE
    # the largest legitimate requests fit their cap
    batch = wire.encode_request(Op.BATCH, 1, ["ds", ["d" * 200] * wire.MAX_BATCH, 1])
    assert len(batch) - wire.REQ_HDR.size <= wire.max_request(Op.BATCH)
    touch = wire.encode_request(
        Op.TOUCH, 1, ["ds", [["d" * 60, "v" * 34, 4096, 1 << 40]] * wire.MAX_TOUCH_ITEMS]
    )
    assert len(touch) - wire.REQ_HDR.size <= wire.max_request(Op.TOUCH)


def test_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_WIRE_X", "12")
    assert wire._limit("X", 5) == 12 and isinstance(wire._limit("X", 5), int)
    assert wire._limit("X", 5.0) == 12.0
    for bad in ("nope", "-3", "0"):
        monkeypatch.setenv("SHOAL_WIRE_X", bad)
        assert wire._limit("X", 5) == 5
    monkeypatch.delenv("SHOAL_WIRE_X")
    assert wire._limit("X", 5) == 5
