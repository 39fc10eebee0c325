"""The checks of `artifact/claims.yaml` as data: each claim's machine-readable expectations, validated against
`artifact/claims.schema.json` (what each key means is written there) and turned into frozen dataclasses that
`ostinato.artifact.verdict` evaluates. A claim's texts and its checks sit in the same entry, so they cannot drift
apart."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Union

import jsonschema
import yaml

KINDS = ("cpu", "gpu")  # what "here" can be: the machine kind of this run's engine build
REDUCTIONS = ("one", "each", "min", "max", "median", "mean", "sum", "count")
SCHEMA = "artifact/claims.schema.json"


class ClaimsError(ValueError):
    """The claims file breaks its schema or names something that cannot be checked (the message names the key)."""


@dataclass(frozen=True)
class Ref:
    """A value read from a file like a check's values (e.g. the paper's number), times `scale`."""

    sources: tuple[str, ...]
    field: str
    where: tuple[tuple[str, object], ...] = ()
    by: tuple[str, ...] = ()
    reduce: str = "one"
    format: str | None = None
    scale: float = 1.0


@dataclass(frozen=True)
class RowField:
    """A column of the row whose value is compared (e.g. a table's own `lo` and `hi`), times `scale`."""

    field: str
    scale: float = 1.0


Number = Union[float, Ref, RowField]


@dataclass(frozen=True)
class Target:
    """What the values must be: `equals`, or bounds (`min`, `max` inclusive; `gt`, `lt` exclusive), or `value`;
    `tol` (absolute) or `rel` (relative) widens `value` and the bounds."""

    equals: object = None
    value: Number | None = None
    min: Number | None = None
    max: Number | None = None
    gt: Number | None = None
    lt: Number | None = None
    tol: Number | None = None
    rel: float | None = None

    def parts(self) -> dict[str, object]:
        """The keys that are set, in a fixed order."""
        return {k: v for k, v in (("equals", self.equals), ("value", self.value), ("min", self.min),
                                  ("max", self.max), ("gt", self.gt), ("lt", self.lt), ("tol", self.tol),
                                  ("rel", self.rel)) if v is not None}


@dataclass(frozen=True)
class Check:
    """One expectation of a claim: the values of `field` in `sources` (rows filtered by `where`, grouped `by`,
    reduced by `reduce`) against `target`, where `applies` says (machine kinds, or every machine)."""

    claim: str
    index: int
    metric: str
    sources: tuple[str, ...]
    field: str
    target: Target
    applies: frozenset[str]
    on: str
    format: str | None = None
    where: tuple[tuple[str, object], ...] = ()
    by: tuple[str, ...] = ()
    reduce: str = "one"
    fmt: str = ".3g"
    unit: str = ""
    note: str = ""

    @property
    def name(self) -> str:
        """`A4.2`: the claim and the check's number within it."""
        return f"{self.claim}.{self.index}"

    @property
    def shipped(self) -> bool:
        """Whether the check reads the shipped data (a reference run or the paper) rather than this run."""
        return self.on != "this run"


@dataclass(frozen=True)
class Claim:
    """One row of ARTIFACT.md (`property` for A*, `claim` for C*) with its checks."""

    id: str
    kind: str
    title: str
    checks: tuple[Check, ...] = field(default_factory=tuple)


def default_on(source: str) -> str:
    """What a source's values are: `paper` (data/paper/), `reference (<machine>)` (data/reference/<machine>/), else
    `this run`."""
    parts = Path(source).parts
    if parts[:2] == ("data", "paper"):
        return "paper"
    if parts[:2] == ("data", "reference") and len(parts) > 2:
        return f"reference ({parts[2]})"
    return "this run"


def _where(doc: dict | None) -> tuple[tuple[str, object], ...]:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in (doc or {}).items())


def _number(doc: object) -> Number | None:
    if doc is None or isinstance(doc, (int, float)) and not isinstance(doc, bool):
        return None if doc is None else float(doc)
    if isinstance(doc, dict) and "source" in doc:
        sources = doc["source"] if isinstance(doc["source"], list) else [doc["source"]]
        return Ref(tuple(sources), doc["field"], _where(doc.get("where")), tuple(doc.get("by", ())),
                   doc.get("reduce", "one"), doc.get("format"), float(doc.get("scale", 1.0)))
    if isinstance(doc, dict):
        return RowField(doc["field"], float(doc.get("scale", 1.0)))
    return doc  # a string or boolean of `equals`


