"""A synthesized model's own router, calibrated to the paper's routing facts (an input, never evidence).

With `--router calibrated`, `ostinato models synth` writes a `deepseek4` model whose unpatched llama.cpp
routing is skewed like the paper's: every MoE layer's experts are ranked (from the moe-l2 lists of
DeepSeek-V4-Flash, a recorded routing profile or a seeded permutation), a target popularity curve over
the ranks (`RouterCurve`) says what share of a layer's routes each rank should get, and

- a non-hash layer's expert-selection bias `exp_probs_b` is solved so that llama.cpp's selection, top-k of
  sqrt(softplus(logits)) + bias, with the random router's logits (N(0, 1) per expert: the router input is
  RMS-normed and `ffn_gate_inp` is N(0, 1/hidden)), routes each rank with the curve's probability;
- a hash layer's `ffn_gate_tid2eid` row of each token id is what that biased router picks for random
  logits: k distinct experts whose inclusion probabilities follow the same curve.

Only the engine's own computation routes tokens: no trace is forced. How close the recorded routing comes
to the facts is measured by recording it (docs/routing.md, "A synthesized model's own router").
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

ROUTERS = ("random", "calibrated")
# "moe-l2": the per-layer hot lists of DeepSeek-V4-Flash (ostinato.routing.hot_v4flash), placeholder layers
# skipped; "seeded": a seeded permutation per layer; "profile:PATH": a routing profile's counts (ostinato
# residency profile), most routed first.
RANKING_SOURCES = ("moe-l2", "seeded", "profile:PATH")
# The paper's resident share for decode (4,864 of 43 x 256 = 11,008 experts).
HEAD_FRAC = 4864 / 11008


@dataclass(frozen=True)
class RouterCurve:
    """Target popularity of a layer's experts by rank (the same curve in every layer, permuted by its ranking).

    The top `head_frac` of the ranks get `head_share` of the routes, decaying by e^`head_decay` from the first
    to the last rank of the head; the lowest `rare_frac` get `rare_level` times a tail rank's share; the ranks
    between share the rest evenly (a flat cold tail). `cold_corr` is the correlation, within one token, of the
    router logits of the ranks below the head: a token that routes one route there tends to route more there, so
    fewer decode steps have a cold route for the same share of cold routes (0: independent logits)."""

    head_frac: float = HEAD_FRAC
    head_share: float = 0.81
    head_decay: float = 2.0
    rare_frac: float = 0.08
    rare_level: float = 0.05
    cold_corr: float = 0.18

    def __post_init__(self) -> None:
        if not (0 < self.head_frac < 1 and 0 < self.head_share < 1 and self.head_decay >= 0
                and 0 <= self.rare_frac < 1 - self.head_frac and 0 <= self.rare_level <= 1
                and 0 <= self.cold_corr < 1):
            raise ValueError(f"router curve {self}: need 0 < head_frac, head_share < 1, head_decay >= 0, "
                             "0 <= rare_frac < 1 - head_frac, 0 <= rare_level <= 1, 0 <= cold_corr < 1")

    def n_head(self, n_expert: int) -> int:
        """Ranks in the head."""
        return max(1, min(n_expert - 1, int(round(self.head_frac * n_expert))))

    def mix(self, n_expert: int) -> np.ndarray:
        """Per rank, the weight w of the token's shared logit: logit = sqrt(1 - w^2) z + w u (z per expert, u per
        token, both N(0, 1)); sqrt(cold_corr) below the head, 0 in it."""
        w = np.zeros(n_expert)
        w[self.n_head(n_expert):] = np.sqrt(self.cold_corr)
        return w

    def popularity(self, n_expert: int, k: int) -> np.ndarray:
        """Per rank, the probability that a token routes to the expert of that rank (sums to k, each <= 1)."""
        n_head = self.n_head(n_expert)
        n_rare = min(n_expert - n_head - 1, int(round(self.rare_frac * n_expert)))
        n_tail = n_expert - n_head - n_rare
        head = np.exp(-self.head_decay * (np.arange(n_head) + 0.5) / n_head)
        head *= self.head_share / head.sum()
        tail_each = (1 - self.head_share) / (n_tail + self.rare_level * n_rare)
        w = np.concatenate([head, np.full(n_tail, tail_each), np.full(n_rare, self.rare_level * tail_each)])
        return _cap(w * k, k)


def _cap(p: np.ndarray, k: int) -> np.ndarray:
    """Scale p to sum k with no entry above 1 (capped entries at 1, the others scaled up, repeatedly)."""
    p = p.astype(np.float64).copy()
    for _ in range(len(p)):
        over = p >= 1.0
        p[over] = 1.0
        free = k - over.sum()
        rest = p[~over].sum()
        if rest <= 0:
            break
        p[~over] *= free / rest
        if not (p > 1.0 + 1e-12).any():
            break
    return np.minimum(p, 1.0)


# How llama.cpp turns router logits into selection scores, up to an order-preserving map: deepseek4 takes
# sqrt(softplus(logits)) and adds exp_probs_b; qwen3moe takes softmax(logits), whose top-k is the logits' top-k.
GATINGS = ("sqrt_softplus", "softmax")


def _select(z: np.ndarray, gating: str = "sqrt_softplus") -> np.ndarray:
    """Selection scores of router logits (before the bias)."""
    return np.sqrt(np.logaddexp(0.0, z)) if gating == "sqrt_softplus" else z


def _threshold(p: np.ndarray, gating: str = "sqrt_softplus") -> np.ndarray:
    """The selection score a N(0, 1) logit exceeds with probability p (p in (0, 1))."""
    from scipy.special import ndtri

    return _select(ndtri(1.0 - np.clip(p, 1e-9, 1 - 1e-9)), gating)


def logit_sample(rng: np.random.Generator, n: int, n_expert: int, mix: np.ndarray | None = None,
                 shared: np.ndarray | None = None) -> np.ndarray:
    """Router logits of n random tokens: N(0, 1) per expert, like the random router on an RMS-normed input; with
    `mix` (per expert w), sqrt(1 - w^2) z + w u with one u per token (`shared`, else drawn after z)."""
    z = rng.standard_normal((n, n_expert))
    if mix is None or not np.any(mix):
        return z
    u = rng.standard_normal((n, 1)) if shared is None else shared.reshape(n, 1)
    return np.sqrt(1.0 - mix * mix)[None, :] * z + mix[None, :] * u


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row (unordered), like ggml_argsort_top_k's set."""
    return np.argpartition(-scores, k - 1, axis=1)[:, :k]


