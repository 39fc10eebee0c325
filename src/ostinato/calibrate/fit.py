"""The cost model's constants fitted from one calibration run (`ostinato.calibrate.run`), and the machine profile
and simulator constants written from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from ostinato.calibrate.run import failed
from ostinato.costmodel.fit import fit_upload
from ostinato.costmodel.params import ModelCosts
from ostinato.models.gguf_shape import MoeShape


@dataclass(frozen=True)
class CalibrationFit:
    """Constants fitted from one calibration run (ms; per MoE layer where it says so)."""

    n_moe_layer: int
    k: int
    tpot_ms: dict[int, float]            # decode: median time per output token at r cold routes per token and layer
    beta_ms: float                       # per layer: slope of C(r) over 1 <= r <= k
    alpha_minus_gamma0_ms: float         # per layer: C(r) - C(0) = (alpha - gamma0) + beta r for r >= 1
    decode_fit_residual_ms: float        # largest |fitted - measured| per-layer increment
    prefill_pass_ms: float               # split path at r = 0: intercept over n
    prefill_token_ms: float              # split path at r = 0: slope over n (GPU cost of all routes folded in)
    cpu_layer_ms: float                  # per layer and request: fixed cost of a CPU branch with cold routes
    cpu_route_ms: float                  # per layer: one cold route on the CPU, less its cost on the GPU
    upload_bytes_per_ms: float           # from the upload passes (nan when none ran)
    upload_latency_ms: float             # per upload pass, whatever it copies
    upload_expert_ms: float              # the copy of one expert of the model's size inside a pass (no latency)
    n_upload_passes: int
    # from the engine's timers (nan when the server did not time its branches): per MoE layer and decode step
    engine_gamma0_ms: float = float("nan")        # the CPU branch at r = 0
    engine_alpha_ms: float = float("nan")         # C(r) = alpha + beta r for r >= 1 (least squares over r)
    engine_beta_ms: float = float("nan")
    engine_gpu_branch_ms: float = float("nan")    # G: the GPU branch (median over steps and layers)
    engine_gpu_branch_ms_range: tuple[float, float] = (float("nan"), float("nan"))  # per-layer medians
    engine_timed_steps: int = 0                   # (step, layer) timings used

    @property
    def timed(self) -> bool:
        """Whether the engine's timers gave gamma0, alpha, beta and G."""
        return self.engine_timed_steps > 0 and bool(np.isfinite(self.engine_beta_ms))

    def to_dict(self) -> dict:
        """Plain mapping (JSON)."""
        d = asdict(self)
        d["tpot_ms"] = {int(k): float(v) for k, v in self.tpot_ms.items()}
        d["engine_gpu_branch_ms_range"] = [float(v) for v in self.engine_gpu_branch_ms_range]
        return d


def fit_engine_timers(timers: pd.DataFrame | None) -> dict:
    """gamma0, alpha, beta and G from the engine's decode-step timings (`run_calibration`'s `timings`: columns rep, r,
    layer, n_cold, gpu_ms, cpu_ms): C(n_cold) is the median CPU branch time at each number of cold routes of a layer,
    gamma0 = C(0), alpha and beta the line through C(r) over r >= 1, G the median GPU branch time. Empty when the
    timings cannot give them (no timings, or fewer than two r >= 1)."""
    if timers is None or not len(timers):
        return {}
    t = timers[timers["rep"] >= 0]
    c = t.groupby("n_cold")["cpu_ms"].median()
    if 0 not in c.index or (c.index >= 1).sum() < 2:
        return {}
    cold = c[c.index >= 1]
    lr = stats.linregress(cold.index.to_numpy(dtype=float), cold.to_numpy())
    per_layer = t.groupby("layer")["gpu_ms"].median()
    return {"engine_gamma0_ms": float(c[0]), "engine_alpha_ms": float(lr.intercept), "engine_beta_ms": float(lr.slope),
            "engine_gpu_branch_ms": float(t["gpu_ms"].median()),
            "engine_gpu_branch_ms_range": (float(per_layer.min()), float(per_layer.max())),
            "engine_timed_steps": int(len(t))}


def fit_calibration(rows: pd.DataFrame, uploads: pd.DataFrame, n_moe_layer: int, k: int,
                    expert_bytes: float, timers: pd.DataFrame | None = None) -> CalibrationFit:
    """Fit the calibration constants from the rows of `run_calibration`, the upload passes of its log and, when the
    server timed its branches, the engine's decode-step timings."""
    ok = rows[~failed(rows) & (rows["rep"] >= 0)]
    dec = ok[ok["what"] == "decode"].groupby("r")["predicted_per_token_ms"].median()
    if 0 not in dec.index or (dec.index >= 1).sum() < 2:
        raise ValueError("the decode fit needs r = 0 and at least two r >= 1 measured without error")
    inc = (dec[dec.index >= 1] - dec[0]) / n_moe_layer
    lr = stats.linregress(inc.index.to_numpy(dtype=float), inc.to_numpy())
    resid = float(np.max(np.abs(lr.intercept + lr.slope * inc.index.to_numpy() - inc.to_numpy())))

    spl = ok[ok["what"].isin(["split", "upload"])].groupby(["what", "n_new", "r"])["prompt_ms"].median()
    base = spl.xs(0, level="r")
    base_n = base.index.get_level_values("n_new").to_numpy(dtype=float)
    if np.unique(base_n).size < 2:
        raise ValueError("the prefill fit needs at least two prompt sizes at r = 0")
    lb = stats.linregress(base_n, base.to_numpy())
    split = spl.xs("split", level="what")
    d = [(n, r, (v - split[(n, 0)]) / n_moe_layer) for (n, r), v in split.items() if r >= 1 and (n, 0) in split.index]
    if len({n * r for n, r, _ in d}) < 2:
        raise ValueError("the split-path fit needs two different n·r products at r >= 1")
    x = np.array([n * r for n, r, _ in d], dtype=float)
    y = np.array([v for _, _, v in d])
    ls = stats.linregress(x, y)

    if len(uploads):
        up = fit_upload(uploads["bytes"].to_numpy(), uploads["ms"].to_numpy())
        bpm, lat, one = up.bytes_per_ms, up.latency_ms, up.copy_ms(expert_bytes)
    else:
        bpm = lat = one = float("nan")
    return CalibrationFit(n_moe_layer, k, {int(r): float(v) for r, v in dec.items()}, float(lr.slope),
                          float(lr.intercept), resid, float(lb.intercept), float(lb.slope), float(ls.intercept),
                          float(ls.slope), float(bpm), float(lat), float(one), int(len(uploads)),
                          **fit_engine_timers(timers))


