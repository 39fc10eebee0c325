"""Calibrate the cost model on this machine: the `ostinato` engine with a resident pool, routing forced to exactly r
cold routes per token and MoE layer, timed by llama-server's own timings and upload log lines.

What one run measures (all on one server, every request from an erased slot):
- decode: time per output token at r = 0..k cold routes -> the CPU branch's increments C(r) - C(0) per layer,
  i.e. beta (slope over r >= 1) and alpha - gamma0 (the step at the first cold route), since the branches run
  in turn in this engine;
- split-path prefill: prompt time of n < Np tokens at each r -> the CPU cost per cold route and per layer
  (the GPU's cost of the routes it computes is folded into the cost per token, which is exact for every pass
  formula of the simulator);
- upload-path prefill: the engine's `upload pass` log lines -> bytes per ms and the time of one expert.
gamma0 and G (the GPU branch) cannot be told apart from the rest of a step without in-engine timers: they are
taken from a base profile and listed as such in the written profile.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from ostinato.costmodel.fit import fit_upload
from ostinato.costmodel.params import ModelCosts
from ostinato.engines import EngineConfig
from ostinato.replay.client import RequestInput, erase_slot, send_completion
from ostinato.replay.server import LlamaServer, ServerConfig
from ostinato.residency.gguf_shape import MoeShape
from ostinato.routing.trace import RoutingTrace, TraceShape

UPLOAD_RE = re.compile(r"upload pass of (\d+) routes: (\d+) cold experts, ([0-9.]+) MiB in ([0-9.]+) ms")


@dataclass(frozen=True)
class CalibrationPlan:
    """What a calibration run sends; sizes in tokens."""

    decode_prompt: int = 32
    n_decode: int = 32
    split_sizes: tuple[int, ...] = (32, 128)
    upload_size: int = 1024
    reps: int = 3
    seed: int = 0
    vocab_lo: int = 100
    vocab_hi: int = 20000

    @property
    def n_pos(self) -> int:
        """Positions the forced traces must cover."""
        return max(self.decode_prompt + self.n_decode, max(self.split_sizes), self.upload_size) + 1


def cold_route_trace(shape: MoeShape, n_hot: int, r: int, n_pos: int, seed: int = 0) -> RoutingTrace:
    """A trace whose every MoE layer routes, at every position, r experts of the cold set [n_hot, E) and k - r of
    the hot set [0, n_hot), distinct and in random order."""
    k, e = shape.n_expert_used, shape.n_expert
    if not (0 <= r <= k and k - r <= n_hot and r <= e - n_hot):
        raise ValueError(f"r = {r} cold routes of k = {k} need {k - r} hot and {r} cold experts; "
                         f"the plan holds {n_hot} of {e} resident")
    ts = TraceShape(shape.n_layer, e, k)
    ids = np.full((n_pos, shape.n_layer, k), ts.none_id, dtype=ts.id_dtype)
    rng = np.random.default_rng([seed, r])
    for il in shape.moe_layers():
        hot = np.argsort(rng.random((n_pos, n_hot)), axis=1)[:, : k - r]
        cold = n_hot + np.argsort(rng.random((n_pos, e - n_hot)), axis=1)[:, :r]
        both = np.concatenate([hot, cold], axis=1)
        both = np.take_along_axis(both, np.argsort(rng.random(both.shape), axis=1), axis=1)
        ids[:, il, :] = both
    return RoutingTrace(ts, ids, synthetic=True)


@dataclass
class CalibrationRow:
    """One measured request."""

    what: str                # decode | split | upload
    r: int                   # cold routes per token and MoE layer
    n_new: int               # prompt tokens
    rep: int
    prompt_n: int | None
    prompt_ms: float | None
    predicted_n: int | None
    predicted_per_token_ms: float | None
    error: str = ""


def run_calibration(config: EngineConfig, server_bin: Path, model: Path, plan: CalibrationPlan,
                    traces: dict[int, Path], log_path: Path, extra_args: tuple[str, ...] = (),
                    startup_timeout_s: float = 900, progress=None) -> list[CalibrationRow]:
    """One server; for every rep and r: a decode request, the split-path sizes, an upload-path prompt."""
    rng = np.random.default_rng(plan.seed)
    draw = lambda n: tuple(int(t) for t in rng.integers(plan.vocab_lo, plan.vocab_hi, size=n))  # noqa: E731
    forced = draw(plan.n_decode)
    prompts = {n: draw(n) for n in sorted({plan.decode_prompt, *plan.split_sizes, plan.upload_size})}
    cfg = ServerConfig(binary=server_bin, model=model, args=[*config.server_args, *extra_args],
                       env=dict(config.env), log_path=log_path, startup_timeout_s=startup_timeout_s)
    rows: list[CalibrationRow] = []
    with LlamaServer(cfg) as srv:
        def one(what: str, r: int, rep: int, n: int, n_predict: int, forced_ids: tuple[int, ...]) -> None:
            erase_slot(srv.client, srv.base_url)
            req = RequestInput(prompts[n], n_predict, forced_ids, cache_prompt=False,
                               extra={"routing": {"force": str(traces[r])}})
            out = send_completion(srv.client, srv.base_url, req)
            t = out.timings or {}
            # the server's timings are the measurement (a byte vocabulary may stream no text chunk at all)
            err = "" if t.get("prompt_ms") is not None and t.get("predicted_n") == n_predict else (
                out.error or f"server timings missing or predicted_n != {n_predict}: {t}")
            rows.append(CalibrationRow(what, r, n, rep, t.get("prompt_n"), t.get("prompt_ms"), t.get("predicted_n"),
                                       t.get("predicted_per_token_ms"), err))
            if progress:
                progress(rows[-1])

        one("warmup", 0, -1, plan.decode_prompt, plan.n_decode, forced)
        for rep in range(plan.reps):
            for r in rng.permutation(sorted(traces)).tolist():  # a new order each rep: drift spreads over every r
                one("decode", r, rep, plan.decode_prompt, plan.n_decode, forced)
                for n in plan.split_sizes:
                    one("split", r, rep, n, 1, forced[:1])
                one("upload", r, rep, plan.upload_size, 1, forced[:1])
    return rows


def upload_passes(log_text: str) -> pd.DataFrame:
    """The engine's upload passes from a server log: routes, experts, bytes and ms of each."""
    rows = [{"routes": int(a), "experts": int(b), "bytes": float(c) * 2**20, "ms": float(d)}
            for a, b, c, d in UPLOAD_RE.findall(log_text)]
    return pd.DataFrame(rows, columns=["routes", "experts", "bytes", "ms"])


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
    upload_latency_ms: float
    upload_expert_ms: float              # one expert of the model's size
    n_upload_passes: int

    def to_dict(self) -> dict:
        """Plain mapping (JSON)."""
        d = asdict(self)
        d["tpot_ms"] = {int(k): float(v) for k, v in self.tpot_ms.items()}
        return d


