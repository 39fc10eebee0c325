"""Replay one session through a policy's cost model, request by request: prefill passes, then decode steps.

Token positions of a session follow its concatenated stream: request i's new tokens, then its outputs.
Request i prefills its n_new tokens (the KV cache holds everything before) in passes of <= n_ubatch tokens
(and the last checkpoint_tail tokens separately); its first token ends the prefill (TTFT); then
n_output - 1 decode steps each feed one output token (TPOT = decode / (n_output - 1)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ostinato.costmodel.decode import LayerCosts, cold_routes
from ostinato.residency.borrow import BorrowedSlots
from ostinato.residency.caches import DecayCache, LruCache
from ostinato.sim.params import SimParams
from ostinato.sim.policies import Policy


@dataclass(frozen=True)
class Request:
    """One request of a session: kind (first | tool | user), new tokens, output tokens."""

    kind: str
    n_new: int
    n_output: int


def pass_sizes(n_new: int, p: SimParams) -> list[int]:
    """Forward passes of a prefill: chunks of n_ubatch, with the checkpoint tail split off."""
    tail = min(p.checkpoint_tail, n_new - 1) if p.checkpoint_tail and n_new > 1 else 0
    head = n_new - tail
    out = [p.n_ubatch] * (head // p.n_ubatch) + ([head % p.n_ubatch] if head % p.n_ubatch else [])
    return out + ([tail] if tail else [])


def _distinct(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Distinct experts per layer among ids [n, n_layer, k] that mask [n_layer, n_expert] selects."""
    n_layer, n_expert = mask.shape
    seen = np.zeros((n_layer, n_expert), dtype=bool)
    lay = np.broadcast_to(np.arange(n_layer)[None, :, None], ids.shape)
    seen[lay.reshape(-1), ids.reshape(-1)] = True
    return (seen & mask).sum(axis=1)


class _State:
    """Mutable cache state of one run (dynamic policies): the engine's own rules (ostinato.residency.caches)."""

    def __init__(self, pol: Policy, n_layer: int, n_expert: int, p: SimParams) -> None:
        self.hot = np.zeros((n_layer, n_expert), dtype=bool) if pol.hot is None else pol.hot.copy()
        if pol.residency == "layers":
            self.hot[:] = np.asarray(pol.gpu_layers)[:, None]
        self.lru: dict[int, LruCache] = {}
        if pol.residency == "lru":
            # one cache per device, filled with the plan's experts in plan order (layer, then expert), as the engine
            dev = np.zeros(n_layer, dtype=int) if pol.layer_device is None else np.asarray(pol.layer_device)
            for d in sorted(set(dev.tolist())):
                warm = [(int(l), int(e)) for l, e in np.argwhere(self.hot & (dev == d)[:, None])]
                slots = len(warm) if pol.cache_slots is None else pol.cache_slots
                self.lru[d] = LruCache(slots, warm[len(warm) - min(slots, len(warm)):])
            self.layer_device = dev
        self.decay = (DecayCache(self.hot, p.buun_decay, p.buun_hysteresis, p.buun_admit)
                      if pol.residency == "decay" else None)
        self.score = self.hot.astype(float) * 1.0
        self.borrowed = np.zeros((n_layer, n_expert), dtype=bool)
        self.admissions = 0
        self.upload_budget = 0.0        # experts the PCIe link could have copied in the background so far
        # the engine's borrowed memory (ostinato-borrow): its slots, and the copy time queued at the last boundary
        # that the step after it did not cover (the next boundary, or an upload pass, waits for it)
        self.slots: BorrowedSlots | None = None
        if pol.borrow is not None:
            dev = np.zeros(n_layer, dtype=int) if pol.layer_device is None else np.asarray(pol.layer_device)
            self.slots = BorrowedSlots(self.hot.copy(), [int(d) for d in dev], pol.borrow)
        self.copy_left_ms = 0.0


def _prefill_pass_ms(ids: np.ndarray, pol: Policy, st: _State, c: LayerCosts, p: SimParams) -> float:
    """Time of one prefill forward pass of ids [n, n_layer, k]."""
    n, n_layer, k = ids.shape
    base = p.prefill_pass_ms + p.prefill_token_ms * n
    if st.slots is not None:
        base += _borrow_prefill(ids, st, n >= p.upload_min and not pol.no_upload)
    if pol.residency == "lru" and n <= p.cache_max_pass:
        return base + _lru_pass_ms(ids, st, pol, c, p, decode=False)
    # experts the GPU holds for this pass: whole layers, or resident experts on the size-dependent paths;
    # native prefill (and caches on passes they do not serve) treats every routed expert as cold
    uses_hot = pol.residency == "layers" or pol.prefill == "paths"
    hot = st.hot if uses_hot else np.zeros_like(st.hot)
    r = cold_routes(ids, hot).sum(axis=0)
    routes = n * k
    if n >= p.upload_min and not pol.no_upload:
        u = _distinct(ids, ~hot)
        return (base + (p.upload_pass_ms if u.sum() else 0.0)
                + float(np.sum(p.upload_expert_ms * u + p.gpu_route_ms * routes)))
    return base + float(np.sum(np.where(r > 0, p.cpu_layer_ms, 0.0) + p.cpu_route_ms * r
                               + p.gpu_route_ms * (routes - r)))


