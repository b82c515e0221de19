"""Golden bytes: every frame type of both dialects against hand-written bytes (not produced by
the encoder), both directions."""

from __future__ import annotations

import pytest

from querylib.connector import Dialect, DialectError, detect_dialect, draft, released

U64_MAX = 2**64 - 1

DRAFT_CASES = [
    # HELLO 'H': version, cookie, program, instance, each u16le size + bytes
    (draft.Hello(b"v1", b"", b"prog", b"inst"),
     "13000000 48 0200 7631 0000 0400 70726f67 0400 696e7374"),
    # OK 'O': u32 credits, then (u64 stream, u64 point) pairs to the end
    (draft.Ok(10), "05000000 4f 0a000000"),
    (draft.Ok(10, ((1, 2),)), "15000000 4f 0a000000 0100000000000000 0200000000000000"),
    # ERROR 'E': short_bytes reason
    (draft.Error(b"bad"), "06000000 45 0300 626164"),
    (draft.Error(b""), "03000000 45 0000"),
    # NOTIFY 'N': u64 stream id, short_bytes name, u64 point of reference
    (draft.Notify(7, b"s", 0), "14000000 4e 0700000000000000 0100 73 0000000000000000"),
    # MESSAGE 'M': u64 stream id, u16 flags, u64 message id, [u64 event time], payload
    (draft.Message(7, 0, 9, None, b"hi"),
     "15000000 4d 0700000000000000 0000 0900000000000000 6869"),
    (draft.Message(7, 16, 9, 0x0102, b""),
     "1b000000 4d 0700000000000000 1000 0900000000000000 0201000000000000"),
    (draft.Message(U64_MAX, 6, U64_MAX), "13000000 4d ffffffffffffffff 0600 ffffffffffffffff"),
    # ACK 'A': u32 credits, then (u64 stream, u64 message id) pairs to the end
    (draft.Ack(5), "05000000 41 05000000"),
    (draft.Ack(5, ((1, 2), (3, 4))),
     "25000000 41 05000000 0100000000000000 0200000000000000 0300000000000000 0400000000000000"),
    # NACK '!': u32 credits, u64 stream id, u64 point of reference
    (draft.Nack(1, 2, 3), "15000000 21 01000000 0200000000000000 0300000000000000"),
]

RELEASED_CASES = [
    # 0 HELLO: str version, cookie, program, instance (u16be size + bytes); length counts tag
    (released.Hello(b"0.0.1", b"c", b"p", b"i"),
     "00000011 00 0005 302e302e31 0001 63 0001 70 0001 69"),
    # 1 OK: u32 initial credits
    (released.Ok(100), "00000005 01 00000064"),
    # 2 ERROR: str
    (released.Error(b"no"), "00000005 02 0002 6e6f"),
    # 3 NOTIFY: u64 stream id, str name, u64 point of reference
    (released.Notify(1, b"ab", U64_MAX),
     "00000015 03 0000000000000001 0002 6162 ffffffffffffffff"),
    # 4 NOTIFY_ACK: u8 success, u64 stream id, u64 point of reference
    (released.NotifyAck(True, 1, 2), "00000012 04 01 0000000000000001 0000000000000002"),
    (released.NotifyAck(False, 0, U64_MAX), "00000012 04 00 0000000000000000 ffffffffffffffff"),
    # 5 MESSAGE: u64 stream id, u64 message id, i64 event time, str key, payload
    (released.Message(1, 2, 0, b"", b"x"),
     "0000001c 05 0000000000000001 0000000000000002 0000000000000000 0000 78"),
    (released.Message(1, 2, -1, b"k", b""),
     "0000001c 05 0000000000000001 0000000000000002 ffffffffffffffff 0001 6b"),
    # 6 ACK: u32 credits, u32 count, count x (u64 stream id, u64 point of reference)
    (released.Ack(3), "00000009 06 00000003 00000000"),
    (released.Ack(3, ((1, 2),)),
     "00000019 06 00000003 00000001 0000000000000001 0000000000000002"),
    # 7 RESTART: u32 size + "host:port"
    (released.Restart(b""), "00000005 07 00000000"),
    (released.Restart(b"h:1"), "00000008 07 00000003 683a31"),
    # 8 EOS: u64 stream id
    (released.Eos(9), "00000009 08 0000000000000009"),
]


def _cases(module, cases):
    return [pytest.param(module, frame, bytes.fromhex(hexes), id=repr(frame)[:60])
            for frame, hexes in cases]


GOLDEN = _cases(draft, DRAFT_CASES) + _cases(released, RELEASED_CASES)


def test_every_frame_type_has_a_golden_case():
    for module, cases in ((draft, DRAFT_CASES), (released, RELEASED_CASES)):
        assert {type(frame) for frame, _ in cases} == set(module.CODEC.by_tag.values())


@pytest.mark.parametrize(("module", "frame", "wire"), GOLDEN)
def test_encode_gives_golden_bytes(module, frame, wire):
    assert module.encode(frame) == wire


@pytest.mark.parametrize(("module", "frame", "wire"), GOLDEN)
def test_decode_golden_bytes(module, frame, wire):
    assert module.FrameDecoder().receive_data(wire) == [frame]


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        (b"", None),
        (b"\x13\x00\x00\x00", None),
        (b"\x13\x00\x00\x00H", Dialect.DRAFT),
        (b"\x00\x00\x00\x11\x00\x00\x05", Dialect.RELEASED),
    ],
)
def test_detect_dialect(first, expected):
    assert detect_dialect(first) is expected


@pytest.mark.parametrize("tag", [b"O", b"\x01", b"h", b"\xff"])
def test_detect_dialect_rejects_other_first_tags(tag):
    with pytest.raises(DialectError):
        detect_dialect(b"\x05\x00\x00\x00" + tag)
