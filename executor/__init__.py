"""The host agent: registration, heartbeats, artifact fetch, process spawn and supervision."""
