"""Shared plotting style, series labels and table rendering for the notebooks."""

from ostinato.figures.style import (
    apply_style,
    engine_label,
    engine_palette,
    save_figure,
    series_kind,
    series_label,
    series_palette,
    styled,
)
from ostinato.tables import save_table, to_markdown

__all__ = ["apply_style", "engine_label", "engine_palette", "save_figure", "series_kind", "series_label", "series_palette", "styled",
           "save_table", "to_markdown"]
