"""Example queries shipped with querylib (`python -m querylib.examples.numbers`)."""

__all__: list[str] = []
