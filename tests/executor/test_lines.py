"""LineSplitter: lines in order, bounded pieces, nothing lost, UTF-8 kept whole."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor import LineSplitter


def split_all(data_chunks, max_line=16):
    splitter = LineSplitter(max_line)
    out = []
    for chunk in data_chunks:
        out += splitter.feed(chunk)
        assert splitter.pending <= max_line
    return out + splitter.close()


def test_lines_across_chunks_and_a_last_line_without_newline():
    assert split_all([b"one\ntw", b"o\n", b"\nthree"]) == [
        (b"one", False), (b"two", False), (b"", False), (b"three", False)]


def test_crlf_loses_its_cr_and_a_lone_cr_stays():
    assert split_all([b"a\r\nb\rc\n"]) == [(b"a", False), (b"b\rc", False)]


def test_a_long_line_is_cut_into_marked_pieces():
    out = split_all([b"x" * 40 + b"\nend\n"])
    assert out == [(b"x" * 16, True), (b"x" * 16, True), (b"x" * 8, False), (b"end", False)]


def test_a_line_of_exactly_max_line_is_one_piece():
    assert split_all([b"y" * 16 + b"\n"]) == [(b"y" * 16, False)]


def test_cuts_fall_between_utf8_characters():
    text = "é" * 20  # two bytes each: a cut at 16 bytes is a boundary, at 15 it would not be
    out = split_all([("a" + text + "\n").encode()])
    assert [len(piece) for piece, _ in out] == [15, 16, 10]
    assert "".join(piece.decode() for piece, _ in out) == "a" + text


def test_close_on_empty_returns_nothing():
    assert LineSplitter().close() == []


def test_a_tiny_maximum_is_refused():
    with pytest.raises(ValueError):
        LineSplitter(4)


def rejoin(pieces):
    lines, current = [], b""
    for piece, continues in pieces:
        current += piece
        if not continues:
            lines.append(current)
            current = b""
    assert current == b""
    return lines


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=10), st.integers(16, 40))
def test_any_bytes_any_chunking_rejoin_to_the_lines(data, cuts, max_line):
    pieces = split_all(chunked(data, cuts), max_line)
    assert all(len(piece) <= max_line for piece, _ in pieces)
    *ended, last = data.split(b"\n")
    expected = [line.removesuffix(b"\r") for line in ended]  # CR of a CRLF goes
    if last:
        expected.append(last)  # a last line without newline is kept as it is
    assert rejoin(pieces) == expected


@given(st.text(max_size=200), st.lists(st.integers(0, 800), max_size=10), st.integers(16, 24))
def test_utf8_text_is_never_cut_inside_a_character(text, cuts, max_line):
    data = text.encode()
    for piece, _ in split_all(chunked(data, cuts), max_line):
        piece.decode("utf-8")  # raises if a cut split a character
