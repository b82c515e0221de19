"""encode -> decode round trips over edge values for every frame type of both dialects, frames
split across arbitrary chunk boundaries, and encoder refusals of unrepresentable values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.connector import LocalProtocolError, draft, released

from .strategies import ALL_FRAME_CLASSES, any_frame, chunked, frames_of

U64_MAX = 2**64 - 1
HEAVY = 50  # examples for the costlier properties: keeps the suite fast on 2 shared cores


@pytest.mark.parametrize(
    ("module", "cls"), ALL_FRAME_CLASSES, ids=lambda v: getattr(v, "__name__", str(v))
)
@given(data=st.data())
@settings(max_examples=HEAVY)
def test_round_trip_every_frame_type(module, cls, data):
    frame = data.draw(frames_of(cls))
    wire = module.encode(frame)
    assert module.FrameDecoder(max_frame_size=len(wire)).receive_data(wire) == [frame]
    # ...and decode -> encode gives the same bytes back (no two encodings of one frame).
    assert module.encode(module.CODEC.decode_body(wire[4], wire[5:])) == wire


@pytest.mark.parametrize("module", [draft, released], ids=["draft", "released"])
@given(data=st.data())
@settings(max_examples=HEAVY)
def test_frames_survive_any_chunking(module, data):
    frames = data.draw(st.lists(any_frame(module), min_size=1, max_size=6))
    wire = b"".join(module.encode(f) for f in frames)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=12))
    decoder = module.FrameDecoder(max_frame_size=max(len(wire), 1))
    got = []
    for chunk in chunked(wire, cuts):
        got += decoder.receive_data(chunk)
    assert got == frames
    assert decoder.buffered == 0


def test_length_counts_the_tag_in_both_dialects():
    assert draft.encode(draft.Ok(0))[:4] == (5).to_bytes(4, "little")
    assert released.encode(released.Ok(0))[:4] == (5).to_bytes(4, "big")


@pytest.mark.parametrize(
    ("module", "frame"),
    [
        (draft, draft.Ok(2**32)),
        (draft, draft.Ok(-1)),
        (draft, draft.Notify(U64_MAX + 1, b"", 0)),
        (draft, draft.Error(b"x" * 65536)),
        (draft, draft.Message(1, 16, 1, None)),  # EVENT_TIME flag without an event time
        (draft, draft.Message(1, 0, 1, 5)),  # event time without the flag
        (draft, draft.Ack(1, ((1, 2, 3),))),
        (draft, draft.Ack(1, ((1, -2),))),
        (draft, draft.Notify(1, "text, not bytes", 0)),
        (draft, draft.Nack(True, 1, 1)),
        (released, released.Message(1, 1, 2**63)),
        (released, released.Message(1, 1, -(2**63) - 1)),
        (released, released.NotifyAck(1, 1, 1)),
        (released, draft.Ok(1)),  # a frame of the other dialect
    ],
)
def test_encode_refuses_unrepresentable_values(module, frame):
    with pytest.raises(LocalProtocolError):
        module.encode(frame)


def test_max_length_short_string_and_extreme_values():
    frame = released.Message(U64_MAX, U64_MAX, -(2**63), b"k" * 65535, b"")
    assert released.FrameDecoder().receive_data(released.encode(frame)) == [frame]
