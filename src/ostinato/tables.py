"""Tables rendered next to figures: CSV for machines, Markdown for people (no extra dependency)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ostinato.atomic import atomic_open


def _cell(value: object, floatfmt: str) -> str:
    """Format one cell: floats with `floatfmt`, missing values empty, pipes escaped."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return format(value, floatfmt)
    return str(value).replace("|", "\\|")


def to_markdown(df: pd.DataFrame, floatfmt: str = ".3g") -> str:
    """Return a GitHub-style Markdown table of a data frame (index not included)."""
    cols = [str(c) for c in df.columns]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v, floatfmt) for v in row) + " |")
    return "\n".join(lines) + "\n"


def save_table(df: pd.DataFrame, stem: str | Path, floatfmt: str = ".3g") -> list[Path]:
    """Write `<stem>.csv` and `<stem>.md` atomically; return the paths."""
    stem = Path(stem)
    csv, md = stem.with_suffix(".csv"), stem.with_suffix(".md")
    with atomic_open(csv) as fh:
        df.to_csv(fh, index=False)
    with atomic_open(md) as fh:
        fh.write(to_markdown(df, floatfmt))
    return [csv, md]
