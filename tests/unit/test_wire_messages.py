"""The typed messages of the data path (shoal.proto.messages, protocol v2): every request
and reply survives encode -> frame -> decode, and what is not a message of this version
(unknown op, another version, truncated frames, wrong types, oversized counts) is
refused with a one-line ProtocolError or InvalidArgument, never a crash."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
from typing import Any

import msgpack
import pytest

from shoal.client.conn import Connection
from shoal.core.types import FileInfo
from shoal.errors import InvalidArgument, NotFound, ProtocolError, StaleLayout
from shoal.proto import messages as m
from shoal.proto import wire
from shoal.proto.wire import Op, Packed, Status

P = "data/000/f000001.bin"
INFO = FileInfo(P, 1234, "etag-1", 1.5e9, False, 1_500_000_000_000_000_123)

REQUESTS: list[m.Request[Any]] = [
    m.HelloRequest(),
    m.StatRequest("ds", P, 3),
    m.ListRequest("ds", "data/000"),
    m.ReadRequest("ds", P, 10, -1, "etag-1", 1 << 20, 7),
    m.BatchRequest("ds", (P, "data/000/f000002.bin"), None),
    m.LocateRequest("ds", P, None, 0, 4096, True, 256 << 20, 1 << 20, 2),
    m.TouchRequest("ds", ((P, "etag-1", 1, 100), (P, None, 0, 0))),
    m.DropRequest("ds", P, "etag-1", 3),
    m.LocateDirRequest("ds", None, 1 << 20, None),
]

REPLIES: list[tuple[m.Request[Any], Any]] = [
    (m.HelloRequest(), m.HelloReply(wire.VERSION, "w-1", "node-a", 9)),
    (m.StatRequest("ds", P), m.StatReply(INFO)),
    (m.ListRequest("ds", "data"), m.ListReply((INFO, dataclasses.replace(INFO, path="b")))),
    (m.ReadRequest("ds", P, 0, -1), m.ReadReply("etag-1", 1234, 1.5e9, 0, [[1234, 99]])),
    (
        m.BatchRequest("ds", (P, "x", "big")),
        m.BatchReply(
            (
                m.BatchItem(P, m.ItemStatus.OK, "etag-1", 1234, 99),
                m.BatchItem.failed("x", NotFound("no such file: x")),
                m.BatchItem("big", m.ItemStatus.NOT_SMALL, "etag-2", 5 << 20),
            )
        ),
    ),
    (
        m.LocateRequest("ds", P, None, 0, -1),
        m.LocateReply("etag-1", 1234, 1.5e9, 2, [[0, 4096, 1234, 99], [-1, 0, 10, 0]], [[1, 2]]),
    ),
    (m.LocateRequest("ds", P, None, 0, -1, True), m.LocateReply(miss=True)),
    (
        m.LocateDirRequest("ds", "data/000"),
        m.LocateDirReply([(P, "etag-1", 1234, 0, 0, 1234, 99)], [[1, 2]], True),
    ),
    (
        m.LocateDirRequest("ds", "data/000", 1 << 20, 3, True),
        m.LocateDirReply(
            [(P, "etag-1", 1234, 0, 0, 1234, 99)],
            [[1, 2], [3, 4]],
            True,
            [("data/000/big", "etag-2", (2 << 20) + 1, 1.5e9, 1, 0)],
            m.pack_sums([5, 6, 7]),
            False,
            [0, 123],
        ),
    ),
    (m.TouchRequest("ds", ()), m.DONE),
    (m.DropRequest("ds", P, "v", 0), m.DONE),
]


def _wire(obj: Any) -> Any:
    """What the other side decodes: msgpack turns tuples into lists."""
    return msgpack.unpackb(msgpack.packb(obj), raw=False, strict_map_key=False)


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_request_round_trips_through_a_frame(req: m.Request[Any]) -> None:
    req_id, back = m.decode_request_frame(m.encode_request(req, 77))
    assert req_id == 77 and back == req and type(back) is type(req)
    assert m.REQUESTS[req.OP] is type(req)


@pytest.mark.parametrize(("req", "reply"), REPLIES, ids=lambda x: type(x).__name__)
def test_every_reply_round_trips_through_a_frame(req: m.Request[Any], reply: Any) -> None:
    frame = m.encode_reply(41, 5, reply, 3) + b"abc"
    req_id, epoch, back, data = m.decode_response_frame(req, frame)
    assert (req_id, epoch, data) == (41, 5, b"abc")
    want = reply
    if isinstance(reply, m.LocateDirReply):  # items come back as lists
        want = dataclasses.replace(reply, items=_wire(reply.items), runs=_wire(reply.runs))
    assert back == want and type(back) is type(reply)


def test_a_packed_reply_is_sent_as_it_is() -> None:
    reply = m.LocateDirReply([], [], False)
    packed = Packed(wire.pack(reply.encode()))
    assert m.encode_reply(1, 2, packed) == m.encode_reply(1, 2, reply)


def test_a_kept_directory_answer_takes_its_stamps_as_the_last_field() -> None:
    reply = REPLIES[-3][1]
    assert isinstance(reply, m.LocateDirReply) and reply.stamps
    packed = m.with_stamps(reply.encode_unstamped(), reply.stamps)
    assert m.encode_reply(1, 2, packed) == m.encode_reply(1, 2, reply)


def test_batch_items_say_what_they_are_and_carry_real_errors() -> None:
    items = m.BatchReply.decode(_wire(REPLIES[4][1].encode())).items
    assert [it.status for it in items] == [
        m.ItemStatus.OK,
        m.ItemStatus.ERROR,
        m.ItemStatus.NOT_SMALL,
    ]
    err = items[1].error()
    assert isinstance(err, NotFound) and err.message == "no such file: x"
    assert items[0].version == "etag-1" and items[0].code == "" and items[2].size == 5 << 20


def test_an_error_answer_raises_the_workers_error() -> None:
    frame = wire.encode_error(3, 1, StaleLayout("served with page size 4096, not 8192"))
    with pytest.raises(StaleLayout, match="page size 4096"):
        m.decode_response_frame(m.ReadRequest("ds", P, 0, -1), frame)


def test_missing_trailing_fields_take_their_defaults() -> None:
    body = wire.pack(["ds", P, 0, -1, None])
    assert m.decode_request(Op.READ, body) == m.ReadRequest("ds", P, 0, -1)
    extra = wire.pack(["ds", P, None, 0, 10, False, 0, 0, None, False, "a newer field"])
    assert m.decode_request(Op.LOCATE, extra) == m.LocateRequest("ds", P, None, 0, 10)


def test_messages_are_frozen_and_slotted() -> None:
    req = m.ReadRequest("ds", P, 0, -1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.offset = 5  # type: ignore[misc]
    assert not hasattr(req, "__dict__")
    assert not hasattr(m.ReadReply("v", 1, 0.0, 0, []), "__dict__")


# -- what is not a message --------------------------------------------------------------


def test_an_unknown_op_is_refused() -> None:
    with pytest.raises(ProtocolError, match="unknown op 42"):
        m.decode_request(42, wire.pack([]))
    frame = wire.REQ_HDR.pack(1, 200, 9) + b"\x90"
    with pytest.raises(ProtocolError, match="unknown op 200"):
        m.decode_request_frame(frame)


@pytest.mark.parametrize("cut", [0, 3, wire.REQ_HDR.size, wire.REQ_HDR.size + 5, -1])
def test_a_truncated_request_frame_is_refused(cut: int) -> None:
    frame = m.encode_request(m.ReadRequest("ds", P, 0, -1, "v", 4096, 2), 1)
    with pytest.raises(ProtocolError, match="truncated frame"):
        m.decode_request_frame(frame[:cut])


@pytest.mark.parametrize("cut", [0, 10, wire.RESP_HDR.size, wire.RESP_HDR.size + 4, -1])
def test_a_truncated_response_frame_is_refused(cut: int) -> None:
    frame = m.encode_reply(1, 0, m.ReadReply("v", 3, 0.0, 0, [[3, 1]]), 3) + b"abc"
    with pytest.raises(ProtocolError, match="truncated frame"):
        m.decode_response_frame(m.ReadRequest("ds", P, 0, -1), frame[:cut])


def test_a_body_that_is_not_msgpack_is_refused_in_one_line() -> None:
    with pytest.raises(ProtocolError) as e:
        m.decode_request(Op.STAT, b"\xc1\x00")
    assert "\n" not in str(e.value) and "STAT" in str(e.value)


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        (Op.HELLO, []),
        (Op.HELLO, ["2"]),
        (Op.STAT, ["ds"]),
        (Op.STAT, ["ds", 7]),
        (Op.READ, ["ds", P, "0", 10]),
        (Op.READ, ["ds", P, 0, -2]),
        (Op.READ, ["ds", P, 0, 10, None, None]),
        (Op.LOCATE, ["ds", P, None, 0, -1, 1]),
        (Op.LOCATE, ["ds", P, None, 0, -1, False, -5]),
        (Op.BATCH, ["ds", [P, 3]]),
        (Op.TOUCH, ["ds", [[P, "v", 1]]]),
        (Op.TOUCH, ["ds", [[P, "v", 1, 1]] * (wire.MAX_TOUCH_ITEMS + 1)]),
        (Op.DROP, ["ds", P, None, 0]),
        (Op.LOCATE_DIR, ["ds", 5]),
        (Op.STAT, {"dataset": "ds"}),
    ],
)
def test_requests_of_the_wrong_types_or_counts_are_refused(op: Op, fields: Any) -> None:
    with pytest.raises(ProtocolError) as e:
        m.decode_request(op, wire.pack(fields))
    assert "\n" not in str(e.value)


def test_a_batch_over_the_limit_is_the_callers_mistake() -> None:
    with pytest.raises(InvalidArgument, match="at most"):
        m.decode_request(Op.BATCH, wire.pack(["ds", [P] * (wire.MAX_BATCH + 1), None]))


@pytest.mark.parametrize(
    ("req", "meta"),
    [
        (m.ReadRequest("ds", P, 0, -1), {"v": "x", "size": 3}),  # a protocol-1 map
        (m.ReadRequest("ds", P, 0, -1), ["v", "3", 0.0, 0, []]),
        (m.ReadRequest("ds", P, 0, -1), ["v", 3, 0.0, 0, [[3]]]),
        (m.LocateRequest("ds", P, None, 0, -1), ["v", 3, 0.0, 0, [], []]),
        (m.LocateDirRequest("ds", None), [[["p", "v"]], [], True]),
        (m.BatchRequest("ds", (P,)), [[[P, "", "v", 3, 1]]]),  # protocol 1's "" code
        (m.BatchRequest("ds", (P,)), [[[P, 9, "v", 3, 1, "", ""]]]),
        (m.StatRequest("ds", P), [P, "big", "v", 0.0, False]),
        (m.HelloRequest(), {"worker": "w"}),
        (m.DropRequest("ds", P, "v", 0), {}),
    ],
)
def test_replies_of_the_wrong_shape_are_refused(req: m.Request[Any], meta: Any) -> None:
    with pytest.raises(ProtocolError, match="malformed"):
        m.decode_reply(req, Status.OK, wire.pack(meta))


# -- versions ---------------------------------------------------------------------------


def test_the_version_is_two_and_hello_carries_it() -> None:
    assert wire.VERSION == 2
    assert m.HelloRequest().encode() == [2]
    assert m.HelloRequest.decode([1]).version == 1  # any version decodes: refused later


def test_a_worker_refuses_clients_of_another_version_naming_both() -> None:
    assert wire.refuse_hello(wire.VERSION) is None
    old = wire.refuse_hello(1)
    assert old is not None and "protocol 2, the client speaks 1: upgrade the client" in old.message
    new = wire.refuse_hello(3)
    assert new is not None and "the client speaks 3: upgrade the worker" in new.message
    silent = wire.refuse_hello(None)
    assert silent is not None and "needs a HELLO first" in silent.message


def test_a_client_refuses_a_worker_of_another_version_naming_both() -> None:
    wire.check_hello(wire.VERSION, "h:1")
    with pytest.raises(ProtocolError, match=r"worker at h:1 speaks data-path protocol 1, this client speaks 2: upgrade the worker"):  # fmt: skip
        wire.check_hello(1, "h:1")
    with pytest.raises(
        ProtocolError, match="protocol 3, this client speaks 2: upgrade this client"
    ):
        wire.check_hello(3, "h:1")


def _old_worker(listener: socket.socket) -> None:
    """A protocol-1 worker: answers a HELLO with its map, version 1, and closes."""
    conn, _ = listener.accept()
    with conn:
        head = conn.recv(wire.REQ_HDR.size, socket.MSG_WAITALL)
        body_len, _op, req_id = wire.REQ_HDR.unpack(head)
        conn.recv(body_len, socket.MSG_WAITALL)
        meta = {"version": 1, "worker": "old", "node": "n", "epoch": 1}
        conn.sendall(wire.encode_response_head(Status.OK, req_id, 1, meta, 0))


def test_a_client_meeting_a_protocol_1_worker_gets_a_clear_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        t = threading.Thread(target=_old_worker, args=(listener,), daemon=True)
        t.start()
        addr = listener.getsockname()
        with pytest.raises(ProtocolError) as e:
            asyncio.run(Connection.open((addr[0], addr[1]), 5.0))
        t.join(5)
    assert str(e.value) == (
        f"worker at 127.0.0.1:{addr[1]} speaks data-path protocol 1, this client speaks 2: "
        "upgrade the worker"
    )
