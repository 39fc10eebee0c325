"""Series labels of every figure and table: `paper`, `measured (<machine>)` or `simulated (<profile>)`."""

from __future__ import annotations

from typing import Literal

SeriesKind = Literal["paper", "measured", "simulated"]
SERIES_KINDS: tuple[str, ...] = ("paper", "measured", "simulated")


def series_label(kind: SeriesKind, name: str | None = None) -> str:
    """Return a series label: `paper`, `measured (<machine>)` or `simulated (<profile>)`."""
    if kind == "paper":
        return "paper"
    if kind not in ("measured", "simulated"):
        raise ValueError(f"series kind {kind!r} is not one of paper, measured, simulated")
    if not name:
        raise ValueError(f"a {kind} series needs a {'machine' if kind == 'measured' else 'profile'} name")
    return f"{kind} ({name})"


def series_kind(label: str) -> str:
    """The kind of a series label (`paper`, `measured`, `simulated`)."""
    kind = label.split(" (", 1)[0]
    if kind not in SERIES_KINDS:
        raise ValueError(f"series label {label!r} is not `paper`, `measured (...)` or `simulated (...)`")
    return kind