SOLVE_TOKENS = 16384
SOLVE_ITERS = 30


def _exceed(t: np.ndarray, gating: str, mean: np.ndarray | float = 0.0, scale: np.ndarray | float = 1.0
            ) -> np.ndarray:
    """P(score > t) for the score of one N(mean, scale^2) logit."""
    from scipy.special import ndtr

    if gating == "softmax":
        return 1.0 - ndtr((t - mean) / scale)
    tp = np.maximum(t, 1e-6)
    z_at = np.log(np.expm1(np.minimum(tp * tp, 700.0)))  # the logit whose score is t
    return np.where(t <= 0, 1.0, 1.0 - ndtr((z_at - mean) / scale))


def _inclusion(scores: np.ndarray, bias: np.ndarray, k: int, gating: str, mix: np.ndarray, shared: np.ndarray
               ) -> np.ndarray:
    """Per expert, P(it is among the top k of scores + bias), averaged over the sample's tokens with the expert's
    own score integrated out: its threshold is the k-th largest of the other experts' biased scores, and its logit
    given the token's shared part u is N(w u, 1 - w^2)."""
    s = scores + bias
    part = -np.partition(-s, (k - 1, k), axis=1)[:, k - 1:k + 1]  # k-th and (k+1)-th largest per token
    others = np.where(s >= part[:, :1], part[:, 1:], part[:, :1])
    return _exceed(others - bias, gating, mix[None, :] * shared[:, None], np.sqrt(1.0 - mix * mix)[None, :]
                   ).mean(axis=0)


