"""Checks of the cost model against the paper's own numbers, from the published constants alone.

Each check recomputes a number the paper states from other numbers it states; checks that need the
development routing traces (q_l, mu_l of a given pool, u(n)) are listed by `needs_traces()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ostinato.costmodel.params import ModelCosts

# Numbers quoted in the paper (Section 3.2, Appendix B, Table 6), used as inputs or as targets.
PAPER = {
    "q_bar_4864": 0.589, "sum_delta_ms": 0.152, "prop31_bound_ms": 0.142,
    "d_f0_ms": 2.219, "d_f_ms": 2.239, "d_f_measured_ms": 2.25,
    "step_seq_ms": 38.415, "step_overlap_ms": 33.538, "overlap_saving_ms": 4.877, "U_ms": 5.615, "hidden_share": 0.869,
    "alpha_plus_beta_ms": 0.324, "upload_payoff_tokens": 3.0, "pool_small": 4864, "pool_large": 5702,
    "experts_per_layer": 133, "cold_per_layer_4864": 143, "cpu_experts_per_token": (0.92, 0.95), "hot_share": 0.84,
    "expert_cache_mib": 74048,
}


@dataclass(frozen=True)
class Check:
    """One recomputed number: what, the paper's value, ours, the tolerance, and whether it agrees."""

    name: str
    formula: str
    paper: float
    computed: float
    tol: float

    @property
    def ok(self) -> bool:
        """Agreement within the absolute tolerance."""
        return abs(self.paper - self.computed) <= self.tol


def paper_checks(m: ModelCosts) -> list[Check]:
    """Recompute the paper's derived numbers for DeepSeek-V4-Flash from its constants."""
    c = m.classes[0].costs
    n_layer = m.n_moe_layer
    d_lo, d_hi = m.delta_ms_range or (c.delta_ms, c.delta_ms)
    g_lo, g_hi = m.gpu_branch_ms_range or (c.gpu_branch_ms, c.gpu_branch_ms)
    p = PAPER
    beta = c.beta_ms
    d_mu = p["d_f0_ms"] / beta
    u_mid = n_layer * (p["q_bar_4864"] * c.gpu_branch_ms + (1 - p["q_bar_4864"]) * min(c.gamma0_ms, c.gpu_branch_ms))
    return [
        Check("alpha + beta", "alpha + beta", p["alpha_plus_beta_ms"], c.alpha_ms + beta, 5e-4),
        Check("delta_max from G_min", "alpha - min G (G rounded to 0.001 ms)", d_hi, c.alpha_ms - g_lo, 1e-3),
        Check("delta_min from G_max", "alpha - max G (G rounded to 0.001 ms)", d_lo, c.alpha_ms - g_hi, 1e-3),
        Check("delta_max / beta ~ 3%", "delta_max / beta", 0.03, d_hi / beta, 2e-3),
        Check("mean G implied by sum delta = 0.152 lies in 0.135-0.139", "alpha - 0.152 / L vs range midpoint",
              (g_lo + g_hi) / 2, c.alpha_ms - p["sum_delta_ms"] / n_layer, (g_hi - g_lo) / 2),
        Check("Prop 3.1 bound at 4,864", "L delta_max q_bar", p["prop31_bound_ms"], n_layer * d_hi * p["q_bar_4864"], 5e-4),
        Check("Prop B.2 upper factor", "1 + delta_max / beta", 1.03, 1 + d_hi / beta, 5e-3),
        Check("Prop B.2: dF within [dF0, (1 + delta_max/beta) dF0]", "dF if inside the bound",
              p["d_f_ms"], min(max(p["d_f_ms"], p["d_f0_ms"]), (1 + d_hi / beta) * p["d_f0_ms"]), 1e-9),
        Check("Prop B.2: q-term <= delta_max sum dmu", "min(dF - dF0, delta_max dF0 / beta)",
              p["d_f_ms"] - p["d_f0_ms"], min(p["d_f_ms"] - p["d_f0_ms"], d_hi * d_mu), 1e-9),
        Check("Prop B.2 prediction vs measured", "predicted dF (2.239) vs measured 2.25", p["d_f_measured_ms"],
              p["d_f_ms"], 0.02),
        Check("overlap saving", "38.415 - 33.538", p["overlap_saving_ms"], p["step_seq_ms"] - p["step_overlap_ms"], 5e-4),
        Check("overlap hides 86.9% of U", "saving / U", p["hidden_share"], p["overlap_saving_ms"] / p["U_ms"], 5e-4),
        Check("U from q_bar (approx.)", "L (q G + (1 - q) min(gamma0, G)), q = 0.589, mean G", p["U_ms"], u_mid, 0.1),
        Check("upload pays off at ~3 tokens", "upload idle / CPU per token-expert", p["upload_payoff_tokens"],
              m.upload_ms_idle / m.cpu_token_expert_ms, 0.1),
        Check("experts per layer at 5,702", "5702 / L", p["experts_per_layer"], p["pool_large"] / n_layer, 0.5),
        Check("cold experts per layer at 4,864", "E - 4864 / L", p["cold_per_layer_4864"],
              m.n_expert - p["pool_small"] / n_layer, 0.5),
        Check("hot share of prefill routes", "1 - (0.92..0.95) / k", p["hot_share"],
              1 - sum(p["cpu_experts_per_token"]) / 2 / m.n_expert_used, 0.01),
        Check("pool bytes vs expert cache (MiB)", "5702 x expert bytes / 2^20 vs 74,048 MiB",
              p["expert_cache_mib"], p["pool_large"] * m.classes[0].expert_bytes / 2**20, 0.02 * p["expert_cache_mib"]),
    ]


def needs_traces() -> list[str]:
    """Paper numbers that cannot be recomputed without the development routing traces."""
    return [
        "q_bar = 0.589 and Q(H_F) = sum delta_l q_l at 4,864 (needs per-layer q_l of the development decode steps)",
        "dF0 = 2.219 ms and dF = 2.239 ms for 4,864 -> 5,702 (needs mu_l, q_l of both pools)",
        "U = 5.615 ms on the 160 decode steps (needs their q_l; q = 0.589 gives ~5.58 ms)",
        "Np = 512 (needs u(n) from prefill traces and the split/upload cost curves of the engine)",
        "84.0% of held-out routes on the top 44% of experts; 117 of 143 cold experts touched by 2,048 tokens",
    ]