def _borrow_prefill(ids: np.ndarray, st: _State, upload: bool) -> float:
    """A prefill pass with the engine's borrowed memory: an upload pass waits for the copy in flight and takes every
    slot back; a split-path pass computes borrowed experts on the CPU and scores every plan-cold route (a
    single-token pass is a token boundary, as a decode step, but its cost stays a prefill pass's). Returns the wait."""
    slots = st.slots
    n, n_layer, _ = ids.shape
    wait, st.copy_left_ms = st.copy_left_ms, 0.0
    if upload:
        slots.reclaim()
        return wait
    if n == 1:
        slots.boundary()
    for il in range(n_layer):
        if slots.layer_pool[il] >= 0:
            slots.record(il, ids[:, il, :], decode=n == 1)
    return wait if n == 1 else 0.0


def _lru_pass_ms(ids: np.ndarray, st: _State, pol: Policy, c: LayerCosts, p: SimParams, decode: bool) -> float:
    """LRU expert cache on a pass <= cache_max_pass tokens: misses uploaded into the cache, all on the GPU."""
    n, n_layer, k = ids.shape
    t = 0.0
    for il in range(n_layer):
        experts = list(dict.fromkeys(ids[:, il, :].reshape(-1).tolist()))
        misses = st.lru[int(st.layer_device[il])].serve(il, experts).misses
        t += ((p.upload_pass_ms if misses else 0.0) + p.upload_expert_ms * misses
              + (c.gpu[il] if decode else p.gpu_route_ms * n * k))
    return t


def _decode_ms(ids: np.ndarray, pol: Policy, st: _State, c: LayerCosts, p: SimParams) -> np.ndarray:
    """Time of each decode step of ids [n_step, n_layer, k] (static policies vectorised)."""
    n_step = ids.shape[0]
    if n_step == 0:
        return np.zeros(0)
    if pol.residency == "static" and st.slots is not None:
        return _engine_borrow_decode_ms(ids, pol, st, c, p)
    if pol.residency == "static" and pol.borrowed_slots > 0:
        return _borrowed_decode_ms(ids, pol, st, c, p)
    if pol.residency == "static":
        r = cold_routes(ids, st.hot)
        cpu = c.cpu(r)
        lay = np.maximum(cpu, c.gpu) if pol.decode_overlap else cpu + c.gpu
        return p.decode_other_ms + pol.decode_delta_ms + lay.sum(axis=1)
    if pol.residency == "layers":
        k = ids.shape[2]
        on_gpu = np.asarray(pol.gpu_layers, dtype=bool)
        per_layer = np.where(on_gpu, c.gpu, c.alpha + c.beta * k)
        return np.full(n_step, p.decode_other_ms + pol.decode_delta_ms + per_layer.sum())
    if pol.residency == "lru":
        return np.array([p.decode_other_ms + pol.decode_delta_ms + _lru_pass_ms(ids[i:i + 1], st, pol, c, p, decode=True)
                         for i in range(n_step)])
    return _decay_decode_ms(ids, pol, st, c, p)


def _decay_decode_ms(ids: np.ndarray, pol: Policy, st: _State, c: LayerCosts, p: SimParams) -> np.ndarray:
    """buun: misses on the CPU (overlapped), swaps by decaying access counts at each token boundary (DecayCache),
    each admission a GPU wait of bg_admit_ms."""
    n_step, n_layer, k = ids.shape
    out = np.empty(n_step)
    dc = st.decay
    for i in range(n_step):
        row = ids[i]
        swapped = dc.boundary()
        for il in range(n_layer):
            dc.record(il, list(dict.fromkeys(row[il].tolist())), il in swapped)
        r = (~dc.resident[np.arange(n_layer)[:, None], row]).sum(axis=1)
        cpu = c.cpu(r)
        t = np.maximum(cpu, c.gpu) if pol.decode_overlap else cpu + c.gpu
        st.admissions += len(swapped)
        out[i] = p.decode_other_ms + pol.decode_delta_ms + float(t.sum()) + p.bg_admit_ms * len(swapped)
    return out


def _accrue_uploads(st: _State, step_ms: float, p: SimParams) -> None:
    """Background uploads are limited by the link: a step of step_ms adds step_ms / upload_expert_ms experts of
    budget (capped at max_upload_backlog); each admission spends one."""
    st.upload_budget = min(st.upload_budget + step_ms / (p.upload_expert_ms + p.upload_pass_ms), p.max_upload_backlog)


