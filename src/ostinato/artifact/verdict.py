"""The verdict of every claim of `artifact/claims.yaml`: each check evaluated on this run's results and on the shipped
data to `met`, `not met`, `not applicable here` or `not run`, with the measured values, the target and the source.

"Here" is the machine kind of this run's engine build (`Context.kind`): `gpu` where the pipeline builds and runs the
CUDA engine (`engine.backend: auto` on a machine with an NVIDIA GPU and a CUDA toolkit, or `cuda`), `cpu` otherwise,
GPU or not, because then every expert runs on the CPU. A check whose `applies` leaves this kind out is not applicable
here; one whose file is missing, or whose rows hold no value, is not run, never met.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ostinato.artifact.checks import Check, Claim, Number, Ref, RowField, Target, default_on
from ostinato.artifact.readers import fill, get_path, is_missing, read_rows, select

MET, NOT_MET, NOT_APPLICABLE, NOT_RUN = "met", "not met", "not applicable here", "not run"
OUTCOMES = (MET, NOT_MET, NOT_APPLICABLE, NOT_RUN)
_PRECEDENCE = (NOT_MET, NOT_RUN, MET, NOT_APPLICABLE)  # a claim's outcome: the first its checks reach
_SHOWN = 6  # values listed one by one in the measured column; more are summarised
_TEST_OUTCOMES = ("passed", "failed", "error")


@dataclass(frozen=True)
class Context:
    """Where the checks run: the machine kind, the repository root the sources are relative to, and the variables
    sources and `where` values may use (`{machine}`: this run's label, `{model}`: the replayed model)."""

    kind: str
    root: Path
    variables: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def kind_of(backend: str) -> str:
        """The machine kind of an engine backend: `cuda` is a GPU run, `cpu` a CPU-only one."""
        kinds = {"cuda": "gpu", "cpu": "cpu"}
        if backend not in kinds:
            raise ValueError(f"backend {backend!r}: expected one of {', '.join(kinds)}")
        return kinds[backend]


@dataclass(frozen=True)
class Result:
    """One check's verdict and what it read."""

    check: Check
    outcome: str
    measured: str
    target: str
    source: str
    note: str = ""


class _NotRun(Exception):
    """The input of a check is missing (a file, or any value in the selected rows)."""


@dataclass
class _Value:
    label: str
    value: object
    row: dict | None
    key: dict[str, str]  # the group's `by` columns and their values


def _label(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _fmt(value: object, check: Check) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if check.fmt.endswith("d") and float(value).is_integer():
            value = int(value)
        elif check.fmt.endswith("d"):
            return format(value, ".3g") + check.unit
        return format(value, check.fmt) + check.unit
    return str(value)


def _dir_labels(paths: list[str]) -> list[str]:
    """What tells several sources apart (their folders below the common one); one source: its folder's name."""
    parents = [Path(p).parent.parts for p in paths]
    if len(paths) == 1:
        return [parents[0][-1] if parents[0] else ""]
    n = 0
    while all(len(p) > n for p in parents) and len({p[n] for p in parents}) == 1:
        n += 1
    return ["/".join(p[n:]) or Path(q).name for p, q in zip(parents, paths)]


def _rows(sources: tuple[str, ...], fmt: str | None, field_: str, where, ctx: Context) -> list[tuple[dict, str, str]]:
    """(row, field path, source) of every selected row; _NotRun naming the files that are missing."""
    paths = [fill(s, ctx.variables) for s in sources]
    missing = [p for p in paths if not (ctx.root / p).is_file()]
    if missing:
        raise _NotRun(f"missing {', '.join(missing)}")
    out = []
    for path, label in zip(paths, _dir_labels(paths)):
        rows, fpath = read_rows(ctx.root / path, fmt, field_)
        rows = [{**r, "_dir": label} for r in rows]
        out += [(r, fpath, path) for r in select(rows, where, ctx.variables, path)]
    if not out:
        shown = ", ".join(f"{k}={fill(str(v), ctx.variables)}" for k, v in where)
        raise _NotRun(f"no rows of {', '.join(paths)} match {shown}")
    return out


def _reduce(values: list[object], how: str, n_rows: int, what: str) -> list[object]:
    """The values a group compares: all of them (`each`), the one (`one`), or one aggregate."""
    if how == "count":
        return [n_rows]
    if not values:
        return []
    if how == "each":
        return values
    if how == "one":
        if len(values) > 1:
            raise ValueError(f"{what}: {len(values)} values match, expected one (narrow `where` or add `by`)")
        return values
    nums = [float(v) for v in values]
    agg = {"min": min, "max": max, "median": statistics.median, "mean": statistics.fmean, "sum": sum}[how]
    return [agg(nums)]


def _values(sources, fmt, field_, where, by, how, ctx: Context) -> list[_Value]:
    """The compared values, grouped `by` and reduced; _NotRun when a group has none."""
    groups: dict[tuple, list[tuple[dict, str, str]]] = {}
    for row, fpath, src in _rows(sources, fmt, field_, where, ctx):
        key = tuple(_label(get_path(row, b, src)) for b in by)
        groups.setdefault(key, []).append((row, fpath, src))
    out = []
    for key, items in groups.items():
        present = [(get_path(r, fp, s), r) for r, fp, s in items]
        present = [(v, r) for v, r in present if not is_missing(v)]
        label = "/".join(key)
        reduced = _reduce([v for v, _ in present], how, len(items), f"{items[0][2]} {label}".strip())
        if not reduced:
            raise _NotRun(f"no value of {field_} in {items[0][2]}" + (f" for {label}" if label else ""))
        rows = [r for _, r in present] if how in ("each", "one") else [None]
        out += [_Value(label, v, r, dict(zip(by, key))) for v, r in zip(reduced, rows)]
    return out


class _Resolver:
    """Target numbers of one check: constants, the same row's columns, and values read from other files."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.refs: dict[Ref, dict[tuple, object]] = {}

    def ref(self, ref: Ref) -> dict[tuple, object]:
        if ref not in self.refs:
            vals = _values(ref.sources, ref.format, ref.field, ref.where, ref.by, ref.reduce, self.ctx)
            self.refs[ref] = {tuple(v.key.values()): v.value for v in vals}
        return self.refs[ref]

    def __call__(self, number: object, item: _Value) -> object:
        if isinstance(number, RowField):
            return float(get_path(item.row, number.field, "the compared row")) * number.scale
        if isinstance(number, Ref):
            table = self.ref(number)
            key = tuple(item.key[b] for b in number.by)  # the check groups by these columns too (checks.py)
            if key not in table:
                raise _NotRun(f"{', '.join(number.sources)} has no {number.field} for {'/'.join(key)}")
            value = table[key]
            return float(value) * number.scale if number.scale != 1.0 else value
        return number


def _bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _meets(item: _Value, target: Target, resolve: _Resolver) -> bool:
    """Whether one value meets the target."""
    v = item.value
    if target.equals is not None:
        want = resolve(target.equals, item)
        if isinstance(want, bool) or isinstance(v, bool):
            return _bool(v) is not None and _bool(v) == _bool(want)
        if isinstance(want, (int, float)) and not isinstance(v, str):
            return abs(float(v) - float(want)) <= 1e-9 * max(1.0, abs(float(want)))
        return str(v) == str(want)
    v = float(v)
    tol = float(resolve(target.tol, item)) if target.tol is not None else 0.0

    def slack(x: float) -> float:
        return (target.rel * abs(x) if target.rel is not None else tol) + 1e-9 * max(1.0, abs(x))

    checks = []
    if target.value is not None:
        x = float(resolve(target.value, item))
        checks.append(abs(v - x) <= slack(x))
    for key, op in (("min", lambda a, b: a >= b), ("max", lambda a, b: a <= b), ("gt", lambda a, b: a > b),
                    ("lt", lambda a, b: a < b)):
        bound = getattr(target, key)
        if bound is not None:
            x = float(resolve(bound, item))
            checks.append(op(v, x - slack(x)) if key in ("min", "gt") else op(v, x + slack(x)))
    return all(checks)


def _whose(ref: Ref) -> str:
    """Whose value a reference reads: the engine or series its rows are picked by, else where its file is from."""
    where = dict(ref.where)
    for key in ("engine", "series"):
        v = where.get(key)
        if isinstance(v, str) and "{" not in v and "*" not in v:
            return v
    return "paper" if ref.field == "paper" else default_on(ref.sources[0])


def _describe_number(number: Number | object, check: Check, resolve: _Resolver) -> str:
    if isinstance(number, RowField):
        return f"row {number.field}" if number.scale == 1.0 else f"{number.scale:g} × row {number.field}"
    if isinstance(number, Ref):
        scale = "" if number.scale == 1.0 else f"{number.scale:g} × "
        try:
            table = resolve.ref(number)
        except (_NotRun, ValueError):
            return f"{scale}{_whose(number)}'s {number.field}"
        scaled = {k: float(v) * number.scale if number.scale != 1.0 else v for k, v in table.items()}
        if not number.by:
            return f"{_fmt(scaled[()], check)} ({_whose(number)})"
        listed = "; ".join(f"{'/'.join(k)} {_fmt(v, check)}" for k, v in list(scaled.items())[:_SHOWN])
        return f"{scale}{_whose(number)}'s {number.field}: {listed}"
    return _fmt(number, check)


def describe_target(check: Check, resolve: _Resolver) -> str:
    """The target in words: `= true`, `1 ± 0.05`, `≤ 0.6`, `[lo, hi] ± 5`, `< reference's ttft_tool_s per run`."""
    t = check.target
    num = lambda n: _describe_number(n, check, resolve)  # noqa: E731
    slack = ""
    if t.rel is not None:
        slack = f" ± {t.rel:.0%}"
    elif isinstance(t.tol, float):
        slack = f" ± {format(t.tol, 'g' if check.fmt.endswith('d') else check.fmt.lstrip('+'))}{check.unit}"
    elif t.tol is not None:
        slack = f" ± {num(t.tol)}"
    if t.equals is not None:
        return f"= {num(t.equals)}"
    if t.value is not None:
        return f"{num(t.value)}{slack}"
    if t.min is not None and t.max is not None:
        return f"[{num(t.min)}, {num(t.max)}]{slack}"
    parts = [f"{sym} {num(getattr(t, k))}" for k, sym in (("min", "≥"), ("max", "≤"), ("gt", ">"), ("lt", "<"))
             if getattr(t, k) is not None]
    return ", ".join(parts) + slack


def describe_values(items: list[_Value], check: Check) -> str:
    """The measured values in words: test outcomes and booleans counted, numbers listed or summarised."""
    vals = [i.value for i in items]
    if vals and all(isinstance(v, str) and v in _TEST_OUTCOMES for v in vals):
        counts = Counter(vals)
        return ", ".join(f"{counts[k]} {k}" for k in _TEST_OUTCOMES if counts[k])
    if len(vals) > 1 and all(_bool(v) is not None for v in vals):
        return f"{sum(bool(_bool(v)) for v in vals)} of {len(vals)} true"
    if len(items) <= _SHOWN:
        return "; ".join(f"{i.label} {_fmt(i.value, check)}".strip() for i in items)
    nums = [float(v) for v in vals]
    return f"{len(nums)} values, {_fmt(min(nums), check)} to {_fmt(max(nums), check)}"


def evaluate(check: Check, ctx: Context) -> Result:
    """One check's verdict on this context."""
    resolve = _Resolver(ctx)
    source = ", ".join(check.sources)
    if ctx.kind not in check.applies:
        kinds = " and ".join(sorted(check.applies))
        return Result(check, NOT_APPLICABLE, "", describe_target(check, resolve), source,
                      _join(f"applies on a {kinds} run; this run is {ctx.kind}", check.note))
    try:
        source = ", ".join(fill(s, ctx.variables) for s in check.sources)
        items = _values(check.sources, check.format, check.field, check.where, check.by, check.reduce, ctx)
        failed = [i for i in items if not _meets(i, check.target, resolve)]
    except _NotRun as exc:
        return Result(check, NOT_RUN, "", describe_target(check, resolve), source, _join(str(exc), check.note))
    measured, target = describe_values(items, check), describe_target(check, resolve)
    if failed:
        shown = "; ".join(f"{i.label} {_fmt(i.value, check)}".strip() for i in failed[:_SHOWN])
        return Result(check, NOT_MET, measured, target, source, _join(f"outside the target: {shown}", check.note))
    return Result(check, MET, measured, target, source, check.note)


def _join(*parts: str) -> str:
    return ". ".join(p.rstrip(".") for p in parts if p)


def evaluate_all(claims: list[Claim], ctx: Context) -> list[Result]:
    """Every check of every claim, in the claims' order."""
    return [evaluate(check, ctx) for claim in claims for check in claim.checks]


def combine(outcomes: list[str]) -> str:
    """A claim's outcome from its checks': not met if any is, else not run if any is, else met if any is, else
    not applicable here; empty when it has no checks of this kind."""
    for outcome in _PRECEDENCE:
        if outcome in outcomes:
            return outcome
    return ""


@dataclass(frozen=True)
class ClaimVerdict:
    """A claim's outcome on this run and on the shipped data, with its checks' results."""

    claim: Claim
    run: str
    shipped: str
    results: tuple[Result, ...]


def verdicts(claims: list[Claim], results: list[Result]) -> list[ClaimVerdict]:
    """Each claim's outcomes (this run's checks; the shipped reference runs' and the paper's)."""
    out = []
    for claim in claims:
        mine = tuple(r for r in results if r.check.claim == claim.id)
        out.append(ClaimVerdict(claim, combine([r.outcome for r in mine if not r.check.shipped]),
                                combine([r.outcome for r in mine if r.check.shipped]), mine))
    return out
