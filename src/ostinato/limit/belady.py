"""The cache limit of seed 004: Belady's MIN with bypass on a routing trace gives the fewest host expert reads
that any GPU expert cache of a given size could make; at a probed host read rate this lower-bounds decode time.

Requests are the (layer, expert) selections of each decode position, in position, layer, k order. On a
miss the expert is read from host memory once; MIN then admits it (evicting the cached expert used
furthest in the future) only when it is used again before that one, and otherwise bypasses the cache.
Oracle variants (seed 004): "MIN's set, read once" = misses; "MIN's set, read twice" = misses +
admissions (an admitted miss is read by the CPU and again by the copy into the cache).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LimitResult:
    """Counts of one MIN-with-bypass run and the derived read totals."""

    n_positions: int
    requests: int
    hits: int
    misses: int
    admissions: int
    bypasses: int

    @property
    def reads_once(self) -> int:
        """Host reads when each miss is read once (MIN's set, read once): the lower bound."""
        return self.misses

    @property
    def reads_twice(self) -> int:
        """Host reads when each admitted miss is read twice (MIN's set, read twice)."""
        return self.misses + self.admissions

    def decode_ms_per_token(self, expert_bytes: float, read_bytes_per_ms: float, twice: bool = False,
                            other_ms_per_token: float = 0.0) -> float:
        """Lower bound on decode time per token: host reads x bytes / read rate (+ non-expert time)."""
        reads = self.reads_twice if twice else self.reads_once
        return reads / max(self.n_positions, 1) * expert_bytes / read_bytes_per_ms + other_ms_per_token


def request_keys(ids: np.ndarray, n_expert: int, none_id: int | None = None) -> np.ndarray:
    """Flatten ids [n_pos, n_layer, k] to keys layer * n_expert + expert in request order, dropping "none" ids."""
    ids = np.asarray(ids).astype(np.int64)
    lay = np.arange(ids.shape[1], dtype=np.int64)[None, :, None]
    keys = (lay * n_expert + ids).reshape(-1)
    flat = ids.reshape(-1)
    keep = (flat >= 0) & (flat < n_expert) if none_id is None else (flat != none_id)
    return keys[keep]


def next_use(keys: np.ndarray) -> np.ndarray:
    """For each request, the index of the next request of the same key (len(keys) if none)."""
    n = keys.size
    order = np.argsort(keys, kind="stable")
    nxt = np.full(n, n, dtype=np.int64)
    same = keys[order[1:]] == keys[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def belady_min_bypass(keys: np.ndarray, capacity: int, initial: np.ndarray | None = None,
                      n_positions: int = 0) -> LimitResult:
    """MIN with bypass on a key sequence for a cache of `capacity` equal-size slots (optionally preloaded)."""
    keys = np.asarray(keys, dtype=np.int64)
    n = keys.size
    nxt = next_use(keys).tolist()
    first: dict[int, int] = {}
    if initial is not None and len(initial):
        uniq, idx = np.unique(keys, return_index=True)
        first = dict(zip(uniq.tolist(), idx.tolist()))
    cache: dict[int, int] = {}      # key -> index of its next use
    heap: list[tuple[int, int]] = []  # (-next_use, key), lazily invalidated
    for k in ([] if initial is None else np.asarray(initial, dtype=np.int64).tolist())[:capacity]:
        cache[k] = first.get(k, n)
        heapq.heappush(heap, (-cache[k], k))
    hits = admissions = bypasses = 0
    for i, k in enumerate(keys.tolist()):
        nu = nxt[i]
        if k in cache:
            hits += 1
            cache[k] = nu
            heapq.heappush(heap, (-nu, k))
            continue
        if nu >= n or capacity <= 0:
            bypasses += 1
            continue
        if len(cache) < capacity:
            cache[k] = nu
            heapq.heappush(heap, (-nu, k))
            admissions += 1
            continue
        while True:  # the cached key used furthest in the future (skip stale heap entries)
            neg, victim = heap[0]
            if cache.get(victim) == -neg:
                break
            heapq.heappop(heap)
        if nu < -neg:
            heapq.heappop(heap)
            del cache[victim]
            cache[k] = nu
            heapq.heappush(heap, (-nu, k))
            admissions += 1
        else:
            bypasses += 1
        if len(heap) > 4 * capacity + 64:  # keep the lazy heap small
            heap = [(-v, key) for key, v in cache.items()]
            heapq.heapify(heap)
    return LimitResult(n_positions, n, hits, n - hits, admissions, bypasses)


def limit_for_trace(ids: np.ndarray, n_expert: int, capacity: int, per_layer: bool = False,
                    none_id: int | None = None, initial_hot: np.ndarray | None = None) -> LimitResult:
    """MIN with bypass for ids [n_pos, n_layer, k]: one cache shared by all layers, or `capacity` slots per layer."""
    ids = np.asarray(ids)
    n_pos, n_layer = ids.shape[0], ids.shape[1]
    if not per_layer:
        init = None if initial_hot is None else np.flatnonzero(np.asarray(initial_hot).reshape(-1))
        r = belady_min_bypass(request_keys(ids, n_expert, none_id), capacity, init, n_pos)
        return r
    tot = np.zeros(5, dtype=np.int64)
    for il in range(n_layer):
        init = None if initial_hot is None else il * n_expert + np.flatnonzero(initial_hot[il])
        r = belady_min_bypass(request_keys(ids[:, il:il + 1, :], n_expert, none_id) + il * n_expert, capacity,
                              init, n_pos)
        tot += [r.requests, r.hits, r.misses, r.admissions, r.bypasses]
    return LimitResult(n_pos, *map(int, tot))


def lru_reads(keys: np.ndarray, capacity: int) -> LimitResult:
    """A deployed-style reference: LRU that admits every miss (for comparison with the MIN bound)."""
    from collections import OrderedDict
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for k in np.asarray(keys, dtype=np.int64).tolist():
        if k in cache:
            hits += 1
            cache.move_to_end(k)
        elif capacity > 0:
            if len(cache) >= capacity:
                cache.popitem(last=False)
            cache[k] = None
    n = int(np.asarray(keys).size)
    miss = n - hits
    return LimitResult(0, n, hits, miss, miss if capacity > 0 else 0, 0 if capacity > 0 else miss)
