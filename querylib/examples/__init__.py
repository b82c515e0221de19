"""Example queries shipped with querylib (`python -m querylib.examples.numbers_query`)."""

__all__: list[str] = []