@lru_cache(maxsize=16)
def _solve_bias(n_expert: int, k: int, curve: RouterCurve, gating: str) -> tuple[float, ...]:
    """Bias per rank such that the top k of score(z) + bias, z ~ N(0, 1) per expert, routes rank r with the curve's
    probability: a start from the fixed-threshold approximation, then corrections on one fixed sample of logits
    (deterministic), each expert's own score integrated out so that equal targets get equal biases."""
    target = curve.popularity(n_expert, k)
    if k == n_expert:
        return tuple(0.0 for _ in range(n_expert))
    rng = np.random.default_rng([0x0517, n_expert, k])
    mix = curve.mix(n_expert)
    shared = np.random.default_rng([0x0518, n_expert, k]).standard_normal(SOLVE_TOKENS)
    scores = _select(logit_sample(rng, SOLVE_TOKENS, n_expert, mix, shared), gating)
    t_target = _threshold(target, gating)
    bias = -t_target
    for _ in range(SOLVE_ITERS):
        got = _inclusion(scores, bias, k, gating, mix, shared)
        bias += _threshold(np.clip(got, 1e-9, 1 - 1e-9), gating) - t_target
        bias -= bias.max()
    bias = np.minimum.accumulate(bias)  # most routed first: never a higher bias further down the ranking
    return tuple(float(x) for x in bias)


def rank_bias(n_expert: int, k: int, curve: RouterCurve = RouterCurve(), gating: str = "sqrt_softplus"
              ) -> np.ndarray:
    """Selection bias by rank (rank 0 = most routed), as solved for the curve and the gating."""
    if gating not in GATINGS:
        raise ValueError(f"gating {gating!r}: expected one of {', '.join(GATINGS)}")
    return np.asarray(_solve_bias(n_expert, k, curve, gating))


