"""The public surface of querylib.rpc: everything in __all__ exists, nothing private leaks."""

from __future__ import annotations

import querylib.rpc as rpc


def test_all_names_exist_and_are_public() -> None:
    for name in rpc.__all__:
        assert hasattr(rpc, name), name
        assert not name.startswith("_"), name
    assert len(set(rpc.__all__)) == len(rpc.__all__)


def test_every_public_attribute_is_exported() -> None:
    public = {name for name in vars(rpc) if not name.startswith("_")}
    assert public == set(rpc.__all__)


def test_errors_subclass_the_tq_hierarchy() -> None:
    from catalog.errors import ProtocolError, TqError, UserError
    assert issubclass(rpc.RpcError, TqError)
    assert issubclass(rpc.RpcProtocolError, ProtocolError)
    assert issubclass(rpc.SecretFileError, UserError)
    assert issubclass(rpc.AddressError, UserError)
