"""Hypothesis strategies for connector frames, derived from each frame's declared layout so that
every frame type of both dialects is covered, with edge values weighted in (0, max, empty and
max-length strings, empty payloads)."""

from __future__ import annotations

from hypothesis import strategies as st

from querylib.connector import draft, released
from querylib.connector._wire import Bool, Bytes, IfFlag, Int, Pairs, Rest

U64_MAX = 2**64 - 1

ALL_FRAME_CLASSES = [
    *((draft, cls) for cls in draft.CODEC.by_tag.values()),
    *((released, cls) for cls in released.CODEC.by_tag.values()),
]


def edge_ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted({low, high, low + 1, high - 1, 0 if low <= 0 <= high else low})
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def edge_bytes(max_size: int) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.just(b""),
        st.binary(max_size=32),
        st.just(b"\xff" * min(max_size, 65535)),  # the longest a short string can be
    )


def field_strategy(kind, values: dict) -> st.SearchStrategy:
    if isinstance(kind, Int):
        return edge_ints(kind.low, kind.high)
    if isinstance(kind, Bool):
        return st.booleans()
    if isinstance(kind, Bytes):
        return edge_bytes(kind.max)
    if isinstance(kind, Rest):
        return st.one_of(st.just(b""), st.binary(max_size=64))
    if isinstance(kind, Pairs):
        pair = st.tuples(edge_ints(0, U64_MAX), edge_ints(0, U64_MAX))
        return st.lists(pair, max_size=4).map(tuple)
    if isinstance(kind, IfFlag):
        if values[kind.flags_field] & kind.bit:
            return field_strategy(kind.kind, values)
        return st.none()
    raise AssertionError(f"no strategy for {kind!r}")


@st.composite
def frames_of(draw, cls):
    values: dict = {}
    for name, kind in cls.layout:
        values[name] = draw(field_strategy(kind, values))
    return cls(**values)


def any_frame(module) -> st.SearchStrategy:
    return st.one_of([frames_of(cls) for cls in module.CODEC.by_tag.values()])


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` split at the given cut points (clamped and sorted)."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)] or [b""]