def profile_doc(fit: CalibrationFit, base: ModelCosts, base_name: str, shape: MoeShape, model_name: str,
                machine: dict, name: str, upload_min: int) -> dict:
    """An ostinato-profile (version 1) mapping for the measured model: measured constants, the rest from `base`.

    Its `calibration` entry lists which constants were measured here and which were taken from the base profile.
    """
    b = base.classes[0].costs
    moe = shape.moe_layers()
    sizes: dict[int, int] = {}
    for il in moe:
        sizes[int(shape.expert_bytes[il])] = sizes.get(int(shape.expert_bytes[il]), 0) + 1
    if fit.timed:  # the engine's timers: every decode constant measured in-engine
        g0, alpha, beta, g = fit.engine_gamma0_ms, fit.engine_alpha_ms, fit.engine_beta_ms, fit.engine_gpu_branch_ms
        measured = ["gamma0_ms, alpha_ms, beta_ms and gpu_branch_ms (the engine's timers of its decode steps)"]
        from_profile: dict = {"profile": base_name, "keys": []}
        source = "gamma0, alpha, beta and G from the engine's timers"
    else:
        g0, alpha, beta, g = b.gamma0_ms, b.gamma0_ms + fit.alpha_minus_gamma0_ms, fit.beta_ms, b.gpu_branch_ms
        measured = ["beta_ms", "alpha_ms - gamma0_ms"]
        from_profile = {"profile": base_name, "keys": ["gamma0_ms", "gpu_branch_ms"]}
        source = f"gamma0 and G from profile {base_name}"
    classes = [{"name": f"{nbytes}B", "expert_bytes": nbytes, "n_layer": n, "gamma0_ms": g0, "alpha_ms": alpha,
                "beta_ms": beta, "gpu_branch_ms": g} for nbytes, n in sizes.items()]
    return {
        "format": "ostinato-profile", "version": 1, "name": name,
        "source": f"ostinato calibrate on {machine.get('name', 'this machine')}; {source}",
        "machine": machine,
        "models": {model_name: {
            "n_moe_layer": len(moe), "n_expert": shape.n_expert, "n_expert_used": shape.n_expert_used,
            "classes": classes,
            "upload": {"expert_ms_idle": fit.upload_expert_ms, "expert_ms_loaded": fit.upload_expert_ms,
                       "pass_ms": fit.upload_latency_ms},
            "cpu_token_expert_ms": fit.cpu_route_ms, "upload_min": upload_min,
            "calibration": {
                "measured": measured + ["cpu_token_expert_ms (a cold route on the CPU less its GPU cost)",
                                        "upload.expert_ms_idle (one expert's copy)",
                                        "upload.pass_ms (the latency of a pass)"],
                "from_profile": from_profile,
                "not_measured": ["upload.expert_ms_loaded (set to the idle time: uploads were not timed under "
                                 "CPU load)"],
                "fit": fit.to_dict()},
        }},
    }


def sim_params_doc(fit: CalibrationFit, base: ModelCosts, upload_min: int, n_ubatch: int) -> dict:
    """Simulator constants (`SimParams` fields) from a calibration; the decode step's non-expert time uses gamma0 and G
    of the engine's timers, else of the base profile (the measured step at r = 0 is `decode_other + L (gamma0 + G)`,
    branches in turn)."""
    b = base.classes[0].costs
    g0, g = (fit.engine_gamma0_ms, fit.engine_gpu_branch_ms) if fit.timed else (b.gamma0_ms, b.gpu_branch_ms)
    other = fit.tpot_ms[0] - fit.n_moe_layer * (g0 + g)
    return {"decode_other_ms": max(float(other), 0.0), "prefill_token_ms": fit.prefill_token_ms,
            "prefill_pass_ms": max(fit.prefill_pass_ms, 0.0), "cpu_route_ms": fit.cpu_route_ms,
            "cpu_layer_ms": fit.cpu_layer_ms, "gpu_route_ms": 0.0,
            "upload_expert_ms": fit.upload_expert_ms if np.isfinite(fit.upload_expert_ms) else base.upload_ms_idle,
            "upload_pass_ms": fit.upload_latency_ms if np.isfinite(fit.upload_latency_ms) else base.upload_pass_ms,
            "n_ubatch": n_ubatch, "upload_min": upload_min}
