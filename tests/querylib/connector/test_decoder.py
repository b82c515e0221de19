"""The frame decoders: bounded buffering, immediate rejection of oversized lengths, typed errors
for every kind of malformed body, and a dead decoder after the first error."""

from __future__ import annotations

import pytest

from querylib.connector import (
    ConnectorProtocolError,
    FrameTooLargeError,
    LocalProtocolError,
    MalformedFrameError,
    UnknownTagError,
    draft,
    released,
)


def test_length_beyond_maximum_raises_before_the_body_arrives():
    decoder = released.FrameDecoder(max_frame_size=100)
    assert decoder.receive_data(b"\x00\x00") == []
    with pytest.raises(FrameTooLargeError):
        decoder.receive_data(b"\x00\x65")  # 101: the 4 length bytes are enough to refuse
    assert decoder.buffered == 0


def test_maximum_frame_size_counts_tag_and_body():
    ok = draft.encode(draft.Error(b"x" * 7))  # length 1 + 2 + 7 = 10
    assert draft.FrameDecoder(max_frame_size=10).receive_data(ok) == [draft.Error(b"x" * 7)]
    with pytest.raises(FrameTooLargeError):
        draft.FrameDecoder(max_frame_size=9).receive_data(ok)


def test_default_maximum_is_a_few_mib_and_a_4gib_length_is_refused():
    decoder = draft.FrameDecoder()
    assert decoder.max_frame_size == 4 * 1024 * 1024
    with pytest.raises(FrameTooLargeError):
        decoder.receive_data(b"\xff\xff\xff\xff")


def test_buffer_holds_at_most_one_partial_frame():
    max_size = 64
    decoder = draft.FrameDecoder(max_frame_size=max_size)
    frame = draft.encode(draft.Message(1, 0, 1, None, b"p" * 40))
    stream = frame * 20
    high = 0
    for i in range(len(stream)):
        decoder.receive_data(stream[i : i + 1])
        high = max(high, decoder.buffered)
    assert high < 4 + max_size
    assert decoder.buffered == 0


@pytest.mark.parametrize(
    ("module", "wire", "error"),
    [
        (draft, "00000000", MalformedFrameError),  # length 0: no tag
        (released, "00000000", MalformedFrameError),
        (draft, "01000000 5a", UnknownTagError),  # 'Z'
        (released, "00000001 09", UnknownTagError),
        (released, "00000001 ff", UnknownTagError),
        (draft, "03000000 48 0500", MalformedFrameError),  # HELLO version cut short
        (draft, "04000000 45 0000 00", MalformedFrameError),  # ERROR with a trailing byte
        (draft, "02000000 4f 00", MalformedFrameError),  # OK credits cut short
        (draft, "06000000 4f 00000000 ff", MalformedFrameError),  # OK partial pair
        (draft, "0c000000 41 00000000 01020304050607", MalformedFrameError),  # ACK partial pair
        (draft, "0b000000 4d 0100000000000000 1000", MalformedFrameError),  # MESSAGE, no id
        # MESSAGE with EVENT_TIME set but only 4 bytes of event time
        (draft, "17000000 4d 0100000000000000 1000 0100000000000000 00000000",
         MalformedFrameError),
        (released, "00000012 04 02 0000000000000001 0000000000000002",
         MalformedFrameError),  # NOTIFY_ACK success byte 2
        # ACK announcing 2^32-1 pairs in a tiny frame: refused without allocating them
        (released, "00000009 06 00000001 ffffffff", MalformedFrameError),
        (released, "00000007 07 ffffffff 0000", MalformedFrameError),  # RESTART size too big
        (released, "00000005 08 00000000", MalformedFrameError),  # EOS cut short
    ],
)
def test_malformed_bodies_get_typed_errors(module, wire, error):
    decoder = module.FrameDecoder()
    with pytest.raises(error):
        decoder.receive_data(bytes.fromhex(wire))


def test_decoder_is_dead_after_an_error():
    decoder = draft.FrameDecoder()
    with pytest.raises(UnknownTagError):
        decoder.receive_data(bytes.fromhex("01000000 5a"))
    good = draft.encode(draft.Ok(1))
    for _ in range(3):
        with pytest.raises(UnknownTagError):
            decoder.receive_data(good)
    assert decoder.buffered == 0


def test_frames_before_a_bad_one_come_out_incrementally():
    decoder = draft.FrameDecoder()
    decoder.feed(draft.encode(draft.Ok(1)) + bytes.fromhex("01000000 5a"))
    assert decoder.next_frame() == draft.Ok(1)
    with pytest.raises(ConnectorProtocolError):
        decoder.next_frame()


@pytest.mark.parametrize("size", [0, -1, 2**32])
def test_maximum_frame_size_must_be_sane(size):
    with pytest.raises(LocalProtocolError):
        draft.FrameDecoder(max_frame_size=size)
