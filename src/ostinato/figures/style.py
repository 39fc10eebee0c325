"""One plotting style for every figure: seaborn theme, engine colours, series labels, saving."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import matplotlib

matplotlib.use("Agg")  # figures are files; no display needed

import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

from ostinato.presets import POLICY_SUFFIX, display_name
from ostinato.series import SERIES_KINDS, SeriesKind, series_kind, series_label  # noqa: E402,F401

# Fixed colours per engine so a variant looks the same in every figure.
ENGINE_COLORS: dict[str, str] = {
    "stock": "#7f7f7f",
    "ostinato": "#1f77b4",
    "lru": "#ff7f0e",
    "buun": "#2ca02c",
    "ktransformers": "#9467bd",
    "whole-layer": "#8c564b",
    "llama.cpp-layers": "#8c564b",
    "llama.cpp-expert-cache": "#ff7f0e",
    "llama.cpp-cpu-experts": "#bcbd22",
    "ktransformers-placement": "#9467bd",
    "ostinato-native-prefill": "#17becf",
}
_FALLBACK = sns.color_palette("colorblind", 10).as_hex()

# Line style per series kind: the paper's numbers, our measurements, the cost model's predictions.
SERIES_MARKERS: dict[str, str] = {"paper": "s", "measured": "o", "simulated": "^"}
SERIES_LINESTYLES: dict[str, str] = {"paper": ":", "measured": "-", "simulated": "--"}

RC: dict[str, object] = {
    "figure.figsize": (6.4, 3.6),
    "figure.dpi": 100,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "pdf.fonttype": 42,  # embed TrueType: text stays text in the PDF
    "ps.fonttype": 42,
    "axes.titlesize": "medium",
    "legend.frameon": False,
}


def engine_label(engine: str, kind: SeriesKind, name: str | None = None) -> str:
    """Return the legend entry of an engine's series, e.g. `ostinato, measured (h200)`; a measured baseline policy
    implemented on the engine's pools says so (`buun (policy, implemented here), measured (h200)`)."""
    return f"{display_name(engine) if kind == 'measured' else engine}, {series_label(kind, name)}"


def engine_palette(engines: list[str]) -> dict[str, str]:
    """Return a colour per engine (fixed ones for known engines, then a colourblind palette)."""
    out, i = {}, 0
    for e in engines:
        base = e.removesuffix(POLICY_SUFFIX)
        if base in ENGINE_COLORS:
            out[e] = ENGINE_COLORS[base]
        else:
            out[e] = _FALLBACK[i % len(_FALLBACK)]
            i += 1
    return out


# One colour per series kind; several measured or simulated series get shades of their kind's colour.
SERIES_COLORS: dict[str, str] = dict(zip(SERIES_KINDS, ("#4d4d4d", "#1f77b4", "#ff7f0e")))


def series_palette(labels: list[str]) -> dict[str, str]:
    """A colour per series label: grey for the paper, blues for measured series, oranges for simulated ones."""
    out: dict[str, str] = {}
    for kind in SERIES_KINDS:
        same = [lab for lab in labels if series_kind(lab) == kind]
        shades = sns.light_palette(SERIES_COLORS[kind], n_colors=len(same) + 2, reverse=True).as_hex()
        out.update({lab: shades[i] for i, lab in enumerate(same)})
    return out


def apply_style() -> None:
    """Set the shared theme for the current process (notebooks call this once at the top)."""
    sns.set_theme(context="paper", style="whitegrid", palette="colorblind", rc=RC)


@contextmanager
def styled() -> Iterator[None]:
    """Use the shared theme inside a `with` block only, restoring the previous settings after."""
    with plt.rc_context(), sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        plt.rcParams.update(RC)
        yield


def save_figure(fig: plt.Figure, stem: str | Path, formats: tuple[str, ...] = ("pdf", "png")) -> list[Path]:
    """Save a figure as `<stem>.pdf` and `<stem>.png` (directories created); return the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        fig.savefig(path, metadata={"CreationDate": None} if fmt == "pdf" else None)
        paths.append(path)
    return paths
