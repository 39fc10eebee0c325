"""Machine profiles: the calibrated constants of the cost model per model (and expert-size class), from YAML."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml


@dataclass(frozen=True)
class BranchCosts:
    """Decode-step branch costs of one expert-size class (ms): C(r) = gamma0 if r == 0 else alpha + beta r; G."""

    gamma0_ms: float
    alpha_ms: float
    beta_ms: float
    gpu_branch_ms: float

    def cpu_branch_ms(self, r: np.ndarray | int) -> np.ndarray:
        """C(r) for an array of cold-route counts."""
        r = np.asarray(r)
        return np.where(r == 0, self.gamma0_ms, self.alpha_ms + self.beta_ms * r)

    @property
    def g_ms(self) -> float:
        """g = max(gamma0, G): the layer time without cold routes."""
        return max(self.gamma0_ms, self.gpu_branch_ms)

    @property
    def delta_ms(self) -> float:
        """delta = alpha - g: the residual of Eq. (1)."""
        return self.alpha_ms - self.g_ms

    def eq1_holds(self) -> bool:
        """Eq. (1)'s conditions: beta >= 0 and G <= alpha + beta."""
        return self.beta_ms >= 0 and self.gpu_branch_ms <= self.alpha_ms + self.beta_ms


@dataclass(frozen=True)
class SizeClass:
    """Layers whose experts share one size, with their calibrated costs."""

    name: str
    expert_bytes: int
    n_layer: int
    costs: BranchCosts


@dataclass(frozen=True)
class ModelCosts:
    """One model on one machine: size classes, per-layer G where known, upload and prefill constants."""

    name: str
    n_moe_layer: int
    n_expert: int
    n_expert_used: int
    classes: tuple[SizeClass, ...]
    upload_ms_idle: float            # one expert's copy over an idle bus
    upload_ms_loaded: float          # one expert's copy while the CPU reads host memory
    cpu_token_expert_ms: float       # CPU time of one token through one expert
    upload_min: int                  # Np: passes of >= upload_min tokens take the upload path
    gpu_branch_ms_range: tuple[float, float] | None = None
    delta_ms_range: tuple[float, float] | None = None
    extra: dict = field(default_factory=dict)
    upload_pass_ms: float = 0.0      # latency of one upload of any number of experts (paid once per pass)

    def layer_costs(self) -> list[BranchCosts]:
        """Branch costs of every MoE layer, classes in order (first class's layers first)."""
        out: list[BranchCosts] = []
        for c in self.classes:
            out += [c.costs] * c.n_layer
        return out

    def delta_max_ms(self) -> float:
        """Largest delta_l: the reported range's top where given, else the classes' largest."""
        if self.delta_ms_range is not None:
            return float(self.delta_ms_range[1])
        return max(c.costs.delta_ms for c in self.classes)


@dataclass(frozen=True)
class Profile:
    """A machine profile: name, machine description and the constants of each model."""

    name: str
    machine: dict
    source: str
    models: dict[str, ModelCosts]

    def model(self, name: str) -> ModelCosts:
        """The constants of one model; a clear error names the known ones."""
        if name not in self.models:
            raise ValueError(f"profile {self.name!r} has no model {name!r} (has {sorted(self.models)})")
        return self.models[name]


def _pair(v) -> tuple[float, float] | None:
    return None if v is None else (float(v[0]), float(v[1]))


def _model_from_dict(name: str, d: dict) -> ModelCosts:
    classes = []
    for c in d["classes"]:
        classes.append(SizeClass(str(c["name"]), int(float(c["expert_bytes"])), int(c["n_layer"]),
                                 BranchCosts(float(c["gamma0_ms"]), float(c["alpha_ms"]), float(c["beta_ms"]),
                                             float(c["gpu_branch_ms"]))))
    if sum(c.n_layer for c in classes) != int(d["n_moe_layer"]):
        raise ValueError(f"model {name!r}: size classes cover {sum(c.n_layer for c in classes)} layers, "
                         f"n_moe_layer is {d['n_moe_layer']}")
    up = d.get("upload", {})
    known = {"n_moe_layer", "n_expert", "n_expert_used", "classes", "upload", "cpu_token_expert_ms",
             "upload_min", "gpu_branch_ms_range", "delta_ms_range"}
    return ModelCosts(name, int(d["n_moe_layer"]), int(d["n_expert"]), int(d["n_expert_used"]), tuple(classes),
                      float(up.get("expert_ms_idle", np.nan)), float(up.get("expert_ms_loaded", np.nan)),
                      float(d.get("cpu_token_expert_ms", np.nan)), int(d.get("upload_min", 512)),
                      _pair(d.get("gpu_branch_ms_range")), _pair(d.get("delta_ms_range")),
                      {k: v for k, v in d.items() if k not in known}, float(up.get("pass_ms", 0.0)))


def profile_from_dict(d: dict) -> Profile:
    """Build a Profile from its YAML mapping (see data/profiles/ and docs/planner-and-costmodel.md)."""
    if d.get("format") != "ostinato-profile" or int(d.get("version", 0)) != 1:
        raise ValueError("not an ostinato-profile version 1 mapping")
    models = {n: _model_from_dict(n, m) for n, m in d["models"].items()}
    return Profile(str(d["name"]), dict(d.get("machine", {})), str(d.get("source", "")), models)


def load_profile(path_or_name: str | os.PathLike) -> Profile:
    """Load a profile from a YAML path, or by name from data/profiles/<name>.yaml of the repository."""
    p = Path(path_or_name)
    if not p.suffix:
        p = Path(__file__).resolve().parents[3] / "data" / "profiles" / f"{path_or_name}.yaml"
    if not p.exists():
        raise FileNotFoundError(f"profile {p} does not exist")
    with open(p, encoding="utf-8") as f:
        return profile_from_dict(yaml.safe_load(f))
