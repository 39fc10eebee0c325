"""Fit the cost model's constants from calibration measurements (a table of measured times) with scipy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from ostinato.costmodel.params import BranchCosts

CALIBRATION_COLUMNS = ("what", "layer", "r", "bytes", "ms")  # plus optional size_class, load


@dataclass(frozen=True)
class CpuFit:
    """C(r) fit: gamma0 = mean at r = 0; alpha + beta r least squares over 1 <= r <= r_max; per-r diagnostics."""

    gamma0_ms: float
    alpha_ms: float
    beta_ms: float
    r: np.ndarray            # distinct r >= 1 measured
    mean_ms: np.ndarray      # measured mean per r
    increment_ms: np.ndarray  # mean(r) - mean(r - 1) per r >= 1 (NaN where r - 1 not measured)
    residual_ms: np.ndarray  # fitted line minus measured mean, per r


def fit_cpu_branch(r: np.ndarray, ms: np.ndarray, r_max: int | None = None) -> CpuFit:
    """Fit gamma0, alpha, beta from per-layer CPU-branch times and their cold-route counts."""
    r = np.asarray(r, dtype=int)
    ms = np.asarray(ms, dtype=float)
    if not np.any(r == 0) or np.unique(r[r >= 1]).size < 2:
        raise ValueError("the CPU-branch fit needs r = 0 samples and at least two distinct r >= 1")
    gamma0 = float(ms[r == 0].mean())
    use = (r >= 1) if r_max is None else ((r >= 1) & (r <= r_max))
    lr = stats.linregress(r[use], ms[use])
    rs = np.unique(r[r >= 1])
    means = np.array([ms[r == x].mean() for x in rs])
    all_means = {int(x): float(ms[r == x].mean()) for x in np.unique(r)}
    inc = np.array([all_means[x] - all_means[x - 1] if (x - 1) in all_means else np.nan for x in rs])
    return CpuFit(gamma0, float(lr.intercept), float(lr.slope), rs, means, inc,
                  lr.intercept + lr.slope * rs - means)


def fit_gpu_branch(layer: np.ndarray, ms: np.ndarray) -> dict[int, float]:
    """G_l: the mean GPU-branch time of each layer."""
    df = pd.DataFrame({"layer": np.asarray(layer, dtype=int), "ms": np.asarray(ms, dtype=float)})
    return {int(k): float(v) for k, v in df.groupby("layer")["ms"].mean().items()}


@dataclass(frozen=True)
class UploadFit:
    """Upload time = latency + bytes / bandwidth (least squares)."""

    latency_ms: float
    bytes_per_ms: float

    def expert_ms(self, expert_bytes: float) -> float:
        """Predicted time of an upload of one expert alone: the latency and the copy."""
        return self.latency_ms + self.copy_ms(expert_bytes)

    def copy_ms(self, expert_bytes: float) -> float:
        """The copy of one expert inside an upload of many (the latency is paid once per upload)."""
        return expert_bytes / self.bytes_per_ms


def fit_upload(nbytes: np.ndarray, ms: np.ndarray) -> UploadFit:
    """Fit latency and bandwidth from (bytes, ms) upload measurements; one size gives zero latency."""
    nbytes = np.asarray(nbytes, dtype=float)
    ms = np.asarray(ms, dtype=float)
    if np.unique(nbytes).size < 2:
        return UploadFit(0.0, float(nbytes.mean() / ms.mean()))
    lr = stats.linregress(nbytes, ms)
    return UploadFit(float(lr.intercept), float(1.0 / lr.slope))


@dataclass(frozen=True)
class CalibrationFit:
    """Everything fitted from one calibration table, per size class."""

    branches: dict[str, BranchCosts]
    cpu: dict[str, CpuFit]
    gpu_per_layer: dict[int, float]
    upload: dict[str, UploadFit]  # per load condition ("idle", "loaded")


def fit_table(df: pd.DataFrame, r_max: int | None = None) -> CalibrationFit:
    """Fit a calibration table: rows what=cpu (layer, r, ms), what=gpu (layer, ms), what=upload (bytes, ms[, load])."""
    missing = [c for c in CALIBRATION_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"calibration table lacks columns {missing}")
    df = df.copy()
    if "size_class" not in df.columns:
        df["size_class"] = "all"
    if "load" not in df.columns:
        df["load"] = "idle"
    cpu_rows, gpu_rows, up_rows = (df[df["what"] == w] for w in ("cpu", "gpu", "upload"))
    gpu_layer = fit_gpu_branch(gpu_rows["layer"], gpu_rows["ms"]) if len(gpu_rows) else {}
    branches: dict[str, BranchCosts] = {}
    cpu: dict[str, CpuFit] = {}
    for cls, rows in cpu_rows.groupby("size_class"):
        f = fit_cpu_branch(rows["r"].to_numpy(), rows["ms"].to_numpy(), r_max)
        g_rows = gpu_rows[gpu_rows["size_class"] == cls]
        g = float(g_rows["ms"].mean()) if len(g_rows) else float("nan")
        cpu[str(cls)] = f
        branches[str(cls)] = BranchCosts(f.gamma0_ms, f.alpha_ms, f.beta_ms, g)
    upload = {str(k): fit_upload(v["bytes"].to_numpy(), v["ms"].to_numpy()) for k, v in up_rows.groupby("load")}
    return CalibrationFit(branches, cpu, gpu_layer, upload)
