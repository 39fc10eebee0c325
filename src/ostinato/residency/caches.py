"""The baselines' expert caches, as the engine runs them (`--residency-policy lru|decay`), in plain Python.

The engine's cache log (`--residency-cache-log`) has one line per forward pass and MoE layer that a cache serves:
the pass, its first position, tokens and rows, the layer and its pool, the distinct experts the layer routed to
(in first-use order) and what the cache did (hits, misses, evictions, admissions); a pass the cache does not
serve is one `native` line. `replay_log` runs the same experts through the same rules and gives the counts the
engine must have logged (`tests/test_caches.py` compares them on the CPU build). The simulator uses these classes
too, so each baseline is simulated as it is implemented.

- `LruCache` (llama.cpp's expert cache as the paper describes it): one cache per pool (the layers of one GPU with
  one expert size), least recently used first out, filled with the plan's experts in plan order; a pass it serves
  (at most `max_pass` tokens) uploads each missing expert on demand, in first-use order, into a free slot or the
  least recently used one, and then computes every route from the pool.
- `DecayCache` (buun's): per-expert scores, 1 for the plan's experts and 0 for the others at the start, that decay
  by `decay` every decode step and grow by 1 for each route; a decode step computes its cached experts from the
  pool and the others on the CPU; at the next token boundary up to `admit` layers (the largest gains first) swap
  their lowest-scored cached expert for the highest-scored expert the step missed, when it scores more than
  `1 + hysteresis` times as much. Ties go to the lower expert and the lower layer, as in the engine.
"""

from __future__ import annotations

import csv
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LOG_COLUMNS = ("pass", "pos0", "n_tokens", "rows", "layer", "pool", "path", "hits", "misses", "evictions",
               "admissions", "experts")


@dataclass(frozen=True)
class CacheCounts:
    """What one layer's pass found in a cache and did to it."""

    hits: int = 0        # distinct experts found in the pool
    misses: int = 0      # distinct experts not found
    evictions: int = 0   # experts removed (lru) or swapped out (decay)
    admissions: int = 0  # experts put into the pool


@dataclass(frozen=True)
class LogLine:
    """One line of the engine's cache log."""

    pass_: int
    pos0: int
    n_tokens: int
    rows: int
    layer: int
    pool: int
    path: str                   # "cache" (served from the pool) or "native" (computed as llama.cpp does)
    counts: CacheCounts
    experts: tuple[int, ...]    # the layer's distinct experts in first-use order ("cache" lines)


class LruCache:
    """One LRU cache of `slots` experts shared by the layers of a pool; keys are (layer, expert)."""

    def __init__(self, slots: int, warm: list[tuple[int, int]] | None = None):
        if slots < 0:
            raise ValueError(f"an LRU cache needs slots >= 0, got {slots}")
        warm = list(warm or [])
        if len(warm) > slots or len(set(warm)) != len(warm):
            raise ValueError(f"an LRU cache of {slots} slots cannot start with {len(warm)} experts (or repeats)")
        self.slots = slots
        self.order: OrderedDict[tuple[int, int], None] = OrderedDict((k, None) for k in warm)

    def serve(self, layer: int, experts: list[int]) -> CacheCounts:
        """One pass of one layer over its distinct experts in first-use order: misses are admitted in that order."""
        hits = misses = evictions = 0
        for e in experts:
            key = (layer, int(e))
            if key in self.order:
                self.order.move_to_end(key)
                hits += 1
                continue
            misses += 1
            if self.slots == 0:
                continue
            if len(self.order) >= self.slots:
                self.order.popitem(last=False)
                evictions += 1
            self.order[key] = None
        return CacheCounts(hits, misses, evictions, misses if self.slots else 0)

    def resident(self, layer: int) -> set[int]:
        return {e for (l, e) in self.order if l == layer}


class DecayCache:
    """buun's decaying-count cache over all MoE layers; `resident` (bool [n_layer, n_expert]) is the warm start."""

    def __init__(self, resident: np.ndarray, decay: float = 0.95, hysteresis: float = 0.25, admit: int = 1):
        if not 0.0 < decay <= 1.0 or hysteresis < 0 or admit < 0:
            raise ValueError(f"decay cache: decay in (0, 1], hysteresis >= 0 and admit >= 0 expected, got "
                             f"{decay}, {hysteresis}, {admit}")
        self.resident = np.asarray(resident, dtype=bool).copy()
        self.score = self.resident.astype(np.float64)
        self.decay, self.hysteresis, self.admit = float(decay), float(hysteresis), int(admit)
        self._last: dict[int, list[int]] = {}

    def boundary(self) -> set[int]:
        """A token boundary: the swaps the last step earned, then the decay; returns the layers that swapped."""
        gains = []
        for layer, row in self._last.items():
            res = self.resident[layer]
            cand = [e for e in row if not res[e]]
            cached = np.flatnonzero(res)
            if not cand or cached.size == 0:
                continue
            best = max(cand, key=lambda e: (self.score[layer, e], -e))
            victim = int(cached[np.argmin(self.score[layer, cached])])
            if self.score[layer, best] > self.score[layer, victim] * (1.0 + self.hysteresis):
                gains.append((self.score[layer, best] - self.score[layer, victim], -layer, victim, best))
        swapped = set()
        for _, neg_layer, victim, best in sorted(gains, reverse=True)[: self.admit]:
            layer = -neg_layer
            self.resident[layer, victim] = False
            self.resident[layer, best] = True
            swapped.add(layer)
        self._last = {}
        self.score *= self.decay
        return swapped

    def record(self, layer: int, row: list[int], swapped: bool) -> CacheCounts:
        """One layer's decode row (its distinct experts): hits against the pool after the boundary's swaps."""
        hits = sum(1 for e in row if self.resident[layer, e])
        for e in row:
            self.score[layer, e] += 1.0
        self._last[layer] = [int(e) for e in row]
        return CacheCounts(hits, len(row) - hits, int(swapped), int(swapped))

    def step(self, rows: dict[int, list[int]]) -> dict[int, CacheCounts]:
        """A whole decode step: the boundary, then each layer's row {layer: distinct experts}."""
        swapped = self.boundary()
        return {l: self.record(l, r, l in swapped) for l, r in sorted(rows.items())}


