"""Parsers of command-line values shared by the CLIs: comma lists of integers with the flag named in each error."""

from __future__ import annotations


def int_list(text: str, flag: str, n: int | None = None, minimum: int | None = None) -> tuple[int, ...]:
    """`text` as a comma list of integers ("1e9" allowed); `n` values exactly and each >= `minimum` when given."""
    try:
        values = tuple(int(float(x)) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a comma list of integers") from None
    if n is not None and len(values) != n:
        raise ValueError(f"{flag} {text!r}: expected {n} values, got {len(values)}")
    if minimum is not None and min(values) < minimum:
        raise ValueError(f"{flag} {text!r}: every value must be at least {minimum}")
    return values
