"""Capacity test: llama.cpp's default layer split and a memory model of the engine -> expert slots per GPU.

Per GPU j (bytes), with L_j the layers that llama.cpp places on j:
  pool_j = total_j - reserved - margin
           - sum_{l in L_j} dense_l                      (non-expert weights; + output head on its GPU)
           - kv_tokens * sum_{l in L_j} kv_per_token_l   (KV cache of the longest development request)
           - (compute_fixed_j + compute_per_token * n_ubatch)   (buffers of the largest forward pass)
           - (staging_experts + zero_slots) * max expert bytes on j   (upload staging, one zero slot per position)
  slots_j = floor(max(pool_j, 0) / expert_bytes)       (one size; two sizes: the planner splits pool_j)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ostinato.errors import InputError
from ostinato.inputs import parse_json


def split_layers(n_layer: int, free_bytes: Sequence[float], n_gpu_layers: int | None = None) -> np.ndarray:
    """Device of layers 0..n_layer (index n_layer is the output layer), -1 = CPU, as llama.cpp b11312 assigns them.

    llama-model.cpp: splits = prefix sums of the devices' free memory (float), normalised; i_gpu_start =
    max(n_layer + 1 - ngl, 0); act = min(ngl, n_layer + 1); layer il on the CPU if il < i_gpu_start, else
    on device upper_bound(splits, float(il - i_gpu_start) / act).
    """
    free = np.asarray(free_bytes, dtype=np.float32)
    if free.size == 0:
        return np.full(n_layer + 1, -1)
    ngl = n_layer + 1 if n_gpu_layers is None else n_gpu_layers
    splits = np.cumsum(free, dtype=np.float32)
    splits = (splits / splits[-1]).astype(np.float32)
    i_gpu_start = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1)
    out = np.full(n_layer + 1, -1)
    for il in range(n_layer + 1):
        if il < i_gpu_start or il - i_gpu_start >= act:
            continue
        x = np.float32(il - i_gpu_start) / np.float32(act)
        out[il] = min(int(np.searchsorted(splits, x, side="right")), free.size - 1)
    return out


@dataclass(frozen=True)
class MemoryModel:
    """Terms of the engine's GPU memory use (bytes); per-layer arrays cover all n_layer blocks."""

    gpu_total_bytes: tuple[int, ...]
    dense_bytes: tuple[int, ...]            # non-expert weights of each layer (attention, norms, router, shared experts)
    expert_bytes: tuple[int, ...]           # bytes of one routed expert of each layer (0: no routed experts)
    kv_bytes_per_token: tuple[int, ...]     # KV cache bytes per token of each layer
    kv_tokens: int                          # longest development request, tool definitions included
    output_bytes: int = 0                   # output head + final norm, on the output layer's GPU
    compute_fixed_bytes: tuple[int, ...] = ()   # per GPU: compute buffers independent of the batch
    compute_bytes_per_token: int = 0        # compute buffers per token of the largest forward pass
    n_ubatch: int = 2048                    # tokens of the largest forward pass
    staging_experts: int = 0                # upload-path staging buffer, in experts (largest on the GPU)
    zero_slots: int = 0                     # zero slots per GPU (one per top-k position)
    margin_bytes: int = 0                   # fixed margin kept free on every GPU
    reserved_bytes: int = 0                 # CUDA context and allocator slack per GPU
    split_free_bytes: tuple[int, ...] = ()  # memory llama.cpp sees free when splitting (default: totals)
    n_gpu_layers: int | None = None

    def __post_init__(self) -> None:
        """Check that the per-layer arrays agree."""
        n = len(self.dense_bytes)
        if len(self.expert_bytes) != n or len(self.kv_bytes_per_token) != n:
            raise ValueError("dense_bytes, expert_bytes and kv_bytes_per_token need one entry per layer")
        if self.compute_fixed_bytes and len(self.compute_fixed_bytes) != len(self.gpu_total_bytes):
            raise ValueError("compute_fixed_bytes needs one entry per GPU")

    @property
    def n_layer(self) -> int:
        return len(self.dense_bytes)

    @property
    def n_gpu(self) -> int:
        return len(self.gpu_total_bytes)


@dataclass
class Capacity:
    """Result of the capacity test: layer devices, the budget terms per GPU and the pool bytes/slots."""

    layer_gpu: list[int]            # device of each layer, then of the output layer (-1 = CPU)
    terms: list[dict[str, int]]     # per GPU: every term of the formula
    pool_bytes: list[int]
    slots: list[int]                # pool_bytes // largest expert size on the GPU (exact for one size)
    expert_bytes: list[int] = field(default_factory=list)  # per layer, for the planner
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, text: str, where: str = "capacity JSON") -> Capacity:
        """Inverse of to_json; a document that is not one is an InputError naming `where` (the file)."""
        doc = parse_json(text, where, "a capacity test's JSON (`ostinato residency capacity`)")
        try:
            return cls(**doc)
        except TypeError as exc:
            raise InputError(f"{where}: not a capacity test's JSON ({exc})") from None

    def to_json(self) -> str:
        """The result as indented JSON."""
        return json.dumps(asdict(self), indent=2)