def _stable(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def _moe_l2_heads(n_layer: int, n_expert: int) -> list[list[int]]:
    """Per layer the moe-l2 hot list (most routed first), empty for layers past its 43 or listing 0..5 only."""
    from ostinato.routing.hot_v4flash import V4FLASH_HOT

    placeholder = tuple(range(6))
    out = []
    for i in range(n_layer):
        hot = V4FLASH_HOT[i] if i < len(V4FLASH_HOT) else ()
        out.append([] if hot == placeholder else [e for e in hot if e < n_expert])
    return out


def _profile_heads(path: str, n_layer: int, n_expert: int) -> list[list[int]]:
    """Per layer the experts of a routing profile with at least one route, most routed first."""
    from ostinato.errors import InputError
    from ostinato.residency.profile import read_profile

    prof = read_profile(path)
    if prof.shape.n_expert != n_expert or prof.shape.n_layer < n_layer:
        raise InputError(f"{path}: a profile of {prof.shape.n_layer} layers x {prof.shape.n_expert} experts cannot "
                         f"rank a model of {n_layer} layers x {n_expert} experts")
    out = []
    for i in range(n_layer):
        c = prof.counts[i]
        order = np.argsort(-c, kind="stable")
        out.append([int(e) for e in order if c[e] > 0])
    return out


def layer_rankings(n_layer: int, n_expert: int, source: str, seed: int) -> np.ndarray:
    """[n_layer, n_expert]: each layer's experts from most to least routed (the source's head, then a seeded
    permutation of the rest)."""
    if source == "moe-l2":
        heads = _moe_l2_heads(n_layer, n_expert)
    elif source == "seeded":
        heads = [[] for _ in range(n_layer)]
    elif source.startswith("profile:") and len(source) > len("profile:"):
        heads = _profile_heads(source[len("profile:"):], n_layer, n_expert)
    else:
        raise ValueError(f"--router-ranking {source!r}: expected one of {', '.join(RANKING_SOURCES)}")
    ranks = np.empty((n_layer, n_expert), dtype=np.int64)
    for i, head in enumerate(heads):
        rng = np.random.default_rng([seed, 0x7A, i])
        rest = np.setdiff1d(np.arange(n_expert), head)
        ranks[i] = np.concatenate([np.asarray(head, dtype=np.int64), rng.permutation(rest)])
    return ranks


@dataclass(frozen=True)
class Router:
    """How a synthesized model routes: `random` (the router's weights alone) or `calibrated` (module doc)."""

    kind: str = "random"
    ranking: str = "moe-l2"
    seed: int = 0
    curve: RouterCurve = field(default_factory=RouterCurve)

    def __post_init__(self) -> None:
        if self.kind not in ROUTERS:
            raise ValueError(f"--router {self.kind!r}: expected one of {', '.join(ROUTERS)}")
        if self.seed < 0:
            raise ValueError(f"--router-seed {self.seed}: expected an integer >= 0")
        if not (self.ranking in ("moe-l2", "seeded") or self.ranking.startswith("profile:")):
            raise ValueError(f"--router-ranking {self.ranking!r}: expected one of {', '.join(RANKING_SOURCES)}")

    @property
    def calibrated(self) -> bool:
        return self.kind == "calibrated"

    def describe(self) -> dict[str, str]:
        """The GGUF metadata keys (ostinato.synth.router*) that label the model's routing as an input."""
        if not self.calibrated:
            return {"router": self.kind}
        ranking = self.ranking
        if ranking.startswith("profile:"):
            ranking = f"profile:{os.path.basename(ranking[len('profile:'):])}"
        c = self.curve
        return {"router": self.kind, "router_ranking": ranking, "router_seed": str(self.seed),
                "router_curve": (f"head_frac={c.head_frac:.4f} head_share={c.head_share} head_decay={c.head_decay} "
                                 f"rare_frac={c.rare_frac} rare_level={c.rare_level} cold_corr={c.cold_corr}")}


@dataclass(frozen=True)
class LayerRouting:
    """A layer's calibrated router: bias per expert (for exp_probs_b and for drawing tid2eid rows) and the weight of
    the token's shared logit per expert (mixed into the router's rows, and into the logits tid2eid rows are drawn
    from)."""

    bias: tuple[float, ...]
    mix: tuple[float, ...] = ()


def calibrated_layers(router: Router, n_layer: int, n_expert: int, k: int, gating: str = "sqrt_softplus"
                      ) -> list[LayerRouting]:
    """Per layer, the selection bias of each expert: the rank bias permuted by the layer's ranking."""
    by_rank = rank_bias(n_expert, k, router.curve, gating)
    mix_by_rank = router.curve.mix(n_expert)
    ranks = layer_rankings(n_layer, n_expert, router.ranking, router.seed)
    out = []
    for i in range(n_layer):
        b = np.empty(n_expert)
        b[ranks[i]] = by_rank
        w = np.empty(n_expert)
        w[ranks[i]] = mix_by_rank
        out.append(LayerRouting(tuple(float(x) for x in b.astype(np.float32)),
                                tuple(float(x) for x in w) if w.any() else ()))
    return out


def draw_hash_rows(rng: np.random.Generator, rows: int, k: int, bias: np.ndarray, mix: np.ndarray | None = None
                   ) -> np.ndarray:
    """For each of `rows` token ids, the k distinct experts the biased router picks for random logits (int32, k per
    row): inclusion probabilities follow the curve the bias was solved for (with `mix`, its correlated logits)."""
    z = logit_sample(rng, rows, bias.size, mix).astype(np.float32)
    scores = _select(z) + bias.astype(np.float32)[None, :]
    return _topk(scores, k).astype(np.int32).reshape(-1)
