"""Documents whose numbers come from data: `ARTIFACT.md` and the READMEs of `data/reference/`.

Each is rendered from a Jinja template (`<name>.md.j2`, see `TEMPLATES`) in which every measured or published
number is an expression over the shipped files it comes from (`csv`, `json`, `yaml`, `text` read a file relative to
the template's folder, or to the repository root with a leading `/`), formatted by the filters below. The
committed document must equal the rendering (`ostinato artifact docs --check`, run by the tests), so a number
cannot drift from its data, and a change of data shows up as a change of the document.
"""

from __future__ import annotations

import gzip
import json as _json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2
import pandas as pd
import yaml as _yaml

from ostinato.artifact.facts import _matches

# template -> document, relative to the repository root
TEMPLATES: dict[str, str] = {
    "artifact/ARTIFACT.md.j2": "ARTIFACT.md",
    "data/reference/h200/README.md.j2": "data/reference/h200/README.md",
    "data/reference/h200/residency/README.md.j2": "data/reference/h200/residency/README.md",
    "data/reference/h200/calibrate/README.md.j2": "data/reference/h200/calibrate/README.md",
    "data/reference/h200/compare/README.md.j2": "data/reference/h200/compare/README.md",
    "data/reference/h200/ablation/README.md.j2": "data/reference/h200/ablation/README.md",
    "data/reference/h200/qwen/README.md.j2": "data/reference/h200/qwen/README.md",
    "data/reference/h200/baselines/README.md.j2": "data/reference/h200/baselines/README.md",
    "data/reference/h200/decode/README.md.j2": "data/reference/h200/decode/README.md",
    "data/reference/h200/branches/README.md.j2": "data/reference/h200/branches/README.md",
    "data/reference/h200/heldout/README.md.j2": "data/reference/h200/heldout/README.md",
    "data/reference/h200/borrow/README.md.j2": "data/reference/h200/borrow/README.md",
    "data/reference/h200/graph/README.md.j2": "data/reference/h200/graph/README.md",
    "data/reference/h100/graph/README.md.j2": "data/reference/h100/graph/README.md",
    "data/reference/h100/bitwise/README.md.j2": "data/reference/h100/bitwise/README.md",
    "data/reference/h100/heldout/README.md.j2": "data/reference/h100/heldout/README.md",
    "data/reference/cpu-2c/README.md.j2": "data/reference/cpu-2c/README.md",
}
MINUS = "\u2212"  # the documents' typographic minus


def num(x: float | int | str, fmt: str = ".3g", plus: bool = False) -> str:
    """`x` formatted with `fmt` (Python format spec; `,` groups thousands), a typographic minus, `+` if `plus`."""
    if isinstance(x, str):
        x = float(x)
    if x is None or (isinstance(x, float) and math.isnan(x)):
        raise ValueError("a number quoted in a document is missing (NaN or None) in its data")
    if fmt.endswith("d"):
        if float(x) != int(float(x)):
            raise ValueError(f"{x} quoted as an integer")
        x = int(float(x))
    s = format(x, fmt)
    if s.startswith("-"):
        s = MINUS + s[1:]
    elif plus and float(x) > 0:
        s = "+" + s
    return s


def pct(x: float, digits: int = 1, plus: bool = False, scale: float = 1.0) -> str:
    """A percentage: `x * scale` with `digits` decimals and a % sign (`scale=100` for a share)."""
    return num(x * scale, f".{digits}f", plus) + "%"


def sci(x: float, digits: int = 0) -> str:
    """`x` in scientific notation as the documents write it: `digits` decimals, no exponent padding (`1.8e-4`)."""
    mantissa, exp = format(float(x), f".{digits}e").split("e")
    return num(float(mantissa), f".{digits}f") + f"e{int(exp)}"


def rng(lo: float, hi: float, fmt: str = ".2f", unit: str = "") -> str:
    """`lo–hi` with an en dash (one value when both round the same)."""
    a, b = num(lo, fmt), num(hi, fmt)
    return (a if a == b else f"{a}–{b}") + unit


