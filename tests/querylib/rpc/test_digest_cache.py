"""`DigestCache` (querylib.rpc._signer): a frame sent to several peers is hashed once; a
digest is only ever given for the very bytes it was computed from; memory stays bounded."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from querylib.rpc._signer import DigestCache, payload_digest


def test_a_kept_frame_is_hashed_once_for_every_peer_it_goes_to() -> None:
    cache = DigestCache(1 << 20, 16)
    batch = b"held batch" * 100
    assert [cache.digest(batch) for _ in range(3)] == [payload_digest(batch)] * 3
    assert cache.hashed == 1 and len(cache) == 1 and cache.kept_bytes == len(batch)
    # `kept` answers only for this very frame, hashing nothing
    assert cache.kept(batch) == payload_digest(batch)
    assert cache.kept(bytes(bytearray(batch))) is None
    assert cache.kept(bytearray(batch)) is None and cache.hashed == 1


def test_an_offset_truncated_and_written_again_never_gets_the_old_digest() -> None:
    """Keyed by the frame itself, not by the offset it was held at: a batch written again
    at the same offset (a new leader epoch, other records, the same length) is another
    object, hashed for itself, even while the old one is still kept."""
    cache = DigestCache(1 << 20, 16)
    held = {5: bytes(b"a" * 64)}
    old = cache.digest(held[5])
    held[5] = bytes(b"b" * 64)  # truncated, rewritten: the old batch lives on in the cache
    assert cache.digest(held[5]) == payload_digest(b"b" * 64) != old
    assert cache.hashed == 2


def test_a_buffer_that_may_change_is_hashed_every_time() -> None:
    cache = DigestCache(1 << 20, 16)
    buffer = bytearray(b"x" * 64)
    assert cache.digest(buffer) == payload_digest(b"x" * 64)
    buffer[:] = b"y" * 64
    assert cache.digest(buffer) == payload_digest(b"y" * 64)
    assert cache.digest(memoryview(buffer)) == payload_digest(b"y" * 64)
    assert cache.hashed == 3 and len(cache) == 0


def test_the_cache_is_bounded_in_bytes_and_frames_and_lets_dropped_frames_go() -> None:
    cache = DigestCache(1000, 4)
    first = bytes(300)
    refs = sys.getrefcount(first)
    cache.digest(first)
    assert sys.getrefcount(first) == refs + 1  # kept while its digest is
    frames = [bytes([i]) * 300 for i in range(5)]
    for frame in frames:
        cache.digest(frame)
        assert cache.kept_bytes <= 1000 and len(cache) <= 4
    assert sys.getrefcount(first) == refs  # dropped, oldest first
    assert cache.kept_bytes == 900 and len(cache) == 3
    small = [bytes([i]) * 10 for i in range(10)]
    for frame in small:
        cache.digest(frame)
    assert len(cache) == 4  # the count bounds small frames
    huge = bytes(2000)
    assert cache.digest(huge) == payload_digest(huge)
    assert len(cache) == 4 and cache.kept_bytes <= 1000  # not kept: over the whole bound
    with pytest.raises(ValueError):
        DigestCache(1000, 0)


def test_a_new_frame_at_a_dropped_frames_id_is_hashed_for_itself() -> None:
    """CPython gives a new object the id of one just freed: a frame dropped (its batch made
    durable and let go) and another made at its place must not get its digest."""
    cache = DigestCache(1 << 20, 8)
    ids = []
    for i in range(64):
        frame = bytes([i]) * 50  # a new object of the same size each time
        ids.append(id(frame))
        assert cache.digest(frame) == payload_digest(frame)
        del frame  # the cache may still hold it; the next frame may take its id when not
    assert len(set(ids)) < len(ids)  # ids were reused: the case this test is about


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.binary(min_size=0, max_size=40)),
                max_size=60),
       st.integers(0, 200), st.integers(1, 5))
def test_every_digest_is_the_digest_of_the_frame_given(ops, max_bytes, max_frames) -> None:
    """Frames created, replaced and dropped at random (CPython reuses the ids of dropped
    objects), a small cache: whatever it kept or dropped, each answer is the digest of the
    bytes asked about."""
    cache = DigestCache(max_bytes, max_frames)
    slots: dict[int, bytes] = {}
    for slot, data in ops:
        if slot in slots and data[:1] == b"\x00":
            del slots[slot]  # dropped: its id may be taken by the next frame
            continue
        if slot not in slots or data[:1] == b"\x01":
            slots[slot] = bytes(bytearray(data))  # a new object each time
        frame = slots[slot]
        assert cache.digest(frame) == payload_digest(frame)
        assert cache.kept_bytes <= max_bytes and len(cache) <= max_frames


def test_a_kept_frame_is_made_sendable_once_for_every_peer_it_goes_to() -> None:
    # A held batch fetched by both followers and pushed to a subscriber: one shared send
    # wrapper (a zero-copy zmq frame) and one hash for all of them.
    cache = DigestCache(1 << 20, 16)
    batch = b"held batch" * 100
    made: list[bytes] = []

    def share(frame: bytes) -> object:
        made.append(frame)
        return ("sendable", len(made))

    assert cache.digest(batch) == payload_digest(batch)
    got = [cache.sendable(batch, share) for _ in range(3)]
    assert got == [(("sendable", 1), payload_digest(batch))] * 3
    assert cache.hashed == 1 and cache.shared == 1 and made == [batch]
    other = b"another batch" * 10  # never hashed before: hashed and shared, once
    assert cache.sendable(other, share) == cache.sendable(other, share)
    assert cache.hashed == 2 and cache.shared == 2
    # A buffer that may change is made sendable (and hashed) every time, never kept.
    buffer = bytearray(b"x" * 64)
    cache.sendable(buffer, share)
    cache.sendable(buffer, share)
    assert cache.shared == 4 and cache.hashed == 4 and len(cache) == 2
