"""Borrowed memory (`--residency-borrow`), as the engine runs it, in plain Python.

In decode the upload path's staging area (one layer's experts per pool) is idle, so the engine lends up to `slots` of
it per pool to the cold experts the CPU computes most (engine/README.md, "Borrowed memory"):

- every route of a plan-cold expert that a split-path pass computes on the CPU adds 1 to its score; in a decode step a
  route on a borrowed expert is a hit instead;
- at each decode step's token boundary the copies queued at the last boundary join the tables (the engine waits for
  them), every score is multiplied by `decay`, and up to `admit` copies per pool are queued: the highest-scored cold
  experts no slot holds (ties: lower layer, lower expert), each into the lowest free slot or in place of the
  lowest-scored borrowed expert in the tables (the lowest slot among equals) when it scores more than
  `1 + margin` times as much; the first candidate that does not stops the pool's queue;
- an upload pass takes every slot back first.

`BorrowedSlots` follows the same rules with the same arithmetic (double-precision scores), so its counters equal the
engine's GET /residency counters for the same passes and routes (`tests/test_residency_engine.py` compares them on the
CPU build).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class BorrowParams:
    """The engine's flags: `--residency-borrow`, `-decay`, `-margin`, `-admit`."""

    slots: int                 # borrowed slots per pool (at most the pool's experts per layer)
    decay: float = 0.95
    margin: float = 0.25
    admit: int = 4

    def __post_init__(self) -> None:
        if self.slots < 0 or not 0.0 < self.decay <= 1.0 or not self.margin >= 0.0 or self.admit < 1:
            raise ValueError(f"borrow parameters: expected slots >= 0, decay in (0, 1], margin >= 0 and admit >= 1, "
                             f"got {self}")


@dataclass
class BorrowCounts:
    """The engine's `borrow` counters (GET /residency) that follow from the routing alone."""

    admissions: int = 0
    evictions: int = 0
    reclaimed: int = 0
    reclaim_passes: int = 0
    steps: int = 0
    steps_hit: int = 0
    hits: int = 0
    cpu_routes: int = 0
    active: int = 0


@dataclass
class BorrowedSlots:
    """The borrowed slots of every pool. `hot[layer, expert]`: resident in the plan; `layer_pool[layer]`: the layer's
    pool, -1 without one (a single-GPU plan of equal-sized layers has one pool, 0)."""

    hot: np.ndarray
    layer_pool: list[int]
    params: BorrowParams
    counts: BorrowCounts = field(default_factory=BorrowCounts)

    def __post_init__(self) -> None:
        n_layer, self.n_expert = self.hot.shape
        n_pool = max(self.layer_pool) + 1 if self.layer_pool else 0
        n = min(self.params.slots, self.n_expert)
        self.score = np.zeros((n_layer, self.n_expert))
        self.slot_key: list[list[tuple[int, int] | None]] = [[None] * n for _ in range(n_pool)]
        self.active: dict[tuple[int, int], int] = {}   # (layer, expert) -> slot, in the tables
        self.taken: dict[tuple[int, int], int] = {}    # (layer, expert) -> slot, in any state
        self.loading: list[tuple[int, int]] = []       # (pool, slot) queued at the last boundary
        self._hit_step = 0
        # the same as masks, and each pool's layers (vectorized scans: a session has thousands of steps)
        self.active_mask = np.zeros_like(self.hot, dtype=bool)
        self.taken_mask = np.zeros_like(self.hot, dtype=bool)
        lp = np.asarray(self.layer_pool)
        self._pool_layers = [np.nonzero(lp == ip)[0] for ip in range(n_pool)]

    def record(self, layer: int, experts, decode: bool) -> None:
        """One layer's routes of a split-path pass (every route, in any order)."""
        e = np.asarray(experts, dtype=np.int64).ravel()
        cold = e[~self.hot[layer, e]]
        on = self.active_mask[layer, cold] if decode else np.zeros(cold.shape, dtype=bool)
        n_hit = int(on.sum())
        self.counts.hits += n_hit
        cpu = cold[~on]
        np.add.at(self.score[layer], cpu, 1.0)  # one addition per route, as the engine adds them
        self.counts.cpu_routes += int(cpu.size)
        hit = n_hit > 0
        if hit and self._hit_step != self.counts.steps:
            self._hit_step = self.counts.steps
            self.counts.steps_hit += 1

    def boundary(self) -> None:
        """A decode step's token boundary, before the step computes."""
        self.counts.steps += 1
        for ip, s in self.loading:
            self.active[self.slot_key[ip][s]] = s
            self.active_mask[self.slot_key[ip][s]] = True
            self.counts.admissions += 1
            self.counts.active += 1
        active_slots = {(self.layer_pool[l], s) for (l, _), s in self.active.items()}
        self.loading = []
        self.score *= self.params.decay
        for ip, keys in enumerate(self.slot_key):
            if not keys:
                continue
            rows = self._pool_layers[ip]
            sub = self.score[rows]
            li, ei = np.nonzero((sub > 0.0) & ~self.hot[rows] & ~self.taken_mask[rows])
            sc_all = sub[li, ei]
            order = np.lexsort((ei, rows[li], -sc_all))[: self.params.admit]  # score down, then layer, expert up
            for i in order.tolist():
                sc, l, e = float(sc_all[i]), int(rows[li[i]]), int(ei[i])
                slot = next((s for s, k in enumerate(keys) if k is None), None)
                if slot is None:
                    low = None
                    for s, k in enumerate(keys):
                        if (ip, s) in active_slots and (low is None or self.score[k] < self.score[keys[low]]):
                            low = s
                    if low is None or not sc > (1.0 + self.params.margin) * self.score[keys[low]]:
                        break
                    old = keys[low]
                    del self.active[old], self.taken[old]
                    self.active_mask[old] = self.taken_mask[old] = False
                    active_slots.discard((ip, low))
                    self.counts.evictions += 1
                    self.counts.active -= 1
                    slot = low
                keys[slot] = (l, e)
                self.taken[(l, e)] = slot
                self.taken_mask[l, e] = True
                self.loading.append((ip, slot))

    def reclaim(self) -> None:
        """An upload pass: every slot back, in the tables or being copied."""
        n = sum(k is not None for keys in self.slot_key for k in keys)
        for keys in self.slot_key:
            keys[:] = [None] * len(keys)
        self.active.clear()
        self.taken.clear()
        self.active_mask[:] = False
        self.taken_mask[:] = False
        self.loading = []
        if n:
            self.counts.reclaimed += n
            self.counts.reclaim_passes += 1
        self.counts.active = 0


