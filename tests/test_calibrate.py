"""Calibration of the cost model: forced cold-route traces, the fit on hand-made rows, and a real run on the CPU build."""

from __future__ import annotations

import argparse
import math
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ostinato.calibrate.fit import CalibrationFit, fit_calibration, profile_doc, sim_params_doc
from ostinato.calibrate.run import cold_route_trace, upload_passes
from ostinato.costmodel.params import load_profile, profile_from_dict
from ostinato.models.gguf_shape import MoeShape
from ostinato.sim.run import load_sim_params

SHAPE = MoeShape("toy", 3, 16, 4, (0, 1000, 1000), 300)  # layer 0 dense, layers 1-2 MoE, 16 experts, top-4


def test_cold_route_trace_has_exactly_r_cold_routes() -> None:
    for r in range(5):
        t = cold_route_trace(SHAPE, 8, r, 50, seed=1)
        assert (t.ids[:, 0, :] == t.shape.none_id).all()
        moe = t.ids[:, 1:, :].astype(int)
        assert ((moe >= 8).sum(axis=2) == r).all()
        assert all(len(set(row)) == 4 for row in moe.reshape(-1, 4))  # distinct experts per token and layer
    with pytest.raises(ValueError, match="need 1 hot and 3 cold"):
        cold_route_trace(SHAPE, 14, 3, 5)


def _rows(L: int, k: int) -> pd.DataFrame:
    """Rows a machine with known constants would give: TPOT(r) = 10 + L C(r), C = 0.2 (r = 0) else 0.3 + 0.1 r;
    prompt(n, r) = 5 + 0.5 n + L (2 + 0.01 n r) for r >= 1."""
    rows = []
    for rep in range(2):
        for r in range(k + 1):
            c = 0.2 if r == 0 else 0.3 + 0.1 * r
            rows.append(dict(what="decode", r=r, n_new=8, rep=rep, prompt_ms=1.0, predicted_per_token_ms=10 + L * c,
                             error=""))
            for what, n in (("split", 16), ("split", 64), ("upload", 600)):
                ms = 5 + 0.5 * n + (L * (2 + 0.01 * n * r) if (r and what == "split") else 0)
                rows.append(dict(what=what, r=r, n_new=n, rep=rep, prompt_ms=ms, predicted_per_token_ms=1.0, error=""))
    rows.append(dict(what="decode", r=1, n_new=8, rep=0, prompt_ms=1.0, predicted_per_token_ms=1e9,
                     error="HTTP 500"))  # a failed request does not count
    return pd.DataFrame(rows)


def test_fit_recovers_known_constants() -> None:
    ups = upload_passes("x upload pass of 2048 routes: 8 cold experts, 2.00 MiB in 1.00 ms (2.1 GB/s)\n"
                        "upload pass of 512 routes: 16 cold experts, 4.00 MiB in 1.50 ms (2.8 GB/s)\n")
    assert list(ups["experts"]) == [8, 16] and ups["bytes"].iloc[0] == 2 * 2**20
    f = fit_calibration(_rows(2, 4), ups, 2, 4, expert_bytes=2**18)
    assert f.beta_ms == pytest.approx(0.1) and f.alpha_minus_gamma0_ms == pytest.approx(0.1)
    assert f.tpot_ms[0] == pytest.approx(10.4) and f.decode_fit_residual_ms == pytest.approx(0, abs=1e-9)
    assert (f.prefill_pass_ms, f.prefill_token_ms) == (pytest.approx(5), pytest.approx(0.5))
    assert (f.cpu_layer_ms, f.cpu_route_ms) == (pytest.approx(2), pytest.approx(0.01))
    # 2 MiB in 1 ms and 4 MiB in 1.5 ms: 0.5 ms latency per pass, 4 MiB/ms; one 256 KiB expert copies in 0.0625 ms
    assert f.upload_latency_ms == pytest.approx(0.5) and f.upload_expert_ms == pytest.approx(0.0625)
    with pytest.raises(ValueError, match="two r >= 1"):
        fit_calibration(_rows(2, 1), ups, 2, 1, 2**18)


def test_profile_and_sim_params_load(tmp_path: Path) -> None:
    f = fit_calibration(_rows(2, 4), upload_passes(""), 2, 4, expert_bytes=1000)
    assert np.isnan(f.upload_expert_ms) and f.n_upload_passes == 0
    base = load_profile("paper-4x4090d").model("deepseek-v4-flash")
    doc = profile_doc(f, base, "paper-4x4090d", SHAPE, "toy", {"name": "m1"}, "m1", 512)
    m = profile_from_dict(doc).model("toy")
    c = m.classes[0].costs
    assert m.n_moe_layer == 2 and c.beta_ms == pytest.approx(0.1)
    assert c.alpha_ms - c.gamma0_ms == pytest.approx(0.1) and c.gamma0_ms == base.classes[0].costs.gamma0_ms
    cal = m.extra["calibration"]
    assert "beta_ms" in cal["measured"] and cal["from_profile"]["keys"] == ["gamma0_ms", "gpu_branch_ms"]
    p = tmp_path / "sim.yaml"
    p.write_text(yaml.safe_dump(sim_params_doc(f, base, 512, 512)))
    sp = load_sim_params(p)
    assert sp.cpu_route_ms == pytest.approx(0.01) and sp.upload_expert_ms == base.upload_ms_idle
    assert sp.decode_other_ms == pytest.approx(10.4 - 2 * (c.gamma0_ms + c.gpu_branch_ms))