def rng_of(values, fmt: str = ".2f", unit: str = "") -> str:
    """The range of some values (`rng` of their minimum and maximum)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("a range of no values")
    return rng(min(vals), max(vals), fmt, unit)


def span(values, fmt: str = ".1f", unit: str = "") -> str:
    """The range of some values in words, `a to b` (for ranges of negative numbers, where an en dash would read as a
    minus); one value when both round the same."""
    vals = [float(v) for v in values]
    a, b = num(min(vals), fmt) + unit, num(max(vals), fmt) + unit
    return a if a == b else f"{a} to {b}"


def mib(nbytes: float, fmt: str = ",.2f") -> str:
    """Bytes as MiB."""
    return num(float(nbytes) / 2**20, fmt)


def and_join(items) -> str:
    """Items as prose: "a", "a and b", "a, b and c"."""
    items = [str(x) for x in items]
    return " and ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


def code(name) -> str:
    """A name in Markdown code type: ostinato -> `ostinato` (for prose lists: `names | map("code") | and_join`)."""
    return f"`{name}`"


def saved_share(ratio: float) -> float:
    """The share (%) a ratio of times saves: 0.56 -> 44."""
    return 100 * (1 - float(ratio))


@dataclass
class Frame:
    """A CSV as the templates use it: rows picked by column values, one value, a column."""

    df: pd.DataFrame
    path: str

    def where(self, **eq) -> Frame:
        df = self.df
        for k, v in eq.items():
            if k not in df.columns:
                raise KeyError(f"{self.path}: no column {k!r} (columns: {', '.join(map(str, df.columns))})")
            df = df[_matches(df[k], v)]
        return Frame(df, self.path)

    def one(self, col: str, **eq) -> object:
        """The value of `col` in the one row matching `eq` (an error naming the file otherwise)."""
        sub = self.where(**eq).df
        if len(sub) != 1:
            raise ValueError(f"{self.path}: {len(sub)} rows match {eq}, expected one")
        return sub[col].iloc[0]

    def where_in(self, col: str, values) -> Frame:
        return Frame(self.df[self.df[col].astype(str).isin([str(v) for v in values])], self.path)

    def col(self, col: str) -> list:
        return list(self.df[col])

    def rows(self) -> list[dict]:
        return self.df.to_dict("records")

    def __len__(self) -> int:
        return len(self.df)


class Loader:
    """File access for one template: paths relative to its folder, or to the repository root when they start with /."""

    def __init__(self, root: Path, folder: Path):
        self.root, self.folder = root, folder

    def _resolve(self, rel: str) -> Path:
        return self.root / rel.lstrip("/") if rel.startswith("/") else self.folder / rel

    def path(self, rel: str) -> Path:
        p = self._resolve(rel)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: a document quotes this file, and it is missing")
        return p

    def exists(self, rel: str) -> bool:
        """Whether a file is there: for the files a run has only while it is under way (collect.sh's partial.*)."""
        return self._resolve(rel).is_file()

    def csv(self, rel: str) -> Frame:
        return Frame(pd.read_csv(self.path(rel)), rel)

    def json(self, rel: str) -> object:
        return _json.loads(self.path(rel).read_text(encoding="utf-8"))

    def yaml(self, rel: str) -> object:
        return _yaml.safe_load(self.path(rel).read_text(encoding="utf-8"))

    def text(self, rel: str) -> str:
        """A text file's content; a `.gz` file is read decompressed (shipped server logs)."""
        p = self.path(rel)
        return (gzip.decompress(p.read_bytes()).decode("utf-8", errors="replace") if p.suffix == ".gz"
                else p.read_text(encoding="utf-8"))

    def grep(self, rel: str, pattern: str, group: int = 1) -> str:
        """The first match of `pattern` in a text file (its `group`), an error naming the file when there is none."""
        m = re.search(pattern, self.text(rel), re.M)
        if not m:
            raise ValueError(f"{rel}: no line matches {pattern!r}")
        return m.group(group)


def environment(root: Path, template: Path) -> jinja2.Environment:
    """The Jinja environment of one template: its loaders and the number filters."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader([str(template.parent), str(root)]),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
                             extensions=["jinja2.ext.do"])
    ld = Loader(root, template.parent)
    env.globals.update(csv=ld.csv, exists=ld.exists, json=ld.json, yaml=ld.yaml, text=ld.text, grep=ld.grep, rng=rng, rng_of=rng_of, span=span,
                       num=num, pct=pct, sci=sci, mib=mib, min=min, max=max, sum=sum, len=len, round=round,
                       sorted=sorted, abs=abs, bool=bool, int=int, float=float, str=str, claims=_claims)
    env.filters.update(num=num, pct=pct, sci=sci, saved_share=saved_share, and_join=and_join, code=code)
    from ostinato.artifact.facts import Facts  # the computations longer than a template expression

    env.globals["facts"] = Facts(ld)
    return env


@jinja2.pass_context
def _claims(ctx: jinja2.runtime.Context, path: str, section: str) -> list[dict]:
    """The entries of one section of a claims file, every text field rendered in the calling template's context."""
    doc = ctx.environment.globals["yaml"](path)
    if section not in doc:
        raise KeyError(f"{path}: no section {section!r}")
    out = []
    for entry in doc[section]:
        out.append({k: ctx.environment.from_string(str(v)).render(ctx.get_all()).strip() if isinstance(v, str) else v
                    for k, v in entry.items()})
    return out


def render(root: Path, template: str) -> str:
    """The document of one template (an error naming the template and its line when it cannot be rendered)."""
    path = root / template
    if not path.is_file():
        raise FileNotFoundError(f"{template}: template missing")
    try:
        return environment(root, path).get_template(path.name).render()
    except jinja2.TemplateError as exc:
        raise ValueError(f"{template}: {exc}") from None


def check(root: Path) -> list[str]:
    """The documents that differ from their rendering (empty when all are current)."""
    stale = []
    for tpl, out in TEMPLATES.items():
        doc = root / out
        if not doc.is_file() or doc.read_text(encoding="utf-8") != render(root, tpl):
            stale.append(out)
    return stale


def write(root: Path) -> list[str]:
    """Render every document; return those that changed."""
    from ostinato.atomic import atomic_open

    changed = []
    for tpl, out in TEMPLATES.items():
        text = render(root, tpl)
        doc = root / out
        if not doc.is_file() or doc.read_text(encoding="utf-8") != text:
            with atomic_open(doc) as f:
                f.write(text)
            changed.append(out)
    return changed
