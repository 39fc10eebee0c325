"""Decode-step cost of the two branches (Eq. 1, Prop B.1), the Prop 3.1 bound, Prop B.2 increments and overlap U.

All per-layer quantities are arrays over the MoE layers considered (the trace's layers with routing),
times in ms. A decode step routes one token: r_l = number of its k selected experts that are cold in layer l.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ostinato.costmodel.params import BranchCosts


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer arrays of gamma0, alpha, beta and G (ms)."""

    gamma0: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    gpu: np.ndarray

    @classmethod
    def from_branches(cls, branches: list[BranchCosts]) -> LayerCosts:
        """Stack one BranchCosts per layer."""
        return cls(*(np.array([getattr(b, f) for b in branches], dtype=float)
                     for f in ("gamma0_ms", "alpha_ms", "beta_ms", "gpu_branch_ms")))

    @classmethod
    def uniform(cls, n_layer: int, b: BranchCosts) -> LayerCosts:
        """The same costs in every layer."""
        return cls.from_branches([b] * n_layer)

    @property
    def g(self) -> np.ndarray:
        """g_l = max(gamma0, G_l)."""
        return np.maximum(self.gamma0, self.gpu)

    @property
    def delta(self) -> np.ndarray:
        """delta_l = alpha - g_l."""
        return self.alpha - self.g

    def cpu(self, r: np.ndarray) -> np.ndarray:
        """C(r) per step and layer for r of shape [n_step, n_layer]."""
        return np.where(r == 0, self.gamma0, self.alpha + self.beta * r)

    def check_eq1(self) -> None:
        """Raise unless beta >= 0 and G <= alpha + beta in every layer (the conditions of Eq. 1)."""
        if np.any(self.beta < 0) or np.any(self.gpu > self.alpha + self.beta):
            raise ValueError("Eq. (1) needs beta >= 0 and G_l <= alpha + beta in every layer")


def cold_routes(ids: np.ndarray, hot: np.ndarray) -> np.ndarray:
    """Cold routes per step and layer: ids [n_step, n_layer, k] (layers already selected), hot [n_layer, n_expert]."""
    ids = np.asarray(ids, dtype=np.int64)
    n_layer = hot.shape[0]
    if ids.ndim != 3 or ids.shape[1] != n_layer:
        raise ValueError(f"ids shape {ids.shape} does not match {n_layer} layers of the residency mask")
    valid = (ids >= 0) & (ids < hot.shape[1])
    lay = np.arange(n_layer)[None, :, None]
    is_hot = hot[lay, np.where(valid, ids, 0)]
    return (valid & ~is_hot).sum(axis=2)


def mu_q(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expected cold routes mu_l and probability of any cold route q_l from r [n_step, n_layer]."""
    r = np.asarray(r)
    return r.mean(axis=0), (r > 0).mean(axis=0)


def eq1_step_ms(mu: np.ndarray, q: np.ndarray, c: LayerCosts) -> float:
    """Eq. (1) summed over layers: sum_l g_l + beta_l mu_l + delta_l q_l (overlapped branches)."""
    c.check_eq1()
    return float(np.sum(c.g + c.beta * mu + c.delta * q))


def step_ms(r: np.ndarray, c: LayerCosts, overlap: bool = True) -> np.ndarray:
    """Direct time of each step: sum_l max(C, G) (overlapped) or C + G (in turn)."""
    cpu = c.cpu(np.asarray(r))
    per_layer = np.maximum(cpu, c.gpu) if overlap else cpu + c.gpu
    return per_layer.sum(axis=1)


def residency_part_ms(mu: np.ndarray, q: np.ndarray, c: LayerCosts) -> float:
    """F(H) = beta M(H) + Q(H): the part of Eq. (1) that depends on residency."""
    return float(np.sum(c.beta * mu + c.delta * q))


def prop31_bound_ms(q: np.ndarray, c: LayerCosts) -> float:
    """Prop 3.1: frequency-ranked residency is within Q(H_F) = sum_l delta_l q_l of the best static set."""
    return float(np.sum(c.delta * q))


@dataclass(frozen=True)
class Increment:
    """Prop B.2 for nested sets H within H': dF0 = beta sum dmu, dF, and the bound (1 + delta_max/beta) dF0."""

    d_mu: float
    d_f0_ms: float
    d_f_ms: float
    upper_ms: float

    @property
    def within(self) -> bool:
        """dF0 <= dF <= upper (with a float tolerance)."""
        return self.d_f0_ms - 1e-9 <= self.d_f_ms <= self.upper_ms + 1e-9


def capacity_increment(mu_small: np.ndarray, q_small: np.ndarray, mu_large: np.ndarray, q_large: np.ndarray,
                       c: LayerCosts, delta_max: float | None = None) -> Increment:
    """Prop B.2: saving per step from growing the pool H -> H' (beta taken as the layers' common beta)."""
    beta = float(np.mean(c.beta))
    d_mu = mu_small - mu_large
    d_f0 = float(np.sum(c.beta * d_mu))
    d_f = d_f0 + float(np.sum(c.delta * (q_small - q_large)))
    dmax = float(np.max(c.delta)) if delta_max is None else delta_max
    return Increment(float(d_mu.sum()), d_f0, d_f, (1 + dmax / beta) * d_f0)


def overlap_hideable_ms(r: np.ndarray, c: LayerCosts) -> float:
    """U = sum_l E[min(C(r_l), G_l)]: the most that running the branches concurrently can save per step."""
    return float(np.minimum(c.cpu(np.asarray(r)), c.gpu).sum(axis=1).mean())


def overlap_hideable_from_q(q: np.ndarray, c: LayerCosts) -> float:
    """U from q alone, valid when alpha + beta >= G: min(C, G) is G with a cold route, min(gamma0, G) without."""
    return float(np.sum(q * c.gpu + (1 - q) * np.minimum(c.gamma0, c.gpu)))
