"""Typed remote errors: a TqError crosses the wire as data and comes back as its class."""

from __future__ import annotations

from catalog.errors import ProtocolError, TqError, UserError
from querylib.rpc import (
    DeadlineExceededError,
    ErrorBody,
    RemoteError,
    RpcError,
    ServerBusyError,
    UnknownMessageTypeError,
    error_body,
    error_from_body,
)

from ._support import ShelfEmptyError, ShelfError, ShelfLockedError


def round_trip(exc: TqError, declared: type[TqError] = TqError) -> TqError:
    return error_from_body(error_body(exc), declared)


def test_declared_error_comes_back_as_its_class_with_traits() -> None:
    back = round_trip(ShelfEmptyError("shelf 3 is empty"), ShelfError)
    assert type(back) is ShelfEmptyError
    assert str(back) == "shelf 3 is empty" and back.retriable and back.kafka_error_code == 3


def test_class_with_its_own_constructor_is_rebuilt_from_the_message() -> None:
    back = round_trip(ShelfLockedError("7", "alice"), ShelfError)
    assert type(back) is ShelfLockedError and str(back) == "shelf 7 locked by alice"


def test_rpc_errors_are_always_known() -> None:
    for exc in (DeadlineExceededError("late"), ServerBusyError("busy"),
                UnknownMessageTypeError("what")):
        back = round_trip(exc, ShelfError)
        assert type(back) is type(exc) and str(back) == str(exc)


def test_error_outside_the_declared_type_is_a_remote_error_with_remote_traits() -> None:
    back = round_trip(UserError("bad argument"), ShelfError)
    assert type(back) is RemoteError and isinstance(back, RpcError)
    assert back.remote_type == "catalog.errors.UserError"
    assert back.kafka_error_code == UserError.kafka_error_code and not back.retriable


def test_unknown_class_name_is_a_remote_error() -> None:
    body = ErrorBody("somewhere.else.FancyError", "it broke", True, 42)
    back = error_from_body(body)
    assert isinstance(back, RemoteError) and back.remote_type == "somewhere.else.FancyError"
    assert back.retriable and back.kafka_error_code == 42 and str(back) == "it broke"
    # Forwarded again, it keeps its remote name.
    assert error_body(back) == body


def test_names_of_non_error_classes_are_never_instantiated() -> None:
    for name in ("builtins.SystemExit", "os.system", "subprocess.Popen", "builtins.object"):
        back = error_from_body(ErrorBody(name, "x", False, -1))
        assert type(back) is RemoteError


def test_long_messages_are_truncated() -> None:
    body = error_body(ProtocolError("x" * 100_000))
    assert len(body.message) < 5000