def _borrowed_decode_ms(ids: np.ndarray, pol: Policy, st: _State, c: LayerCosts, p: SimParams) -> np.ndarray:
    """Static pool plus one pool of borrowed slots: cold experts used by decode gain decaying scores; one background
    admission per step (the top-scored cold expert, replacing the lowest-scored borrowed one when it scores clearly
    higher) that serves from the next step on."""
    n_step, n_layer, k = ids.shape
    out = np.empty(n_step)
    rows = np.arange(n_layer)[:, None]
    for i in range(n_step):
        row = ids[i]
        on_gpu = (st.hot | st.borrowed)[rows, row]
        cpu = c.cpu((~on_gpu).sum(axis=1))
        t = np.maximum(cpu, c.gpu) if pol.decode_overlap else cpu + c.gpu
        st.score *= p.buun_decay
        cold_l, cold_j = np.nonzero(~on_gpu)
        np.add.at(st.score, (cold_l, row[cold_l, cold_j]), 1.0)
        admitted = 0
        step = p.decode_other_ms + pol.decode_delta_ms + float(t.sum())
        _accrue_uploads(st, step, p)
        if cold_l.size and st.upload_budget >= 1:
            sc = st.score[cold_l, row[cold_l, cold_j]]
            b = int(sc.argmax())
            cl, ce = int(cold_l[b]), int(row[cold_l[b], cold_j[b]])
            n_b = int(st.borrowed.sum())
            if n_b < pol.borrowed_slots:
                st.borrowed[cl, ce] = True
                admitted = 1
            else:
                bs = np.where(st.borrowed, st.score, np.inf)
                v = np.unravel_index(int(bs.argmin()), bs.shape)
                if sc[b] > bs[v] * (1 + p.buun_hysteresis):
                    st.borrowed[v] = False
                    st.borrowed[cl, ce] = True
                    admitted = 1
        st.admissions += admitted
        st.upload_budget -= admitted
        out[i] = step + p.bg_admit_ms * admitted
    return out


def _engine_borrow_decode_ms(ids: np.ndarray, pol: Policy, st: _State, c: LayerCosts, p: SimParams) -> np.ndarray:
    """The engine's borrowed memory (`ostinato.residency.borrow`): at each token boundary the copies queued at the last
    one join the tables (waiting for what the last step did not cover) and up to `admit` copies per pool are queued;
    the step's CPU branch skips the borrowed experts, and its GPU branch computes them in the pool's own expert
    computation (one G: the staging area's slots follow the pool's in one tensor, engine/README.md)."""
    n_step, n_layer, _ = ids.shape
    out = np.empty(n_step)
    slots = st.slots
    rows = np.arange(n_layer)[:, None]
    moe = [il for il in range(n_layer) if slots.layer_pool[il] >= 0]
    for i in range(n_step):
        row = ids[i]
        wait = st.copy_left_ms
        before = slots.counts.admissions
        slots.boundary()
        on_gpu = (st.hot | slots.active_mask)[rows, row]
        for il in moe:
            slots.record(il, row[il], decode=True)
        cpu = c.cpu((~on_gpu).sum(axis=1))
        gpu = c.gpu
        t = np.maximum(cpu, gpu) if pol.decode_overlap else cpu + gpu
        step = p.decode_other_ms + pol.decode_delta_ms + float(t.sum())
        st.admissions += slots.counts.admissions - before
        st.copy_left_ms = max(0.0, len(slots.loading) * p.upload_expert_ms - step)
        out[i] = wait + step
    return out


def simulate_session(requests: list[Request], ids: np.ndarray, n_expert: int, pol: Policy, c: LayerCosts,
                     p: SimParams) -> list[dict]:
    """Per request: kind, n_new, n_output, prefill_ms, decode_ms, ttft_ms, tpot_ms, total_ms (ids: MoE layers only)."""
    need = sum(r.n_new + r.n_output for r in requests)
    if ids.shape[0] < need:
        raise ValueError(f"routing covers {ids.shape[0]} positions, the session needs {need}")
    ids = np.asarray(ids, dtype=np.int64)
    st = _State(pol, ids.shape[1], n_expert, p)
    rows, pos, prev_out = [], 0, 0
    for q in requests:
        st.borrowed[:] = False          # the paper's borrowed memory is returned before each prefill (the engine's,
                                        # st.slots, only by upload passes)
        pre = 0.0
        extra = prev_out if p.reprefill_output else 0
        a = pos - extra
        for n in pass_sizes(q.n_new + extra, p):
            pre += _prefill_pass_ms(ids[a:a + n], pol, st, c, p)
            a += n
        pos += q.n_new
        steps = max(q.n_output - 1, 0)
        dec = float(_decode_ms(ids[pos:pos + steps], pol, st, c, p).sum())
        pos += q.n_output
        prev_out = q.n_output
        rows.append({"kind": q.kind, "n_new": q.n_new, "n_output": q.n_output, "prefill_ms": pre,
                     "decode_ms": dec, "ttft_ms": pre, "tpot_ms": dec / steps if steps else float("nan"),
                     "total_ms": pre + dec})
    return rows
