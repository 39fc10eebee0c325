"""Rows of the files a check reads: CSV tables, JSON and YAML documents, pytest's junit XML and the summary line of
a pytest log. Every reader returns a list of dicts and the path of the checked field within each row; a missing
column or key is an error naming the file (a claims file that asks for it is wrong), a missing file is the
caller's "not run"."""

from __future__ import annotations

import fnmatch
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import yaml

FORMATS = {".csv": "csv", ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".xml": "junit", ".txt": "pytest-log"}
SKIPPED = "skipped"  # a test outcome that counts as not run
_MISSING = object()


class SourceError(ValueError):
    """A file lacks the column or key a check reads (the message names both)."""


def file_format(path: Path, fmt: str | None) -> str:
    """The format of a source: given, or from its suffix."""
    if fmt:
        return fmt
    try:
        return FORMATS[Path(path).suffix]
    except KeyError:
        raise SourceError(f"{path}: no format for suffix {Path(path).suffix!r} (give `format`)") from None


def get_path(row: dict, path: str, source: str) -> object:
    """The value at a dotted path of a row (`weights.ok`); an error naming the file and the path when absent."""
    node: object = row
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            keys = ", ".join(map(str, node)) if isinstance(node, dict) else type(node).__name__
            raise SourceError(f"{source}: no {path!r} (at {part!r}: {keys})")
    return node


def _csv(path: Path) -> list[dict]:
    df = pd.read_csv(path)
    return [{c: v.item() if hasattr(v, "item") else v for c, v in zip(df.columns, row)}
            for row in df.itertuples(index=False, name=None)]


def _document(path: Path, fmt: str, field: str) -> tuple[list[dict], str]:
    text = path.read_text(encoding="utf-8")
    doc = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    if "[]" not in field:
        return [doc], field
    head, _, rest = field.rpartition("[]")
    if "[]" in head:
        raise SourceError(f"{path}: one list per field ({field!r})")
    rows = get_path(doc, head, str(path)) if head else doc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise SourceError(f"{path}: {head!r} is not a list of objects")
    return rows, rest.lstrip(".")


def junit_id(case: ET.Element) -> str:
    """A testcase's pytest node id (`tests/test_x.py::test_y[param]`) from junit's classname and name."""
    classname = case.get("classname", "")
    module, _, cls = classname, "", ""
    parts = classname.split(".")
    # pytest writes `tests.test_x` for module-level tests and `tests.test_x.TestClass` for methods
    if len(parts) > 1 and parts[-1][:1].isupper():
        module, cls = ".".join(parts[:-1]), parts[-1]
    node = module.replace(".", "/") + ".py"
    return "::".join(p for p in (node, cls, case.get("name", "")) if p)


def _junit(path: Path) -> list[dict]:
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        outcome = ("failed" if "failure" in tags else "error" if "error" in tags else
                   SKIPPED if "skipped" in tags else "passed")
        rows.append({"test": junit_id(case), "outcome": outcome})
    return rows


def _pytest_log(path: Path) -> list[dict]:
    lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()
             if re.search(r"\d+ (passed|failed|errors?)\b", ln)]
    if not lines:
        raise SourceError(f"{path}: no pytest summary line (`N passed ...`)")
    counts = {("error" if k.startswith("error") else k): int(n)
              for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", lines[-1])}
    return [{"outcome": k} for k in ("passed", "failed", "error", SKIPPED) for _ in range(counts.get(k, 0))]


def read_rows(path: Path, fmt: str | None, field: str) -> tuple[list[dict], str]:
    """The rows of one source file and the path of `field` within each row."""
    fmt = file_format(path, fmt)
    if fmt == "csv":
        rows = _csv(path)
        if rows and not field.startswith("_") and field.split(".")[0] not in rows[0]:
            raise SourceError(f"{path}: no column {field!r} (columns: {', '.join(map(str, rows[0]))})")
        return rows, field
    if fmt in ("json", "yaml"):
        return _document(path, fmt, field)
    if fmt == "junit":
        return _junit(path), field
    if fmt == "pytest-log":
        return _pytest_log(path), field
    raise SourceError(f"{path}: unknown format {fmt!r}")


def is_missing(value: object) -> bool:
    """An empty cell, a missing value or a skipped test: left out of every reduction."""
    return (value is None or value is _MISSING or value == SKIPPED
            or (isinstance(value, float) and math.isnan(value)))


def fill(text: str, variables: dict[str, str]) -> str:
    """`{name}` replaced by the context's variables (an error naming the variable when it is not given)."""
    try:
        return text.format(**variables)
    except KeyError as exc:
        raise SourceError(f"{text!r} uses {{{exc.args[0]}}}, which this run does not set "
                          f"(variables: {', '.join(sorted(variables)) or 'none'})") from None


def _scalar(value: object) -> object:
    if isinstance(value, str) and value in ("True", "False", "true", "false"):
        return value.lower() == "true"
    return value


def matches(value: object, wanted: object, variables: dict[str, str]) -> bool:
    """Whether a cell equals a `where` value: numbers as numbers, booleans as booleans, strings with * wildcards
    and {name} variables; a tuple of values matches any of them."""
    if isinstance(wanted, tuple):
        return any(matches(value, w, variables) for w in wanted)
    value = _scalar(value)
    if isinstance(wanted, bool):
        return isinstance(value, bool) and value == wanted
    if isinstance(wanted, (int, float)):
        try:
            return float(value) == float(wanted)
        except (TypeError, ValueError):
            return False
    pattern = fill(str(wanted), variables)
    return fnmatch.fnmatchcase(str(value), pattern) if "*" in pattern else str(value) == pattern


def select(rows: list[dict], where: tuple[tuple[str, object], ...], variables: dict[str, str],
           source: str) -> list[dict]:
    """The rows matching every `where` item (columns may be dotted paths)."""
    return [r for r in rows if all(matches(get_path(r, k, source), v, variables) for k, v in where)]
