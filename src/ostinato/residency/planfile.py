"""The residency plan file the engine loads at start-up (JSON, versioned, FNV-1a 64 checksum over the slots).

Format `ostinato-plan` version 1 (spec in docs/planner-and-costmodel.md):
{"format": "ostinato-plan", "version": 1,
 "model": {"name", "n_layer", "n_expert", "n_expert_used", "expert_bytes": [per layer]},
 "gpus": [{"gpu": j, "layers": [l, ...], "pool_bytes": B, "slots": [[layer, expert], ...]}, ...],
 "profile_sha256": "...", "checksum": "fnv1a64:<16 hex>"}
Slot i of GPU j holds expert (layer, expert); slots are sorted by layer, then expert. The checksum is
FNV-1a 64 over little-endian uint32 words: n_layer, n_expert, n_expert_used, n_gpu, then per GPU:
gpu, n_slots, then layer, expert of each slot.

One definition of a valid plan: `plan.schema.json` and `check_plan`'s rules (the engine's `llama_residency_load`
applies the same ones, and the model's shape), used by `read_plan` and `write_plan` alike.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ostinato.atomic import atomic_open
from ostinato.errors import InputError
from ostinato.inputs import load_json
from ostinato.schemas import first_error

PLAN_FORMAT = "ostinato-plan"
PLAN_VERSION = 1
PLAN_SCHEMA = "plan.schema.json"
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


def _checksum(n_layer: int, n_expert: int, n_used: int, slots: list) -> str:
    """The checksum string over the shape and each GPU's (layer, expert) slots, GPUs in number order."""
    words = [n_layer, n_expert, n_used, len(slots)]
    for j, s in enumerate(slots):
        words += [j, len(s)]
        words += [int(x) for pair in s for x in pair]
    return f"fnv1a64:{fnv1a64(struct.pack(f'<{len(words)}I', *words)):016x}"


def plan_checksum(p: PlanFile) -> str:
    """The checksum string over shape and slots, as the format defines it."""
    return _checksum(p.n_layer, p.n_expert, p.n_expert_used,
                     [np.asarray(s, dtype=np.int64).reshape(-1, 2).tolist() for s in p.slots])


def check_plan(doc: object) -> str | None:
    """What is wrong with a plan document (`key '...': ...`), or None: the schema, then the rules it cannot state,
    in the engine's terms. No array is sized by a number from the file."""
    err = first_error("ostinato.residency", PLAN_SCHEMA, doc)
    if err is not None:
        return err
    m, gpus = doc["model"], doc["gpus"]
    n_layer, n_expert, n_used, eb = m["n_layer"], m["n_expert"], m["n_expert_used"], m["expert_bytes"]
    if n_used > n_expert:
        return f"key 'model.n_expert_used': {n_used}, more than n_expert ({n_expert})"
    if len(eb) != n_layer:
        return f"key 'model.expert_bytes': {len(eb)} entries, expected one per layer ({n_layer})"
    by_number: dict[int, dict] = {}
    for g in gpus:
        if g["gpu"] >= len(gpus) or g["gpu"] in by_number:
            return f"key 'gpus': GPUs must be numbered 0..{len(gpus) - 1} once each (found {g['gpu']})"
        by_number[g["gpu"]] = g
    layer_gpu: dict[int, int] = {}
    for j in range(len(gpus)):
        for il in by_number[j]["layers"]:
            if il >= n_layer:
                return f"key 'gpus[{j}].layers': layer {il} is outside the model ({n_layer} layers)"
            if il in layer_gpu:
                return f"key 'gpus[{j}].layers': layer {il} is also on GPU {layer_gpu[il]}"
            layer_gpu[il] = j
    resident: set[tuple[int, int]] = set()
    for j in range(len(gpus)):
        used, last = 0, None
        for il, e in by_number[j]["slots"]:
            where = f"key 'gpus[{j}].slots'"
            if il >= n_layer or e >= n_expert:
                return f"{where}: ({il}, {e}) is outside the model"
            if layer_gpu.get(il) != j:
                return f"{where}: layer {il} is not on this GPU"
            if eb[il] == 0:
                return f"{where}: layer {il} has no routed experts (expert_bytes 0)"
            if (il, e) in resident:
                return f"{where}: expert ({il}, {e}) is resident twice"
            if last is not None and (il, e) < last:
                return f"{where}: ({il}, {e}) after {last}: slots are sorted by layer, then expert"
            resident.add((il, e))
            last = (il, e)
            used += eb[il]
        pool = by_number[j].get("pool_bytes", 0)
        if pool > 0 and used > pool:
            return f"key 'gpus[{j}]': the slots need {used} bytes, pool_bytes is {pool}"
    cs = _checksum(n_layer, n_expert, n_used, [by_number[j]["slots"] for j in range(len(gpus))])
    if doc["checksum"] != cs:
        return f"key 'checksum': {doc['checksum']!r} does not match the slots ({cs})"
    return None


def plan_document(p: PlanFile) -> dict:
    """The JSON document of a plan, with its checksum."""
    return {"format": PLAN_FORMAT, "version": PLAN_VERSION,
            "model": {"name": p.model_name, "n_layer": int(p.n_layer), "n_expert": int(p.n_expert),
                      "n_expert_used": int(p.n_expert_used), "expert_bytes": [int(x) for x in p.expert_bytes]},
            "gpus": [{"gpu": j, "layers": [int(x) for x in p.gpu_layers[j]], "pool_bytes": int(p.pool_bytes[j]),
                      "slots": np.asarray(s, dtype=np.int64).reshape(-1, 2).tolist()}
                     for j, s in enumerate(p.slots)],
            "profile_sha256": p.profile_sha256, **({"extra": p.extra} if p.extra else {}),
            "checksum": plan_checksum(p)}


def write_plan(path: str | os.PathLike, p: PlanFile) -> str:
    """Check and write a plan file atomically (what `read_plan` and the engine accept); return its checksum."""
    doc = plan_document(p)
    err = check_plan(doc)
    if err is not None:
        raise ValueError(f"{path}: plan not written: {err}")
    with atomic_open(Path(path), "w") as f:
        f.write(json.dumps(doc, separators=(",", ":")) + "\n")
    return doc["checksum"]


def read_plan(path: str | os.PathLike) -> PlanFile:
    """Read and check a plan file (schema, rules, checksum); an InputError names the file and the key."""
    doc = load_json(path, f"a residency plan ({PLAN_FORMAT} version {PLAN_VERSION})")
    err = check_plan(doc)
    if err is not None:
        raise InputError(f"{path}: {err}")
    m = doc["model"]
    gpus = sorted(doc["gpus"], key=lambda g: g["gpu"])
    return PlanFile(m.get("name", ""), m["n_layer"], m["n_expert"], m["n_expert_used"], list(m["expert_bytes"]),
                    [list(g["layers"]) for g in gpus], [g.get("pool_bytes", 0) for g in gpus],
                    [np.asarray(g["slots"], dtype=np.int64).reshape(-1, 2) for g in gpus],
                    doc.get("profile_sha256", ""), dict(doc.get("extra", {})))
