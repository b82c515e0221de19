"""Declaring messages: tags, declared reply and error types, the registry."""

from __future__ import annotations

import pytest

from catalog.errors import TqError
from querylib.rpc import Kind, Notify, Ping, Pong, Reply, Request, message_type

from ._support import Fetch, FetchReply, ShelfError


def test_request_declares_its_reply_and_error_types() -> None:
    assert Fetch.reply_type is FetchReply and Fetch.error_type is ShelfError
    assert Ping.reply_type is Pong and Ping.error_type is TqError
    assert Fetch.rpc_kind == Kind.REQUEST and FetchReply.rpc_kind == Kind.REPLY


def test_registry_maps_tags_to_classes() -> None:
    assert message_type("test.fetch") is Fetch
    assert message_type("rpc.pong") is Pong
    assert message_type("no.such.tag") is None


def test_subclass_inherits_the_declared_reply() -> None:
    class Base(Request[FetchReply]):
        pass

    class Concrete(Base, tag="test.messages.concrete"):
        pass

    assert Base.rpc_tag is None and Concrete.reply_type is FetchReply


def test_a_tag_is_claimed_once() -> None:
    with pytest.raises(TypeError, match="already used"):
        class Again(Reply, tag="test.fetch.reply"):
            pass


def test_a_tagged_request_must_declare_a_reply() -> None:
    with pytest.raises(TypeError, match="declare the reply type"):
        class NoReply(Request, tag="test.messages.noreply"):
            pass
    with pytest.raises(TypeError, match="Reply subclass"):
        class BadReply(Request[int], tag="test.messages.badreply"):  # type: ignore[type-var]
            pass


def test_tags_are_strings() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        class Numbered(Notify, tag=5):
            pass
