"""Counts in words, as the report's messages and page write them."""


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """'1 sample', '2,048 samples' (nouns: the plural where it is not noun + 's')."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"
