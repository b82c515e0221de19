"""The control-plane server: event loop, request handlers, sessions and leases, placement,
catalog persistence and recovery."""
