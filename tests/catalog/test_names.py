"""Topic names: the KoP mapping, the on-disk directory form, and what bad names are told."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from catalog import (
    MAX_TOPIC_NAME_LENGTH,
    InvalidTopicNameError,
    TopicName,
    UserError,
)

# (spelling, canonical full form, short form, directory form, internal)
VALID = [
    ("numbers", "persistent://public/default/numbers", "numbers", "numbers", False),
    ("public/default/numbers", "persistent://public/default/numbers", "numbers", "numbers", False),
    (
        "persistent://public/default/numbers",
        "persistent://public/default/numbers",
        "numbers",
        "numbers",
        False,
    ),
    (
        "acme/prod/orders",
        "persistent://acme/prod/orders",
        "acme/prod/orders",
        "acme%2Fprod%2Forders",
        False,
    ),
    (
        "persistent://acme/prod/orders.v2",
        "persistent://acme/prod/orders.v2",
        "acme/prod/orders.v2",
        "acme%2Fprod%2Forders.v2",
        False,
    ),
    ("__logs", "persistent://public/default/__logs", "__logs", "__logs", True),
    (
        "__catalog.executors",
        "persistent://public/default/__catalog.executors",
        "__catalog.executors",
        "__catalog.executors",
        True,
    ),
    (
        "__consumer_offsets",
        "persistent://public/default/__consumer_offsets",
        "__consumer_offsets",
        "__consumer_offsets",
        True,
    ),
    (
        "public/__kafka/__consumer_offsets",
        "persistent://public/__kafka/__consumer_offsets",
        "public/__kafka/__consumer_offsets",
        "public%2F__kafka%2F__consumer_offsets",
        True,
    ),
    ("A-b_c.9", "persistent://public/default/A-b_c.9", "A-b_c.9", "A-b_c.9", False),
    (
        "x" * MAX_TOPIC_NAME_LENGTH,
        f"persistent://public/default/{'x' * 249}",
        "x" * 249,
        "x" * 249,
        False,
    ),
]

# (spelling, what the error must say)
INVALID = [
    ("", "the name is empty"),
    ("a/b", "1 '/' found, expected none or two"),
    ("a/b/c/d", "3 '/' found"),
    ("/a/b", "the tenant is empty"),
    ("a//b", "the namespace is empty"),
    ("a/b/", "the name is empty"),
    ("persistent://a/b", "persistent:// must be followed by TENANT/NAMESPACE/NAME"),
    ("persistent://a/b/c/d", "persistent:// must be followed by TENANT/NAMESPACE/NAME"),
    ("persistent:///b/c", "the tenant is empty"),
    ("non-persistent://a/b/c", "non-persistent topics are not supported"),
    ("http://a/b/c", "unknown scheme 'http://'"),
    ("PERSISTENT://a/b/c", "unknown scheme"),
    ("my topic", "contains ' '"),
    ("topic%2F", "contains '%'"),
    ("tëst", "contains 'ë'"),
    ("a/b\x00/c", "contains '\\x00'"),
    (".", "may not be '.' or '..'"),
    ("a/../c", "may not be '.' or '..'"),
    ("x" * (MAX_TOPIC_NAME_LENGTH + 1), "longer than 249 characters"),
    ("x" * 10_000_000, "longer than 249 characters"),
    ("acme/prod/" + "x" * 240, "longer than 249 characters"),  # fits, but not with %2F twice
]


@pytest.mark.parametrize(("text", "full", "short", "dir_name", "internal"), VALID)
def test_valid_names(text: str, full: str, short: str, dir_name: str, internal: bool) -> None:
    name = TopicName.parse(text)
    assert name.full == str(name) == full
    assert name.short == short
    assert name.dir_name == dir_name
    assert name.internal is internal
    assert "/" not in name.dir_name
    # Every spelling of the same topic is the same name.
    assert TopicName.parse(full) == TopicName.parse(short) == name
    assert TopicName.from_dir_name(dir_name) == name
    assert TopicName.parse_partition_dir(name.partition_dir(7)) == (name, 7)


@pytest.mark.parametrize(("text", "why"), INVALID, ids=[t[:20] for t, _ in INVALID])
def test_invalid_names_say_what_is_valid(text: str, why: str) -> None:
    with pytest.raises(InvalidTopicNameError) as info:
        TopicName.parse(text)
    message = str(info.value)
    assert why in message
    assert "a valid topic name is NAME, TENANT/NAMESPACE/NAME or persistent://" in message
    assert len(message) < 400  # a huge input is cut, not echoed


def test_error_traits() -> None:
    with pytest.raises(UserError) as info:
        TopicName.parse("a/b")
    assert info.value.exit_code == 2
    assert info.value.kafka_error_code == 17  # INVALID_TOPIC_EXCEPTION
    with pytest.raises(InvalidTopicNameError, match="expected a string, got int"):
        TopicName.parse(42)  # type: ignore[arg-type]


def test_fields_are_checked_on_construction() -> None:
    assert TopicName("t", "ns", "n").full == "persistent://t/ns/n"
    with pytest.raises(InvalidTopicNameError, match="the namespace contains '/'"):
        TopicName("t", "a/b", "n")


@pytest.mark.parametrize(
    ("dir_name", "why"),
    [
        ("public%2Fdefault%2Fnumbers", "not the canonical directory form (that is 'numbers')"),
        ("a/b", "never contains '/'"),
        ("a%2fb%2fc", "contains '%'"),  # lower-case escape is not ours
        ("a%2Fb", "1 '/' found"),
    ],
)
def test_directory_form_has_one_spelling(dir_name: str, why: str) -> None:
    with pytest.raises(InvalidTopicNameError, match=why.replace("(", r"\(").replace(")", r"\)")):
        TopicName.from_dir_name(dir_name)


@pytest.mark.parametrize("dir_name", ["numbers", "numbers-", "numbers-01", "-1", "n-x", "n-²"])
def test_bad_partition_directories(dir_name: str) -> None:
    with pytest.raises(InvalidTopicNameError):
        TopicName.parse_partition_dir(dir_name)


def test_partition_dir_keeps_dashes_in_names() -> None:
    name = TopicName.parse("my-topic-2")
    assert name.partition_dir(0) == "my-topic-2-0"
    assert TopicName.parse_partition_dir("my-topic-2-0") == (name, 0)
    with pytest.raises(InvalidTopicNameError):
        name.partition_dir(-1)


_PART = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=30).filter(
    lambda p: p not in (".", "..")
)


@settings(max_examples=200, deadline=None)
@given(_PART, _PART, _PART, st.integers(0, 9_999))
def test_round_trips(tenant: str, namespace: str, local: str, partition: int) -> None:
    name = TopicName(tenant, namespace, local)
    for spelling in (name.full, name.short, f"{tenant}/{namespace}/{local}"):
        assert TopicName.parse(spelling) == name
    assert "/" not in name.dir_name
    assert TopicName.from_dir_name(name.dir_name) == name
    directory = name.partition_dir(partition)
    assert "/" not in directory
    assert len(directory) <= 255
    assert TopicName.parse_partition_dir(directory) == (name, partition)
    assert name.internal == local.startswith("__")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_parse_never_crashes(text: str) -> None:
    try:
        name = TopicName.parse(text)
    except InvalidTopicNameError:
        return
    assert TopicName.parse(name.full) == name


def test_the_clusters_default_namespace() -> None:
    """A cluster started with another default (tq up --tenant acme --namespace lab): bare
    names mean acme/lab, names there show bare, public/default ones in full; system names and
    directory names do not move."""
    from catalog import DEFAULT_NAMESPACE, DEFAULT_TENANT, default_namespace, set_default_namespace

    before = TopicName.parse("numbers")
    set_default_namespace("acme", "lab")
    try:
        assert default_namespace() == ("acme", "lab")
        name = TopicName.parse("numbers")
        assert name.full == "persistent://acme/lab/numbers"
        assert name.short == "numbers"
        assert before.short == "public/default/numbers"
        assert TopicName.parse("public/default/numbers") == before
        assert TopicName.parse("__consumer_offsets").full == \
            "persistent://public/default/__consumer_offsets"
        assert TopicName.parse("__consumer_offsets").short == "__consumer_offsets"
        # The disk form is relative to public/default whatever the default.
        assert before.dir_name == "numbers"
        assert name.dir_name == "acme%2Flab%2Fnumbers"
        assert TopicName.parse_partition_dir("numbers-0") == (before, 0)
        assert TopicName.parse_partition_dir("acme%2Flab%2Fnumbers-3") == (name, 3)
        with pytest.raises(InvalidTopicNameError, match="NAME alone means acme/lab/NAME"):
            TopicName.parse("a/b")
        with pytest.raises(InvalidTopicNameError):
            set_default_namespace("acme", "l/b")
    finally:
        set_default_namespace(DEFAULT_TENANT, DEFAULT_NAMESPACE)
    assert TopicName.parse("numbers") == before
