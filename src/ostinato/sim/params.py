"""Simulator constants beyond Eq. (1): non-expert time, batched prefill route costs, uploads, pass sizes."""

from __future__ import annotations

from dataclasses import dataclass

from ostinato.costmodel.params import ModelCosts


@dataclass(frozen=True)
class SimParams:
    """All times in ms. Decode uses Eq. (1)'s gamma0, alpha, beta, G; prefill uses the linear route costs here."""

    decode_other_ms: float          # non-expert time of one decode step (attention, dense, shared experts, sampling)
    prefill_token_ms: float         # non-expert time per prefilled token
    prefill_pass_ms: float          # fixed time per prefill forward pass
    cpu_route_ms: float             # CPU time per route in a batched pass
    cpu_layer_ms: float             # CPU fixed time per layer with any CPU route in a batched pass
    gpu_route_ms: float             # GPU time per route in a batched pass
    upload_expert_ms: float         # one expert's copy over PCIe (under CPU load where the CPU also works)
    n_ubatch: int = 2048            # largest forward pass
    upload_min: int = 512           # Np: passes of >= upload_min tokens take the upload path
    cache_max_pass: int = 32        # expert caches serve passes of at most this many tokens
    checkpoint_tail: int = 0        # llama.cpp context checkpoints: last tokens of a request prefilled separately
    buun_decay: float = 0.95        # decaying-count cache: score decay per decode step
    buun_hysteresis: float = 0.25   # a newcomer replaces the lowest-scored expert when it scores this much higher
    buun_admit: int = 1             # decaying-count cache: swaps per token boundary (the engine's --residency-admit)
    bg_admit_ms: float = 0.0        # GPU wait per background admission (borrowed memory, buun)
    max_upload_backlog: float = 8.0  # background upload budget that can accumulate (experts)
    reprefill_output: bool = False  # no KV reuse of outputs: each request also prefills the previous output
    upload_pass_ms: float = 0.0     # latency of one upload (an upload pass, or a cache's misses at one layer)


def paper_illustrative(m: ModelCosts) -> SimParams:
    """Illustrative constants for DeepSeek-V4-Flash on the paper's testbed, NOT fitted: see docs (simulator).

    Assumptions: non-expert prefill cost 1.5 ms/token; Figure 7b's slopes (all-CPU buun 6.0 ms/token, Ostinato's
    split path 3.2 ms/token with 0.935 CPU routes per token and layer, Figure 7c) then give the CPU and GPU cost
    per route; decode_other is Ostinato's SWE step (25.63 ms, Table 8c) minus Eq. (1) at 0.935 cold routes
    per layer and q = 0.9; uploads at the loaded-bus time (1.20 ms per expert).
    """
    k, L = m.n_expert_used, m.n_moe_layer
    c = m.classes[0].costs
    cpu_route = (6.0 - 1.5) / (k * L)
    gpu_route = (3.2 - 1.5 - 0.935 * L * cpu_route) / ((k - 0.935) * L)
    eq1 = L * c.g_ms + c.beta_ms * 0.935 * L + L * c.delta_ms * 0.9
    return SimParams(decode_other_ms=25.63 - eq1, prefill_token_ms=1.5,
                     prefill_pass_ms=5.0, cpu_route_ms=cpu_route, cpu_layer_ms=c.alpha_ms,
                     gpu_route_ms=gpu_route, upload_expert_ms=m.upload_ms_loaded,
                     upload_min=m.upload_min, checkpoint_tail=4, upload_pass_ms=m.upload_pass_ms)