def plan_pools(gpu_layers: list[list[int]], expert_bytes: list[int]) -> list[int]:
    """A plan's layers -> pool, one pool per plan GPU for its layers with routed experts (the engine makes one per GPU
    and expert size; the models here have one expert size), -1 for the others."""
    pool = [-1] * len(expert_bytes)
    for g, layers in enumerate(gpu_layers):
        for l in layers:
            if expert_bytes[int(l)] > 0:
                pool[int(l)] = g
    return pool


def run_pass(slots: BorrowedSlots, ids: np.ndarray, a: int, n: int, moe: list[int], upload_min: int) -> int:
    """One forward pass of n tokens from position a, as the engine takes it: `upload_min` tokens or more take the
    upload path (every slot back), one token is a decode step (a token boundary, then its routes may hit), more are
    a split-path prefill (every row counts: the engine's last layer computes only the pass's output rows). Returns
    the plan-cold routes of a decode step (0 otherwise)."""
    if n >= upload_min:
        slots.reclaim()
        return 0
    if n == 1:
        slots.boundary()
        cold = 0
        for l in moe:
            cold += int((~slots.hot[l, ids[a, l]]).sum())
            slots.record(l, ids[a, l], decode=True)
        return cold
    for l in moe:
        slots.record(l, ids[a:a + n, l], decode=False)
    return 0


