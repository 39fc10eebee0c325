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
- in-engine timers (the server started with `--residency-timers`, read at GET /residency after each decode
  request): every decode step's GPU and CPU branch time per MoE layer and its cold routes -> gamma0 (the CPU branch
  at r = 0), alpha and beta (over r >= 1) and G (the GPU branch), which outside timings cannot tell apart from the
  rest of a step. A server without timers leaves them to a base profile, and the written profile says which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ostinato.presets import EngineConfig
from ostinato.server.client import (RequestInput, decode_step_timings, erase_slot, residency_timings,
                                    send_completion)
from ostinato.server import LlamaServer, ServerConfig
from ostinato.models.gguf_shape import MoeShape
from ostinato.routing.trace import RoutingTrace, TraceShape

# timers.csv: the engine's timings of the decode steps (GET /residency of a server with --residency-timers)
TIMER_COLUMNS = ["rep", "r", "pass", "layer", "n_tokens", "n_cold", "gpu_ms", "cpu_ms"]
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
                    startup_timeout_s: float = 900, progress=None,
                    timings: list[dict] | None = None) -> list[CalibrationRow]:
    """One server; for every rep and r: a decode request, the split-path sizes, an upload-path prompt. With
    `timings`, the engine's timings of each decode request's single-token passes are appended to it (rep, r and the
    server's pass, layer, n_cold, gpu_ms, cpu_ms), when the server times its branches."""
    rng = np.random.default_rng(plan.seed)
    draw = lambda n: tuple(int(t) for t in rng.integers(plan.vocab_lo, plan.vocab_hi, size=n))  # noqa: E731
    forced = draw(plan.n_decode)
    prompts = {n: draw(n) for n in sorted({plan.decode_prompt, *plan.split_sizes, plan.upload_size})}
    trace_dir = Path(next(iter(traces.values()))).resolve().parent
    if any(Path(p).resolve().parent != trace_dir for p in traces.values()):
        raise ValueError("the calibration's routing traces must share one directory (the server's --routing-dir)")
    cfg = ServerConfig(binary=server_bin, model=model, args=[*config.server_args, *extra_args],
                       env=dict(config.env), log_path=log_path, startup_timeout_s=startup_timeout_s,
                       routing_dir=trace_dir)
    rows: list[CalibrationRow] = []
    with LlamaServer(cfg) as srv:
        last_pass = 0
        if timings is not None:
            seen = residency_timings(srv.client, srv.base_url)
            last_pass = max((t["pass"] for t in seen["timings"]), default=0)

        def one(what: str, r: int, rep: int, n: int, n_predict: int, forced_ids: tuple[int, ...]) -> None:
            nonlocal last_pass
            erase_slot(srv.client, srv.base_url)
            req = RequestInput(prompts[n], n_predict, forced_ids, cache_prompt=False,
                               extra={"routing": {"force": Path(traces[r]).name}})
            out = send_completion(srv.client, srv.base_url, req)
            t = out.timings or {}
            # the server's timings are the measurement (a byte vocabulary may stream no text chunk at all)
            err = "" if t.get("prompt_ms") is not None and t.get("predicted_n") == n_predict else (
                out.error or f"server timings missing or predicted_n != {n_predict}: {t}")
            rows.append(CalibrationRow(what, r, n, rep, t.get("prompt_n"), t.get("prompt_ms"), t.get("predicted_n"),
                                       t.get("predicted_per_token_ms"), err))
            if timings is not None:
                got = residency_timings(srv.client, srv.base_url, last_pass)["timings"]
                last_pass = max((x["pass"] for x in got), default=last_pass)
                if what == "decode":
                    timings.extend({"rep": rep, "r": r, **x} for x in decode_step_timings(got))
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


def failed(rows: pd.DataFrame) -> pd.Series:
    """Which calibration rows failed: a non-empty `error` (the column is all NaN floats when none did)."""
    err = rows["error"]
    return err.notna() & (err.astype(str) != "")


def upload_passes(log_text: str) -> pd.DataFrame:
    """The engine's upload passes from a server log: routes, experts, bytes and ms of each."""
    rows = [{"routes": int(a), "experts": int(b), "bytes": float(c) * 2**20, "ms": float(d)}
            for a, b, c, d in UPLOAD_RE.findall(log_text)]
    return pd.DataFrame(rows, columns=["routes", "experts", "bytes", "ms"])