def _target(doc: dict) -> Target:
    equals = doc.get("equals")
    return Target(equals=_number(equals) if isinstance(equals, dict) else equals,
                  **{k: _number(doc.get(k)) for k in ("value", "min", "max", "gt", "lt", "tol")}, rel=doc.get("rel"))


def _rebase(source: str, root: str) -> str:
    """A this-run source under a shipped run's root (`tables/x.csv` -> `data/reference/cpu-2c/tables/x.csv`)."""
    if Path(source).parts[0] not in ("results", "tables"):
        raise ClaimsError(f"`also` rebases results/ and tables/ sources only, not {source}")
    return f"{root}/{source}"


def _rebase_target(target: Target, root: str) -> Target:
    """The target of a check rebased by `also`: values read from this run's files come from the shipped run too."""
    def rebase(n: object) -> object:
        if isinstance(n, Ref) and all(Path(s).parts[0] in ("results", "tables") for s in n.sources):
            return replace(n, sources=tuple(_rebase(s, root) for s in n.sources))
        return n
    return Target(**{k: rebase(v) for k, v in target.parts().items()})


def _checks(claim: str, docs: list[dict]) -> tuple[Check, ...]:
    out: list[Check] = []
    for doc in docs:
        sources = doc["source"] if isinstance(doc["source"], list) else [doc["source"]]
        target = _target(doc["target"])
        if doc.get("reduce", "one") not in ("one", "each") and any(
                isinstance(v, RowField) for v in target.parts().values()):
            raise ClaimsError(f"{claim}: a target of the same row's column needs reduce one or each "
                              f"({doc['metric']!r})")
        for ref in (v for v in target.parts().values() if isinstance(v, Ref)):
            if not set(ref.by) <= set(doc.get("by", ())):
                raise ClaimsError(f"{claim}: a target read by {list(ref.by)} needs the check grouped by them too "
                                  f"({doc['metric']!r})")
        applies = frozenset(KINDS) if doc["applies"] == "any" else frozenset(doc["applies"])
        common = dict(metric=doc["metric"], field=doc["field"], target=target, format=doc.get("format"),
                      where=_where(doc.get("where")), by=tuple(doc.get("by", ())), reduce=doc.get("reduce", "one"),
                      fmt=doc.get("fmt", ".3g"), unit=doc.get("unit", ""), note=doc.get("note", "").strip())
        ons = {default_on(s) for s in sources}
        if "label" not in doc and len(ons) > 1:
            raise ClaimsError(f"{claim}: the sources of {doc['metric']!r} are of different kinds ({sorted(ons)})")
        on = doc.get("label", ons.pop())
        out.append(Check(claim, len(out) + 1, sources=tuple(sources), applies=applies, on=on, **common))
        for root in doc.get("also", ()):
            rebased = {**common, "target": _rebase_target(target, root)}
            out.append(Check(claim, len(out) + 1, sources=tuple(_rebase(s, root) for s in sources),
                             applies=frozenset(KINDS), on=default_on(root + "/"), **rebased))
    return tuple(out)


def validate(doc: dict, schema: dict) -> None:
    """Raise ClaimsError naming the first entry and key that break the schema."""
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    if err is not None:
        where = "/".join(str(p) for p in err.absolute_path) or "(top)"
        entry = ""
        if len(err.absolute_path) >= 2 and isinstance(doc.get(err.absolute_path[0]), list):
            entry = f" (entry {doc[err.absolute_path[0]][err.absolute_path[1]].get('id', '?')})"
        raise ClaimsError(f"{where}{entry}: {err.message}")


def load_claims(path: Path, schema_path: Path | None = None) -> list[Claim]:
    """The claims of a claims file (properties first, then the paper's claims), validated against the schema
    (default: `artifact/claims.schema.json` beside it)."""
    path = Path(path)
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    schema_path = schema_path or path.with_name(Path(SCHEMA).name)
    try:
        validate(doc, json.loads(schema_path.read_text(encoding="utf-8")))
        claims = [Claim(e["id"], kind, e["title"], _checks(e["id"], e["checks"]))
                  for section, kind in (("properties", "property"), ("claims", "claim")) for e in doc[section]]
    except ClaimsError as exc:
        raise ClaimsError(f"{path}: {exc}") from None
    ids = [c.id for c in claims]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ClaimsError(f"{path}: ids used twice: {', '.join(dup)}")
    return claims