def replay_session(slots: BorrowedSlots, requests, ids: np.ndarray, moe: list[int], upload_min: int,
                   ubatch: int) -> int:
    """Run one session's passes through `slots` as the engine runs them: each request prefills its new tokens in
    passes of at most `ubatch` (a pass of `upload_min` or more takes the upload path and takes every slot back; a
    single-token pass is a token boundary, as a decode step), then decodes n_output - 1 steps (a token boundary
    each). Positions follow the session's stream (a request's new tokens, then its outputs); every row of a prefill
    pass counts (the engine's last layer computes only the pass's output rows). Returns the plan-cold routes of the
    single-token passes."""
    pos, cold = 0, 0
    for q in requests:
        a = pos
        for n in [ubatch] * (q.n_new // ubatch) + ([q.n_new % ubatch] if q.n_new % ubatch else []):
            cold += run_pass(slots, ids, a, n, moe, upload_min)
            a += n
        pos += q.n_new
        for i in range(max(q.n_output - 1, 0)):
            cold += run_pass(slots, ids, pos + i, 1, moe, upload_min)
        pos += q.n_output
    return cold


def _tune_point(sessions: list[tuple[str, list]], routing: dict[str, np.ndarray], hot: np.ndarray,
                layer_pool: list[int], params: BorrowParams, upload_min: int, ubatch: int, progress=None) -> dict:
    """One grid point over the sessions, each session from empty slots (`tune`'s row)."""
    moe = [l for l, p in enumerate(layer_pool) if p >= 0]
    tot, cold = BorrowCounts(), 0
    for sid, reqs in sessions:
        s = BorrowedSlots(hot, layer_pool, params)
        cold += replay_session(s, reqs, routing[sid], moe, upload_min, ubatch)
        for k in ("hits", "steps", "steps_hit", "admissions", "evictions", "reclaimed"):
            setattr(tot, k, getattr(tot, k) + getattr(s.counts, k))
        if progress:
            progress(1)
    return {"decay": params.decay, "margin": params.margin, "admit": params.admit, "slots": params.slots,
            "decode_cold_routes": cold, "hits": tot.hits, "hit_share": tot.hits / cold if cold else 0.0,
            "steps": tot.steps, "steps_hit_share": tot.steps_hit / tot.steps if tot.steps else 0.0,
            "admissions": tot.admissions, "evictions": tot.evictions, "reclaimed": tot.reclaimed}


def _tune_points(sessions: list[tuple[str, list]], routing: dict[str, np.ndarray], hot: np.ndarray,
                 layer_pool: list[int], points: list[BorrowParams], upload_min: int, ubatch: int) -> list[dict]:
    """Several grid points in one worker process (the sessions and routing reach it once)."""
    return [_tune_point(sessions, routing, hot, layer_pool, p, upload_min, ubatch) for p in points]


def tune(sessions: list[tuple[str, list]], routing: dict[str, np.ndarray], hot: np.ndarray, layer_pool: list[int],
         slots: int, decays: list[float], margins: list[float], admit: int | list[int], upload_min: int,
         ubatch: int = 512, progress=None, jobs: int = 1) -> list[dict]:
    """Every (decay, margin, admit) over the sessions, each session from empty slots: the share of decode's plan-cold
    routes computed on borrowed experts, of decode steps that computed one, and the copies (the engine's counters,
    summed). Rows in grid order (decay, then margin, then admit). `jobs` > 1: the grid points run in that many
    processes, each taking every jobs-th point; the rows are the same. `progress(n)`: n more sessions replayed."""
    admits = [admit] if isinstance(admit, int) else list(admit)
    points = [BorrowParams(slots, d, m, a) for d in decays for m in margins for a in admits]
    if jobs < 1:
        raise ValueError(f"jobs: expected >= 1, got {jobs}")
    if jobs == 1 or len(points) == 1:
        return [_tune_point(sessions, routing, hot, layer_pool, p, upload_min, ubatch, progress) for p in points]
    from concurrent.futures import ProcessPoolExecutor, as_completed

    n = min(jobs, len(points))
    rows: list[dict | None] = [None] * len(points)
    with ProcessPoolExecutor(max_workers=n) as pool:
        futures = {pool.submit(_tune_points, sessions, routing, hot, layer_pool, points[i::n], upload_min, ubatch): i
                   for i in range(n)}
        for f in as_completed(futures):
            i = futures[f]
            for j, row in zip(range(i, len(points), n), f.result()):
                rows[j] = row
            if progress:
                progress(len(points[i::n]) * len(sessions))
    return rows


def read_tuned(path) -> dict:
    """The parameters `ostinato residency borrow-tune` chose (its JSON's "chosen": slots, decay, margin, admit)."""
    from ostinato.inputs import load_json

    doc = load_json(path, "the JSON of `ostinato residency borrow-tune`")
    if not isinstance(doc, dict) or not isinstance(doc.get("chosen"), dict) or any(
            k not in doc["chosen"] for k in ("slots", "decay", "margin", "admit")):
        raise ValueError(f"{path}: expected `ostinato residency borrow-tune`'s JSON, whose key 'chosen' holds slots, "
                         f"decay, margin and admit")
    return doc["chosen"]


def read_borrow_params(path, n_expert: int) -> BorrowParams:
    """`read_tuned` as the engine applies it to a model of n_expert experts per layer (at most that many slots)."""
    c = read_tuned(path)
    try:
        return BorrowParams(min(int(c["slots"]), n_expert), float(c["decay"]), float(c["margin"]), int(c["admit"]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: chosen: {e}") from e


def net_share(row: dict, admission_cost: float) -> float:
    """What borrowing saves, as a share of decode's plan-cold routes: the routes computed on borrowed experts less
    `admission_cost` routes for every copy (an expert's copy to the GPU, in units of a cold route's time on the CPU)."""
    cold = row["decode_cold_routes"]
    return (row["hits"] - admission_cost * row["admissions"]) / cold if cold else 0.0


def choose(grid: list[dict], admission_cost: float = 0.0) -> dict:
    """The grid row that saves the most, `net_share` (ties: the first in grid order); with no admission cost, the
    largest hit share. Every copy costs: on the H200 the copies lengthened the decode step while it ran, so parameters
    that buy a few more borrowed routes with many more copies made decode slower (data/reference/h200/borrow/)."""
    best = max(grid, key=lambda r: net_share(r, admission_cost))
    return {**{k: best[k] for k in ("decay", "margin", "admit", "slots", "hit_share", "steps_hit_share")},
            "admissions_per_step": best["admissions"] / best["steps"] if best["steps"] else 0.0,
            "admission_cost": admission_cost, "net_share": net_share(best, admission_cost)}
