"""The residency plan file the engine loads at start-up (JSON, versioned, FNV-1a 64 checksum over the slots).

Format `ostinato-plan` version 1 (spec in docs/planner-and-costmodel.md):
{"format": "ostinato-plan", "version": 1,
 "model": {"name", "n_layer", "n_expert", "n_expert_used", "expert_bytes": [per layer]},
 "gpus": [{"gpu": j, "layers": [l, ...], "pool_bytes": B, "slots": [[layer, expert], ...]}, ...],
 "profile_sha256": "...", "checksum": "fnv1a64:<16 hex>"}
Slot i of GPU j holds expert (layer, expert); slots are sorted by layer, then expert. The checksum is
FNV-1a 64 over little-endian uint32 words: n_layer, n_expert, n_expert_used, n_gpu, then per GPU:
gpu, n_slots, then layer, expert of each slot.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ostinato.atomic import atomic_open

PLAN_FORMAT = "ostinato-plan"
PLAN_VERSION = 1
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


@dataclass
class PlanFile:
    """Contents of a plan file."""

    model_name: str
    n_layer: int
    n_expert: int
    n_expert_used: int
    expert_bytes: list[int]
    gpu_layers: list[list[int]]
    pool_bytes: list[int]
    slots: list[np.ndarray]          # per GPU: int [n, 2] (layer, expert)
    profile_sha256: str = ""
    extra: dict = field(default_factory=dict)

    def hot_mask(self) -> np.ndarray:
        """bool [n_layer, n_expert]: experts resident on some GPU."""
        hot = np.zeros((self.n_layer, self.n_expert), dtype=bool)
        for s in self.slots:
            if len(s):
                hot[s[:, 0], s[:, 1]] = True
        return hot


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64-bit hash (simple to recompute in the engine)."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def plan_checksum(p: PlanFile) -> str:
    """The checksum string over shape and slots, as the format defines it."""
    words = [p.n_layer, p.n_expert, p.n_expert_used, len(p.slots)]
    for j, s in enumerate(p.slots):
        words += [j, len(s)]
        words += np.asarray(s, dtype=np.int64).reshape(-1).tolist()
    return f"fnv1a64:{fnv1a64(struct.pack(f'<{len(words)}I', *words)):016x}"


def _validate(p: PlanFile) -> None:
    seen = np.zeros((p.n_layer, p.n_expert), dtype=bool)
    for j, s in enumerate(p.slots):
        s = np.asarray(s)
        if s.size == 0:
            continue
        if s.ndim != 2 or s.shape[1] != 2:
            raise ValueError(f"GPU {j}: slots must be (layer, expert) pairs")
        if s[:, 0].min() < 0 or s[:, 0].max() >= p.n_layer or s[:, 1].min() < 0 or s[:, 1].max() >= p.n_expert:
            raise ValueError(f"GPU {j}: slot outside the model shape")
        if any(int(l) not in p.gpu_layers[j] for l in np.unique(s[:, 0])):
            raise ValueError(f"GPU {j}: a slot holds an expert of a layer on another device")
        if seen[s[:, 0], s[:, 1]].any() or len(np.unique(s, axis=0)) != len(s):
            raise ValueError(f"GPU {j}: an expert is resident twice")
        seen[s[:, 0], s[:, 1]] = True
        used = int(sum(p.expert_bytes[int(l)] for l in s[:, 0]))
        if p.pool_bytes[j] and used > p.pool_bytes[j]:
            raise ValueError(f"GPU {j}: slots need {used} bytes, pool has {p.pool_bytes[j]}")


def write_plan(path: str | os.PathLike, p: PlanFile) -> str:
    """Validate and write a plan file atomically; return its checksum."""
    _validate(p)
    cs = plan_checksum(p)
    doc = {"format": PLAN_FORMAT, "version": PLAN_VERSION,
           "model": {"name": p.model_name, "n_layer": p.n_layer, "n_expert": p.n_expert,
                     "n_expert_used": p.n_expert_used, "expert_bytes": [int(x) for x in p.expert_bytes]},
           "gpus": [{"gpu": j, "layers": [int(x) for x in p.gpu_layers[j]], "pool_bytes": int(p.pool_bytes[j]),
                     "slots": np.asarray(s, dtype=np.int64).reshape(-1, 2).tolist()}
                    for j, s in enumerate(p.slots)],
           "profile_sha256": p.profile_sha256, **({"extra": p.extra} if p.extra else {}), "checksum": cs}
    with atomic_open(Path(path), "w") as f:
        f.write(json.dumps(doc, separators=(",", ":")) + "\n")
    return cs


def read_plan(path: str | os.PathLike) -> PlanFile:
    """Read and verify a plan file (format, version, checksum, slot validity)."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format") != PLAN_FORMAT or doc.get("version") != PLAN_VERSION:
        raise ValueError(f"{path}: not a {PLAN_FORMAT} version {PLAN_VERSION} file")
    m = doc["model"]
    gpus = sorted(doc["gpus"], key=lambda g: g["gpu"])
    if [g["gpu"] for g in gpus] != list(range(len(gpus))):
        raise ValueError(f"{path}: GPUs must be numbered 0..n-1")
    p = PlanFile(str(m.get("name", "")), int(m["n_layer"]), int(m["n_expert"]), int(m["n_expert_used"]),
                 [int(x) for x in m["expert_bytes"]], [list(map(int, g["layers"])) for g in gpus],
                 [int(g.get("pool_bytes", 0)) for g in gpus],
                 [np.asarray(g["slots"], dtype=np.int64).reshape(-1, 2) for g in gpus],
                 str(doc.get("profile_sha256", "")), dict(doc.get("extra", {})))
    if doc.get("checksum") != plan_checksum(p):
        raise ValueError(f"{path}: checksum {doc.get('checksum')} does not match the slots ({plan_checksum(p)})")
    _validate(p)
    return p