def capacity_test(m: MemoryModel) -> Capacity:
    """Apply the memory model: pool bytes and expert slots of each GPU."""
    free = m.split_free_bytes or m.gpu_total_bytes
    dev = split_layers(m.n_layer, free, m.n_gpu_layers)
    dense = np.asarray(m.dense_bytes, dtype=np.int64)
    kv = np.asarray(m.kv_bytes_per_token, dtype=np.int64) * int(m.kv_tokens)
    eb = np.asarray(m.expert_bytes, dtype=np.int64)
    terms, pools, slots, notes = [], [], [], []
    if m.kv_tokens <= 0:
        notes.append("kv_tokens is 0: no KV cache reserved (give the longest development request)")
    for j in range(m.n_gpu):
        on = dev[: m.n_layer] == j
        largest = int(eb[on].max()) if np.any(on & (eb > 0)) else 0
        t = {
            "total": int(m.gpu_total_bytes[j]),
            "reserved": int(m.reserved_bytes),
            "margin": int(m.margin_bytes),
            "dense": int(dense[on].sum()) + (int(m.output_bytes) if dev[m.n_layer] == j else 0),
            "kv": int(kv[on].sum()),
            "compute": int((m.compute_fixed_bytes[j] if m.compute_fixed_bytes else 0)
                           + m.compute_bytes_per_token * m.n_ubatch),
            "staging_and_zero_slots": int((m.staging_experts + m.zero_slots) * largest),
        }
        pool = t["total"] - sum(v for k, v in t.items() if k != "total")
        if pool < 0:
            notes.append(f"GPU {j}: {-pool} bytes short before any expert slot; the longest request does not fit")
        pool = max(pool, 0)
        terms.append(t)
        pools.append(pool)
        slots.append(pool // largest if largest else 0)
    return Capacity([int(x) for x in dev], terms, pools, slots, [int(x) for x in eb], notes)


def _per_layer(v, n: int, name: str) -> tuple[int, ...]:
    if isinstance(v, (int, float)):
        return (int(float(v)),) * n
    if len(v) != n:
        raise ValueError(f"{name}: {len(v)} entries, expected {n} (or one number for all layers)")
    return tuple(int(float(x)) for x in v)


def memory_model_from_dict(d: dict) -> MemoryModel:
    """Build a MemoryModel from YAML: per-layer keys take one number or a list; see the module doc."""
    n = int(d["n_layer"])
    n_gpu = len(d["gpu_total_bytes"])
    cf = d.get("compute_fixed_bytes", 0)
    return MemoryModel(
        gpu_total_bytes=tuple(int(float(x)) for x in d["gpu_total_bytes"]),
        dense_bytes=_per_layer(d["dense_bytes"], n, "dense_bytes"),
        expert_bytes=_per_layer(d["expert_bytes"], n, "expert_bytes"),
        kv_bytes_per_token=_per_layer(d["kv_bytes_per_token"], n, "kv_bytes_per_token"),
        kv_tokens=int(d.get("kv_tokens", 0)),
        output_bytes=int(float(d.get("output_bytes", 0))),
        compute_fixed_bytes=(int(float(cf)),) * n_gpu if isinstance(cf, (int, float)) else tuple(int(float(x)) for x in cf),
        compute_bytes_per_token=int(float(d.get("compute_bytes_per_token", 0))),
        n_ubatch=int(d.get("n_ubatch", 2048)),
        staging_experts=int(d.get("staging_experts", 0)),
        zero_slots=int(d.get("zero_slots", 0)),
        margin_bytes=int(float(d.get("margin_bytes", 0))),
        reserved_bytes=int(float(d.get("reserved_bytes", 0))),
        split_free_bytes=tuple(int(float(x)) for x in d.get("split_free_bytes", ())),
        n_gpu_layers=d.get("n_gpu_layers"),
    )


def load_memory_model(path: str | os.PathLike) -> MemoryModel:
    """Read a memory-model YAML file."""
    with open(Path(path), encoding="utf-8") as f:
        return memory_model_from_dict(yaml.safe_load(f))


def longest_request_tokens(sessions_jsonl: str | os.PathLike) -> int:
    """Most tokens any request of a sessions file holds in the KV cache: earlier turns + new + output tokens."""
    from ostinato.sessions.model import iter_session_counts

    best = 0
    for _, counts in iter_session_counts(sessions_jsonl):
        ctx = 0
        for _, n_new, n_output in counts:
            best = max(best, ctx + n_new + n_output)
            ctx += n_new + n_output
    return best
