"""Development / screening / held-out splits sized like the paper's Table 2, seeded and written down.

Rule (recorded in the split file with the seed): sessions are drawn from those whose request count lies in
a range like the paper's (SWE held-out sessions send 42–100 requests), in the order of a seeded permutation
of the ids sorted. SWE: held-out first (13), then development (6); screening = the first 30 turns of the
first 2 development sessions. τ2: held-out 20 per domain (airline, retail, telecom; sessions outside the length range only where a
domain has too few inside it; a short domain is made up from the others), then development 24
round-robin over the domains; one session per task across both sets.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ostinato.atomic import atomic_open
from ostinato.errors import InputError
from ostinato.inputs import load_json
from ostinato.sessions.tables import TurnRow


@dataclass(frozen=True)
class SplitSpec:
    """Sizes and length ranges of the Table 2 splits (defaults: the paper's)."""

    seed: int = 0
    swe_dev: int = 6
    swe_heldout: int = 13
    swe_screening_sessions: int = 2
    swe_screening_turns: int = 30
    swe_requests: tuple[int, int] = (42, 100)
    tau2_dev: int = 24
    tau2_heldout_per_domain: int = 20
    tau2_domains: tuple[str, ...] = ("airline", "retail", "telecom")
    tau2_requests: tuple[int, int] = (8, 40)


@dataclass(frozen=True)
class SplitSet:
    """One set of a split: its source, session ids (in order) and the per-session request cap (0 = all)."""

    source: str
    sessions: list[str]
    max_requests: int = 0
    domains: dict[str, int] = field(default_factory=dict)


def _permuted(ids: list[str], rng: np.random.Generator) -> list[str]:
    """The ids sorted, then put in a seeded random order."""
    ids = sorted(ids)
    return [ids[i] for i in rng.permutation(len(ids))]


def _in_range(rows: list[TurnRow], bounds: tuple[int, int]) -> bool:
    """Whether a session's request count lies in [lo, hi]."""
    return bounds[0] <= len(rows) <= bounds[1]


def split_swe(table: dict[str, list[TurnRow]], spec: SplitSpec, source: str) -> dict[str, SplitSet]:
    """SWE held-out, development and screening sets from one SWE table."""
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 1]))
    pool = _permuted([s for s, rows in table.items() if rows and _in_range(rows, spec.swe_requests)], rng)
    need = spec.swe_heldout + spec.swe_dev
    if len(pool) < need:
        raise ValueError(f"{source}: {len(pool)} sessions with {spec.swe_requests[0]}–{spec.swe_requests[1]} "
                         f"requests, {need} needed")
    heldout, dev = pool[: spec.swe_heldout], pool[spec.swe_heldout : need]
    return {
        "swe-dev": SplitSet(source, dev),
        "swe-screening": SplitSet(source, dev[: spec.swe_screening_sessions], spec.swe_screening_turns),
        "swe-heldout": SplitSet(source, heldout),
    }


def _take(pool: list[str], table: dict[str, list[TurnRow]], n: int, used_tasks: set[str], taken: set[str]) -> list[str]:
    """Take up to n ids from pool, skipping taken sessions and sessions of already used tasks."""
    out = []
    for sid in pool:
        if len(out) >= n:
            break
        task = table[sid][0].task
        if sid in taken or (task and task in used_tasks):
            continue
        out.append(sid)
        taken.add(sid)
        if task:
            used_tasks.add(task)
    return out


def _domain_counts(ids: list[str], table: dict[str, list[TurnRow]]) -> dict[str, int]:
    """Sessions per domain of a set."""
    out: dict[str, int] = {}
    for sid in ids:
        out[table[sid][0].domain] = out.get(table[sid][0].domain, 0) + 1
    return dict(sorted(out.items()))


def split_tau2(table: dict[str, list[TurnRow]], spec: SplitSpec, source: str) -> dict[str, SplitSet]:
    """τ2 held-out (per domain) and development sets from one τ2 table; one session per task across both."""
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 2]))
    pools = {}
    for d in spec.tau2_domains:  # sessions of a paper-like length first, the others only to fill a domain up
        ids = [s for s, rows in table.items() if rows and rows[0].domain == d]
        inside = [s for s in ids if _in_range(table[s], spec.tau2_requests)]
        pools[d] = _permuted(inside, rng) + _permuted(sorted(set(ids) - set(inside)), rng)
    used: set[str] = set()
    taken: set[str] = set()
    heldout = []
    for d in spec.tau2_domains:
        heldout += _take(pools[d], table, spec.tau2_heldout_per_domain, used, taken)
    target = spec.tau2_heldout_per_domain * len(spec.tau2_domains)
    dev: list[str] = []
    for goal, out in ((target, heldout), (spec.tau2_dev, dev)):
        while len(out) < goal:  # round-robin over the domains that still have sessions
            before = len(out)
            for d in spec.tau2_domains:
                if len(out) < goal:
                    out += _take(pools[d], table, 1, used, taken)
            if len(out) == before:
                raise ValueError(f"{source}: only {len(out)} sessions with distinct tasks for a set of {goal}")
    return {
        "tau2-dev": SplitSet(source, dev, domains=_domain_counts(dev, table)),
        "tau2-heldout": SplitSet(source, heldout, domains=_domain_counts(heldout, table)),
    }


def make_splits(swe: dict[str, list[TurnRow]], tau2: dict[str, list[TurnRow]], spec: SplitSpec,
                swe_source: str = "swe-mini") -> dict[str, SplitSet]:
    """All Table 2 sets: SWE development, screening and held-out; τ2 development and held-out."""
    return {**split_swe(swe, spec, swe_source), **split_tau2(tau2, spec, "tau2")}


def write_splits(sets: dict[str, SplitSet], spec: SplitSpec, path: Path, tables: dict[str, dict],
                 command: str = "") -> None:
    """Write the split file: the seed and rule, the tables it came from, the command, and per set its session ids."""
    doc = {
        "seed": spec.seed,
        "command": command,
        "rule": (__doc__ or "").split("\n\n", 1)[1].replace("\n", " ").strip(),
        "spec": asdict(spec),
        "tables": tables,
        "sets": {name: asdict(s) for name, s in sets.items()},
    }
    with atomic_open(path) as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")


def read_splits(path: Path) -> dict[str, SplitSet]:
    """Read the sets of a split file written by `write_splits`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"split file {path} does not exist (made by `ostinato sessions split`)")
    doc = load_json(path, "a split file (`ostinato sessions split`)")
    try:
        return {name: SplitSet(**s) for name, s in doc["sets"].items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{path}: not a split file (key 'sets': {exc})") from None