def fit_calibration(rows: pd.DataFrame, uploads: pd.DataFrame, n_moe_layer: int, k: int,
                    expert_bytes: float) -> CalibrationFit:
    """Fit the calibration constants from the rows of `run_calibration` and the upload passes of its log."""
    ok = rows[(rows["error"].fillna("") == "") & (rows["rep"] >= 0)]
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
        bpm, lat, one = up.bytes_per_ms, up.latency_ms, up.expert_ms(expert_bytes)
    else:
        bpm = lat = one = float("nan")
    return CalibrationFit(n_moe_layer, k, {int(r): float(v) for r, v in dec.items()}, float(lr.slope),
                          float(lr.intercept), resid, float(lb.intercept), float(lb.slope), float(ls.intercept),
                          float(ls.slope), float(bpm), float(lat), float(one), int(len(uploads)))


def profile_doc(fit: CalibrationFit, base: ModelCosts, base_name: str, shape: MoeShape, model_name: str,
                machine: dict, name: str, np_min: int) -> dict:
    """An ostinato-profile (version 1) mapping for the measured model: measured constants, the rest from `base`.

    Its `calibration` entry lists which constants were measured here and which were taken from the base profile.
    """
    b = base.classes[0].costs
    moe = shape.moe_layers()
    sizes: dict[int, int] = {}
    for il in moe:
        sizes[int(shape.expert_bytes[il])] = sizes.get(int(shape.expert_bytes[il]), 0) + 1
    classes = [{"name": f"{nbytes}B", "expert_bytes": nbytes, "n_layer": n, "gamma0_ms": b.gamma0_ms,
                "alpha_ms": b.gamma0_ms + fit.alpha_minus_gamma0_ms, "beta_ms": fit.beta_ms,
                "gpu_branch_ms": b.gpu_branch_ms} for nbytes, n in sizes.items()]
    return {
        "format": "ostinato-profile", "version": 1, "name": name,
        "source": f"ostinato bench calibrate on {machine.get('name', 'this machine')}; "
                  f"gamma0 and G from profile {base_name}",
        "machine": machine,
        "models": {model_name: {
            "n_moe_layer": len(moe), "n_expert": shape.n_expert, "n_expert_used": shape.n_expert_used,
            "classes": classes,
            "upload": {"expert_ms_idle": fit.upload_expert_ms, "expert_ms_loaded": fit.upload_expert_ms},
            "cpu_token_expert_ms": fit.cpu_route_ms, "prefill_threshold": np_min,
            "calibration": {
                "measured": ["beta_ms", "alpha_ms - gamma0_ms", "cpu_token_expert_ms (a cold route on the CPU "
                             "less its GPU cost)", "upload.expert_ms_idle"],
                "from_profile": {"profile": base_name, "keys": ["gamma0_ms", "gpu_branch_ms"]},
                "not_measured": ["upload.expert_ms_loaded (set to the idle time: uploads were not timed under "
                                 "CPU load)"],
                "fit": fit.to_dict()},
        }},
    }


def sim_params_doc(fit: CalibrationFit, base: ModelCosts, np_min: int, n_ubatch: int) -> dict:
    """Simulator constants (`SimParams` fields) from a calibration; the decode step's non-expert time uses the base
    profile's gamma0 and G (the measured step at r = 0 is `decode_other + L (gamma0 + G)`, branches in turn)."""
    b = base.classes[0].costs
    other = fit.tpot_ms[0] - fit.n_moe_layer * (b.gamma0_ms + b.gpu_branch_ms)
    return {"decode_other_ms": max(float(other), 0.0), "prefill_token_ms": fit.prefill_token_ms,
            "prefill_pass_ms": max(fit.prefill_pass_ms, 0.0), "cpu_route_ms": fit.cpu_route_ms,
            "cpu_layer_ms": fit.cpu_layer_ms, "gpu_route_ms": 0.0,
            "upload_expert_ms": fit.upload_expert_ms if np.isfinite(fit.upload_expert_ms) else base.upload_ms_idle,
            "n_ubatch": n_ubatch, "threshold": np_min}