def _timers(gamma0: float, alpha: float, beta: float, g: dict[int, float], k: int) -> pd.DataFrame:
    """Decode-step timings as the engine gives them: for each r and layer, three steps with C(r) and G_layer."""
    rows = [{"rep": rep, "r": r, "pass": 1, "layer": layer, "n_tokens": 1, "n_cold": r,
             "gpu_ms": g[layer] + 0.001 * step, "cpu_ms": (gamma0 if r == 0 else alpha + beta * r) + 0.001 * (step - 1)}
            for rep in range(2) for r in range(k + 1) for layer in g for step in range(3)]
    return pd.DataFrame(rows)


def test_engine_timers_give_gamma0_alpha_beta_and_g() -> None:
    """With the engine's timings the profile takes every decode constant from them, and nothing from the base."""
    timers = _timers(0.12, 0.14, 0.18, {1: 0.13, 2: 0.15}, 4)
    f = fit_calibration(_rows(2, 4), upload_passes(""), 2, 4, expert_bytes=1000, timers=timers)
    assert f.timed and f.engine_timed_steps == len(timers)
    assert (f.engine_gamma0_ms, f.engine_alpha_ms, f.engine_beta_ms) == (pytest.approx(0.12), pytest.approx(0.14),
                                                                         pytest.approx(0.18))
    assert f.engine_gpu_branch_ms == pytest.approx(0.141) and f.engine_gpu_branch_ms_range == (
        pytest.approx(0.131), pytest.approx(0.151))
    base = load_profile("paper-4x4090d").model("deepseek-v4-flash")
    doc = profile_doc(f, base, "paper-4x4090d", SHAPE, "toy", {"name": "m1"}, "m1", 512)
    c = profile_from_dict(doc).model("toy").classes[0].costs
    assert (c.gamma0_ms, c.alpha_ms, c.beta_ms, c.gpu_branch_ms) == (pytest.approx(0.12), pytest.approx(0.14),
                                                                     pytest.approx(0.18), pytest.approx(0.141))
    assert doc["models"]["toy"]["calibration"]["from_profile"]["keys"] == [] and "engine's timers" in doc["source"]
    sp = sim_params_doc(f, base, 512, 512)
    assert sp["decode_other_ms"] == pytest.approx(10.4 - 2 * (0.12 + 0.141))
    yaml.safe_dump(doc)  # the profile's fit block is plain data
    # timings without two r >= 1 (or none) give nothing: the base profile's gamma0 and G, as without timers
    assert not fit_calibration(_rows(2, 4), upload_passes(""), 2, 4, 1000, timers[timers["n_cold"] <= 1]).timed
    assert not fit_calibration(_rows(2, 4), upload_passes(""), 2, 4, 1000, timers.iloc[0:0]).timed


def test_calibrate_cli_on_the_cpu_build(engine_variants: dict[str, Path], tiny_v4_model: Path,
                                        llama_tree: Path, tmp_path: Path) -> None:
    from ostinato.calibrate import cli as calibrate_cli

    parser = argparse.ArgumentParser()
    calibrate_cli.register(parser.add_subparsers(dest="group"))
    out = tmp_path / "cal"
    a = parser.parse_args(["calibrate", "--model", str(tiny_v4_model), "--llama-tree", str(llama_tree),
                           "--variants-dir", str(engine_variants["ostinato"].parents[1]), "--machine", "ci",
                           "--threads", "2", "--reps", "1", "--decode", "8", "--decode-prompt", "8",
                           "--split-sizes", "8,32", "--upload-size", "520", "--ctx", "1024", "--no-progress", "--model-name", "tiny-v4",
                           "--out", str(out)])
    assert a.func(a) == 0
    rows = pd.read_csv(out / "rows.csv")
    assert set(rows["what"]) == {"warmup", "decode", "split", "upload"} and (rows["error"].isna()).all()
    assert sorted(rows[rows["what"] == "decode"]["r"]) == [0, 1, 2, 3, 4]  # tiny-v4: top-4
    ups = pd.read_csv(out / "uploads.csv")
    # one upload pass per 520-token prompt (512 + 8 on the split path); tiny-v4: 4 MoE layers x 8 cold experts
    assert len(ups) == 5 and sorted(ups["experts"]) == [0, 32, 32, 32, 32]
    fit = json.loads((out / "fit.json").read_text())
    assert set(fit["tpot_ms"]) == {"0", "1", "2", "3", "4"} and fit["n_upload_passes"] == 5
    # the engine's timers: every decode step of every MoE layer, with exactly the forced r cold routes
    timers = pd.read_csv(out / "timers.csv")
    assert timers["layer"].nunique() == 4
    assert (timers["n_cold"] == timers["r"]).all() and (timers["n_tokens"] == 1).all()
    assert len(timers) == 5 * 4 * (8 - 1)  # r = 0..4, 4 MoE layers, a decode step per forced token but the last
    assert fit["engine_timed_steps"] == len(timers) and math.isfinite(fit["engine_beta_ms"])
    prof = load_profile(out / "profile.yaml")
    assert prof.name == "ci" and prof.model("tiny-v4").n_moe_layer == 4
    assert prof.model("tiny-v4").extra["calibration"]["from_profile"]["keys"] == []
    assert load_sim_params(out / "sim-params.yaml").upload_min == 512