def read_cache_log(path: str | Path) -> list[LogLine]:
    """The engine's cache log; a clear error names the file, line and column that do not parse."""
    path = Path(path)
    out = []
    with path.open(newline="", encoding="utf-8") as f:
        rd = csv.reader(f, delimiter="\t")
        header = next(rd, None)
        if tuple(header or ()) != LOG_COLUMNS:
            raise ValueError(f"{path}: expected the header {' '.join(LOG_COLUMNS)}, got {header}")
        for n, row in enumerate(rd, start=2):
            if len(row) != len(LOG_COLUMNS):
                raise ValueError(f"{path}:{n}: expected {len(LOG_COLUMNS)} tab-separated columns, got {len(row)}")
            try:
                v = {c: (row[i] if c in ("path", "experts") else int(row[i])) for i, c in enumerate(LOG_COLUMNS)}
                experts = tuple(int(x) for x in v["experts"].split(",") if x)
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: {exc}") from None
            if v["path"] not in ("cache", "native"):
                raise ValueError(f"{path}:{n}: column path: expected cache or native, got {v['path']!r}")
            out.append(LogLine(v["pass"], v["pos0"], v["n_tokens"], v["rows"], v["layer"], v["pool"], v["path"],
                               CacheCounts(v["hits"], v["misses"], v["evictions"], v["admissions"]), experts))
    return out


@dataclass(frozen=True)
class PlanPools:
    """The pools a plan gives the engine: each layer's pool and each pool's experts in slot order."""

    layer_pool: dict[int, int]
    warm: list[list[tuple[int, int]]]

    @classmethod
    def from_plan(cls, plan: dict) -> "PlanPools":
        """Pools as the engine forms them: per plan GPU, one per expert size, numbered in first-use order."""
        eb = plan["model"]["expert_bytes"]
        pool_of: dict[tuple[int, int], int] = {}
        layer_pool: dict[int, int] = {}
        for g in sorted(plan["gpus"], key=lambda g: g["gpu"]):
            for l in g["layers"]:
                if eb[l] == 0:
                    continue
                layer_pool[l] = pool_of.setdefault((g["gpu"], eb[l]), len(pool_of))
        warm: list[list[tuple[int, int]]] = [[] for _ in pool_of]
        for g in sorted(plan["gpus"], key=lambda g: g["gpu"]):
            for l, e in g["slots"]:
                warm[layer_pool[l]].append((int(l), int(e)))
        return cls(layer_pool, warm)

    def resident_mask(self, n_layer: int, n_expert: int) -> np.ndarray:
        hot = np.zeros((n_layer, n_expert), dtype=bool)
        for keys in self.warm:
            for l, e in keys:
                hot[l, e] = True
        return hot


def served(policy: str, n_tokens: int, max_pass: int = 32) -> bool:
    """Whether a pass of n_tokens uses the pool: lru up to max_pass tokens, decay single tokens only."""
    if policy == "lru":
        return n_tokens <= max_pass
    if policy == "decay":
        return n_tokens == 1
    raise ValueError(f"cache policy {policy!r}: expected lru or decay")


def replay_log(lines: list[LogLine], policy: str, pools: PlanPools, n_layer: int, n_expert: int, *,
               max_pass: int = 32, decay: float = 0.95, hysteresis: float = 0.25, admit: int = 1) -> list[LogLine]:
    """The log the rules give for the experts of `lines`: same passes and experts, the reference's counts and
    paths. Compare with `lines` to check the engine's decisions."""
    out = []
    lru = [LruCache(len(w), w) for w in pools.warm] if policy == "lru" else []
    dec = DecayCache(pools.resident_mask(n_layer, n_expert), decay, hysteresis, admit) if policy == "decay" else None
    swapped: set[int] = set()
    last_pass = None
    for ln in lines:
        path = "cache" if served(policy, ln.n_tokens, max_pass) else "native"
        if path == "native" or ln.path == "native":
            out.append(LogLine(ln.pass_, ln.pos0, ln.n_tokens, ln.rows, -1, -1, path, CacheCounts(), ()))
            continue
        pool = pools.layer_pool.get(ln.layer, -1)
        if policy == "lru":
            counts = lru[pool].serve(ln.layer, list(ln.experts))
        else:
            if ln.pass_ != last_pass:
                swapped = dec.boundary()
            counts = dec.record(ln.layer, list(ln.experts), ln.layer in swapped)
        last_pass = ln.pass_
        out.append(LogLine(ln.pass_, ln.pos0, ln.n_tokens, ln.rows, ln.layer, pool, path, counts, ln.experts))
    return out
