"""The public surface of querylib.connector: everything in __all__ exists, and nothing private
leaks into it."""

from __future__ import annotations

import querylib.connector as connector
from querylib.connector import draft, released


def test_all_names_exist_and_are_public():
    for name in connector.__all__:
        assert hasattr(connector, name), name
        assert not name.startswith("_"), name
    assert sorted(connector.__all__) == sorted(set(connector.__all__))


def test_dialect_modules_export_their_frames():
    for module in (draft, released):
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)
        assert {cls.__name__ for cls in module.CODEC.by_tag.values()} <= set(module.__all__)


def test_errors_sit_under_the_tq_hierarchy():
    from catalog.errors import ProtocolError, TqError

    assert issubclass(connector.ConnectorProtocolError, ProtocolError)
    assert issubclass(connector.LocalProtocolError, TqError)
    assert not issubclass(connector.LocalProtocolError, ProtocolError)
    for name in connector.__all__:
        obj = getattr(connector, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, TqError), name
