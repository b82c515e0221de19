"""The catalog model: records, collections with diffs, the catalog state machine, topic names.

Pure: no I/O, no sockets, no clocks. Imports only the standard library and msgspec.
"""

from catalog.errors import CatalogError, ProtocolError, StorageError, TqError, UserError

__all__ = ["CatalogError", "ProtocolError", "StorageError", "TqError", "UserError"]
