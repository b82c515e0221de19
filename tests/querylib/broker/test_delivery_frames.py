"""How a subscriber splits a delivery of several payload frames (a replicated partition's
leader sends a run of batches a frame each, DESIGN §5 "Replication") into contiguous chunks,
and refuses frames that do not line up (`_frame_starts`)."""

from __future__ import annotations

from querylib.broker._subscriber import _frame_starts
from querylib.broker.messages import Delivery
from querylib.records import encode_batch, stamp_base_offset


def _batch(base: int, records: int) -> bytes:
    return stamp_base_offset(encode_batch([(1, None, b"v", ())] * records), base)


def _delivery(offset: int, next_offset: int) -> Delivery:
    return Delivery(sub_id=1, topic="t", partition=0, offset=offset, next_offset=next_offset)


def test_each_frame_starts_at_its_first_batch_and_ends_where_the_next_starts() -> None:
    frames = [_batch(10, 2), _batch(12, 3) + _batch(15, 1), _batch(17, 4)]
    assert _frame_starts(_delivery(10, 21), frames) == [10, 12, 17, 21]
    # One frame, as every delivery but a replicated run's: the delivery's own range.
    assert _frame_starts(_delivery(10, 12), frames[:1]) == [10, 12]


def test_frames_out_of_order_outside_the_range_or_empty_are_refused() -> None:
    assert _frame_starts(_delivery(10, 21), []) is None
    assert _frame_starts(_delivery(10, 21), [_batch(10, 2), _batch(10, 2)]) is None
    assert _frame_starts(_delivery(10, 21), [_batch(10, 2), _batch(14, 1), _batch(12, 1)]) \
        is None
    assert _frame_starts(_delivery(10, 14), [_batch(10, 2), _batch(14, 1)]) is None
    assert _frame_starts(_delivery(10, 14), [_batch(10, 2), b""]) is None
