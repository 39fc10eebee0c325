"""Cost model: Eq. (1), Props 3.1/3.2/B.2, U, u(n), fits, the paper profile and its checks (small hand cases)."""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import pandas as pd
import pytest

from ostinato.costmodel import cli as cm_cli
from ostinato.costmodel.analysis import decode_analysis, increment_analysis
from ostinato.costmodel.checks import needs_traces, paper_checks
from ostinato.costmodel.decode import (LayerCosts, cold_routes, eq1_step_ms, mu_q, overlap_hideable_from_q,
                                       overlap_hideable_ms, prop31_bound_ms, residency_part_ms, step_ms)
from ostinato.costmodel.fit import fit_cpu_branch, fit_table, fit_upload
from ostinato.costmodel.params import BranchCosts, load_profile
from ostinato.costmodel.prefill import (PrefillCosts, distinct_cold, is_concave, threshold_from_diff,
                                        threshold_from_phi)

PAPER = BranchCosts(0.120, 0.140, 0.184, 0.137)


def _skewed_ids(n_step: int, n_layer: int, n_expert: int, k: int, seed: int = 0, a: float = 1.2) -> np.ndarray:
    """Distinct top-k ids per (step, layer) from a Zipf-like popularity (stationary, correlated within a step)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_expert + 1) ** a
    out = np.empty((n_step, n_layer, k), dtype=np.int64)
    for il in range(n_layer):
        perm = rng.permutation(n_expert)
        g = rng.gumbel(size=(n_step, n_expert)) + np.log(p)[None, :]
        out[:, il, :] = perm[np.argsort(-g, axis=1)[:, :k]]
    return out


def test_branch_costs_and_eq1_conditions() -> None:
    assert PAPER.cpu_branch_ms(0) == pytest.approx(0.120)
    assert PAPER.cpu_branch_ms(2) == pytest.approx(0.140 + 2 * 0.184)
    assert PAPER.g_ms == pytest.approx(0.137) and PAPER.delta_ms == pytest.approx(0.003)
    assert PAPER.eq1_holds()
    assert not BranchCosts(0.1, 0.1, 0.01, 0.5).eq1_holds()
    with pytest.raises(ValueError):
        eq1_step_ms(np.zeros(1), np.zeros(1), LayerCosts.uniform(1, BranchCosts(0.1, 0.1, 0.01, 0.5)))


def test_cold_routes_hand_case() -> None:
    hot = np.array([[True, False, True, False], [False, False, False, True]])
    ids = np.array([[[0, 1], [3, 2]], [[2, 0], [0, 1]]])
    assert cold_routes(ids, hot).tolist() == [[1, 1], [0, 2]]


def test_eq1_equals_direct_time_under_correlated_routes() -> None:
    ids = _skewed_ids(400, 5, 16, 4, seed=1)
    hot = np.zeros((5, 16), dtype=bool)
    hot[:, :6] = True
    c = LayerCosts.from_branches([BranchCosts(0.12, 0.14, 0.184, g) for g in (0.135, 0.136, 0.137, 0.138, 0.139)])
    r = cold_routes(ids, hot)
    mu, q = mu_q(r)
    assert eq1_step_ms(mu, q, c) == pytest.approx(step_ms(r, c, overlap=True).mean(), rel=1e-12)
    # sequential minus overlapped is exactly U = sum E[min(C, G)], and U follows from q alone here
    seq_gain = step_ms(r, c, overlap=False).mean() - step_ms(r, c, overlap=True).mean()
    assert overlap_hideable_ms(r, c) == pytest.approx(seq_gain)
    assert overlap_hideable_from_q(q, c) == pytest.approx(seq_gain)


def test_prop31_frequency_ranked_is_within_bound_of_best_static_set() -> None:
    """Brute force over every residency set of kappa experts in one shared pool (2 layers x 5 experts)."""
    ids = _skewed_ids(300, 2, 5, 2, seed=3)
    c = LayerCosts.from_branches([BranchCosts(0.12, 0.14, 0.184, 0.125), BranchCosts(0.12, 0.14, 0.184, 0.139)])
    counts = np.zeros((2, 5))
    for il in range(2):
        counts[il] = np.bincount(ids[:, il, :].ravel(), minlength=5)
    cells = [(il, e) for il in range(2) for e in range(5)]
    for kappa in range(0, 11):
        def f_of(sel: tuple) -> tuple[float, float]:
            hot = np.zeros((2, 5), dtype=bool)
            for i in sel:
                hot[cells[i]] = True
            mu, q = mu_q(cold_routes(ids, hot))
            return residency_part_ms(mu, q, c), prop31_bound_ms(q, c)
        best = min(f_of(sel)[0] for sel in itertools.combinations(range(10), kappa))
        order = np.lexsort(([e for _, e in cells], [l for l, _ in cells], -counts.ravel()))
        f_freq, bound = f_of(tuple(order[:kappa]))
        assert 0 <= f_freq - best <= bound + 1e-12


def test_prop_b2_increments_on_nested_sets() -> None:
    ids = _skewed_ids(500, 4, 12, 3, seed=5)
    c = LayerCosts.from_branches([BranchCosts(0.12, 0.14, 0.184, g) for g in (0.1344, 0.136, 0.137, 0.1387)])
    small = np.zeros((4, 12), dtype=bool)
    small[:, :4] = True
    large = small.copy()
    large[:, 4:7] = True
    out = increment_analysis(ids, small, large, c, delta_max=0.0056)
    assert out["within"] and out["d_f0_ms"] > 0
    assert out["upper_ms"] == pytest.approx((1 + 0.0056 / 0.184) * out["d_f0_ms"])
    mu_s, q_s = mu_q(cold_routes(ids, small))
    mu_l, q_l = mu_q(cold_routes(ids, large))
    assert np.all(q_s - q_l >= 0) and np.all(q_s - q_l <= mu_s - mu_l + 1e-12)
    with pytest.raises(ValueError):
        increment_analysis(ids, large, small, c)


def test_decode_analysis_fields() -> None:
    ids = _skewed_ids(50, 3, 8, 2)
    hot = np.zeros((3, 8), dtype=bool)
    out = decode_analysis(ids, hot, LayerCosts.uniform(3, PAPER))
    assert out["q_mean"] == 1.0 and out["mu_sum"] == pytest.approx(6.0)
    assert out["eq1_step_ms"] == pytest.approx(3 * (0.140 + 2 * 0.184))
    assert out["prop31_bound_ms"] == pytest.approx(3 * 0.003)


def _brute_ubar(seg: np.ndarray, cold: np.ndarray, n: int) -> float:
    vals = [len({int(e) for e in seg[s:s + n].ravel() if cold[e]}) for s in range(seg.shape[0] - n + 1)]
    return float(np.mean(vals)) if vals else float("nan")


def test_distinct_cold_matches_brute_force_and_is_concave() -> None:
    ids = _skewed_ids(60, 2, 10, 3, seed=7)
    hot = np.zeros((2, 10), dtype=bool)
    hot[0, [0, 3]] = True
    hot[1, 5] = True
    segs = [ids[:40], ids[40:]]
    grid = np.arange(1, 41)
    u = distinct_cold(segs, hot, grid)
    for n in (1, 2, 5, 17, 20, 21, 40):
        for il in range(2):
            num = sum(max(s.shape[0] - n + 1, 0) * np.nan_to_num(_brute_ubar(s[:, il, :], ~hot[il], n)) for s in segs)
            den = sum(max(s.shape[0] - n + 1, 0) for s in segs)
            assert u[n - 1, il] == pytest.approx(num / den)
    assert np.isnan(distinct_cold([ids[:5]], hot, [6])).all()
    # one long stationary segment: u(n) with u(0) = 0 is nondecreasing and concave (Lemma B.3)
    long = _skewed_ids(3000, 1, 32, 4, seed=9)
    hot1 = np.zeros((1, 32), dtype=bool)
    hot1[0, :8] = True
    u1 = distinct_cold([long], hot1, np.arange(1, 200))[:, 0]
    assert is_concave(np.r_[0.0, u1], tol=0.05)  # sample estimate: concave up to noise
    assert u1[-1] <= 24


def test_prop32_single_switch_on_concave_u() -> None:
    n = np.arange(0, 2049)
    u = 143 * (1 - np.exp(-n / 900.0))          # concave, nondecreasing, bounded (117 of 143 near 2,048)
    assert is_concave(u)
    rng = np.random.default_rng(0)
    for _ in range(200):
        phi0, phi1, phi2 = -rng.uniform(1, 500), rng.uniform(0.01, 5), rng.uniform(0.1, 2)
        t = threshold_from_phi(phi0, phi1, phi2, u)
        assert t.sign_changes <= 1
        if t.n_star is not None:
            d = phi0 + phi1 * n - phi2 * u
            assert np.all(d[: t.n_star] < 0) and np.all(d[t.n_star:] >= 0)
    # a convex (non-concave) u can switch twice: the concavity of Lemma B.3 is what makes one threshold enough
    u_bad = np.where(n < 300, 0.0, 2.0 * (n - 300))
    assert threshold_from_phi(-10.0, 0.5, 1.0, u_bad).sign_changes == 2


def test_prefill_costs_phis_match_curves() -> None:
    pc = PrefillCosts(split_setup_ms=5.0, upload_setup_ms=40.0, cpu_route_ms=0.03, gpu_route_ms=0.002,
                      upload_expert_ms=0.53)
    n = np.arange(0, 4097, 1)
    cold_per_token, routes_per_token = 43 * 0.935, 43 * 6
    u_total = 43 * 143 * (1 - np.exp(-n / 900.0))
    diff = pc.split_ms(n, cold_per_token, routes_per_token) - pc.upload_ms(n, u_total, routes_per_token)
    phi0, phi1, phi2 = pc.phis(cold_per_token)
    assert np.allclose(diff, phi0 + phi1 * n - phi2 * u_total)
    t = threshold_from_diff(n, diff)
    assert t.sign_changes == 1 and t.n_star == threshold_from_phi(phi0, phi1, phi2, u_total).n_star


def test_fit_recovers_constants() -> None:
    rng = np.random.default_rng(0)
    r = np.r_[np.zeros(200, int), rng.integers(1, 7, 2000)]
    ms = np.where(r == 0, 0.120, 0.140 + 0.184 * r) + rng.normal(0, 0.002, r.size)
    f = fit_cpu_branch(r, ms)
    assert f.gamma0_ms == pytest.approx(0.120, abs=1e-3)
    assert f.alpha_ms == pytest.approx(0.140, abs=3e-3) and f.beta_ms == pytest.approx(0.184, abs=1e-3)
    assert np.allclose(f.increment_ms[1:], 0.184, atol=3e-3)
    assert f.increment_ms[0] == pytest.approx(0.140 + 0.184 - 0.120, abs=3e-3)  # r = 1 includes the jump alpha - gamma0
    up = fit_upload([13.4e6, 6.7e6, 26.8e6], [0.53, 0.28, 1.03])
    assert up.expert_ms(13.4e6) == pytest.approx(0.53, abs=0.01)
    with pytest.raises(ValueError):
        fit_cpu_branch(np.array([1, 1]), np.array([0.3, 0.3]))


def test_fit_table_size_classes() -> None:
    rows = []
    for cls, (g0, a, b) in {"small": (0.118, 0.128, 0.139), "large": (0.119, 0.129, 0.157)}.items():
        for r in range(0, 9):
            for _ in range(3):
                rows.append({"what": "cpu", "layer": 0, "r": r, "bytes": 0, "size_class": cls,
                             "ms": g0 if r == 0 else a + b * r})
        rows.append({"what": "gpu", "layer": 1 if cls == "small" else 2, "r": 0, "bytes": 0, "size_class": cls,
                     "ms": 0.113})
    rows += [{"what": "upload", "layer": -1, "r": 0, "bytes": x, "size_class": "", "load": "idle",
              "ms": 0.01 + x / 25.3e6} for x in (10.6e6, 12.2e6)]
    fit = fit_table(pd.DataFrame(rows))
    assert fit.branches["large"].beta_ms == pytest.approx(0.157)
    assert fit.branches["small"].gamma0_ms == pytest.approx(0.118)
    assert fit.branches["small"].gpu_branch_ms == pytest.approx(0.113)
    assert fit.upload["idle"].bytes_per_ms == pytest.approx(25.3e6)
    assert fit.gpu_per_layer == {1: pytest.approx(0.113), 2: pytest.approx(0.113)}


def test_paper_profile_and_checks() -> None:
    prof = load_profile("paper-4x4090d")
    v4 = prof.model("deepseek-v4-flash")
    c = v4.classes[0].costs
    assert (c.gamma0_ms, c.alpha_ms, c.beta_ms) == (0.120, 0.140, 0.184)
    assert v4.upload_ms_idle == 0.53 and v4.upload_ms_loaded == 1.20 and v4.upload_min == 512
    assert v4.delta_max_ms() == 0.0056
    qwen = prof.model("qwen3-235b-a22b")
    assert [k.n_layer for k in qwen.classes] == [48, 46]
    assert all(k.costs.g_ms == k.costs.gamma0_ms for k in qwen.classes)   # G below gamma0 on Qwen3
    checks = paper_checks(v4)
    assert all(ch.ok for ch in checks), [ch for ch in checks if not ch.ok]
    by = {ch.name: ch for ch in checks}
    assert by["Prop 3.1 bound at 4,864"].computed == pytest.approx(43 * 0.0056 * 0.589)
    assert by["overlap hides 86.9% of U"].computed == pytest.approx(4.877 / 5.615)
    assert len(needs_traces()) >= 4
    with pytest.raises(ValueError):
        prof.model("nope")


def test_cli_check(tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser()
    cm_cli.register(parser.add_subparsers(dest="group"))
    args = parser.parse_args(["costmodel", "check", "--out", str(tmp_path / "c.json")])
    assert args.func(args) == 0
    assert "Prop 3.1" in capsys.readouterr().out and (tmp_path / "c.json").exists()


def test_cli_fit_and_decode(tmp_path, capsys) -> None:
    import json

    import yaml

    from ostinato.residency.planfile import PlanFile, write_plan
    from ostinato.routing.trace import RoutingTrace, TraceShape, write_trace

    parser = argparse.ArgumentParser()
    cm_cli.register(parser.add_subparsers(dest="group"))
    rows = [{"what": "cpu", "layer": 0, "r": r, "bytes": 0, "ms": 0.12 if r == 0 else 0.14 + 0.184 * r}
            for r in range(0, 7)]
    rows += [{"what": "gpu", "layer": 0, "r": 0, "bytes": 0, "ms": 0.137},
             {"what": "upload", "layer": -1, "r": 0, "bytes": 13.4e6, "ms": 0.53}]
    pd.DataFrame(rows).to_csv(tmp_path / "cal.csv", index=False)
    a = parser.parse_args(["costmodel", "fit", "--table", str(tmp_path / "cal.csv"), "--expert-bytes", "13.4e6",
                           "--out", str(tmp_path / "fit.yaml")])
    assert a.func(a) == 0
    fit = yaml.safe_load((tmp_path / "fit.yaml").read_text())
    assert fit["classes"]["all"]["beta_ms"] == pytest.approx(0.184)
    assert fit["upload"]["idle"]["expert_ms"] == pytest.approx(0.53)

    ids = np.full((100, 3, 2), 0xFF, dtype=np.uint8)
    ids[:, 1:, :] = _skewed_ids(100, 2, 8, 2, seed=4)
    write_trace(tmp_path / "d.route", RoutingTrace(TraceShape(3, 8, 2), ids))
    eb = [0, 13_400_000, 13_400_000]
    small = [np.array([[1, 0]]), np.array([[2, 0]])]
    large = [np.array([[1, 0], [1, 1]]), np.array([[2, 0], [2, 1]])]
    for name, slots in (("s", small), ("l", large)):
        write_plan(tmp_path / f"{name}.json", PlanFile("toy", 3, 8, 2, eb, [[0, 1], [2]], [0, 0], slots))
    a = parser.parse_args(["costmodel", "decode", "--plan", str(tmp_path / "s.json"), "--trace",
                           str(tmp_path / "d.route"), "--out", str(tmp_path / "dec.json")])
    assert a.func(a) == 0
    dec = json.loads((tmp_path / "dec.json").read_text())
    assert dec["n_step"] == 100 and dec["eq1_step_ms"] == pytest.approx(dec["direct_overlap_step_ms"])
    a = parser.parse_args(["costmodel", "decode", "--plan", str(tmp_path / "s.json"), "--plan-large",
                           str(tmp_path / "l.json"), "--trace", str(tmp_path / "d.route")])
    assert a.func(a) == 0
    assert '"within": true' in capsys.readouterr().out


def test_threshold_from_traces_single_switch() -> None:
    from ostinato.costmodel.prefill import threshold_from_traces
    ids = _skewed_ids(4096, 3, 64, 4, seed=11)
    hot = np.zeros((3, 64), dtype=bool)
    hot[:, :16] = True
    pc = PrefillCosts(split_setup_ms=2.0, upload_setup_ms=20.0, cpu_route_ms=0.02, gpu_route_ms=0.002,
                      upload_expert_ms=0.53)
    est = threshold_from_traces([ids[:2048], ids[2048:]], hot, pc, np.arange(1, 2049, 16))
    assert est.threshold.sign_changes == 1 and est.threshold.n_star is not None
    assert 0 < est.cold_routes_per_token < 12
    assert np.all(np.diff(est.u_total) >= -1e-9) and est.u_total[-1] <= 3 * 48
    n = est.threshold.n_star
    assert np.all((est.split_ms - est.upload_ms)[est.n < n] < 0) and np.all((est.split_ms - est.upload_ms)[est.n >= n] >= 0)
