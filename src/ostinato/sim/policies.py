"""Engine policies the simulator models: where experts live and how each kind of forward pass uses them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ostinato.residency.borrow import BorrowParams


@dataclass(frozen=True)
class Policy:
    """One engine configuration.

    residency: "static" (hot mask fixed for the run), "layers" (whole MoE layers on the GPU, given by
    gpu_layers), "lru" (an LRU expert cache per device shared by its layers, filled with `hot` and as large, or
    cache_slots, serving passes <= cache_max_pass tokens, uploading misses) or "decay" (buun: decaying-count cache
    for decode only, warmed with `hot`, misses on the CPU, swaps at token boundaries). The dynamic ones follow the
    engine's rules (ostinato.residency.caches). Names are the engine presets' (ostinato.presets).
    prefill: "paths" (split below Np, upload at or above), "native" (all cold routes on the CPU below Np, upload of
    the distinct cold experts at or above: the resident experts are ignored by passes > cache_max_pass).
    decode_overlap: CPU and GPU branches concurrently (max(C, G)) or in turn (C + G).
    """

    name: str
    residency: str
    prefill: str
    decode_overlap: bool
    hot: np.ndarray | None = None           # bool [n_layer, n_expert] (static, decay warm start)
    gpu_layers: np.ndarray | None = None    # bool [n_layer] (layers)
    cache_slots: int | None = None          # lru: slots per cache (None: the experts of `hot` on its device)
    layer_device: np.ndarray | None = None  # lru: device of each layer (one cache per device); None: one cache
    borrowed_slots: int = 0                 # static: one pool of decode-only slots, filled by decaying scores
    borrow: BorrowParams | None = None      # static: the engine's borrowed memory (--residency-borrow), its rules
    decode_delta_ms: float = 0.0            # per-step offset (e.g. the decode graph's saving, Table 8c)
    no_upload: bool = False                 # every cold route on the CPU in every pass, however large


def ostinato(hot: np.ndarray, borrowed_slots: int = 0, decode_delta_ms: float = 0.0) -> Policy:
    """Resident experts in every pass: split/upload prefill paths, overlapped decode (optionally borrowed slots)."""
    return Policy("ostinato", "static", "paths", True, hot=hot, borrowed_slots=borrowed_slots,
                  decode_delta_ms=decode_delta_ms)


def ostinato_borrow(hot: np.ndarray, borrow: BorrowParams, layer_device: np.ndarray | None = None,
                    decode_delta_ms: float = 0.0) -> Policy:
    """`ostinato` with the engine's borrowed memory (the preset `ostinato-borrow`): one pool per plan GPU
    (`layer_device`; None: one pool), its slots kept across requests and taken back by upload passes, the rules of
    `ostinato.residency.borrow`."""
    return Policy("ostinato-borrow", "static", "paths", True, hot=hot, borrow=borrow, layer_device=layer_device,
                  decode_delta_ms=decode_delta_ms)


def resident_native(hot: np.ndarray, overlap: bool = True) -> Policy:
    """Ablation: resident experts for decode, llama.cpp's native prefill (the branches overlapped, or in turn)."""
    return Policy("ostinato-native-prefill" + ("-overlap" if overlap else ""), "static", "native", overlap, hot=hot)


def static_per_layer(hot: np.ndarray) -> Policy:
    """A static uniform per-layer split (KTransformers' default placement): every cold route on the CPU in every pass
    (no uploads), the branches overlapped in decode."""
    return Policy("ktransformers-placement", "static", "paths", True, hot=hot, no_upload=True)


def llama_layers(gpu_layers: np.ndarray) -> Policy:
    """llama.cpp layer placement: whole MoE layers on the GPU; passes >= Np upload the CPU layers' experts."""
    return Policy("llama.cpp-layers", "layers", "native", False, gpu_layers=np.asarray(gpu_layers, dtype=bool))


def llama_expert_cache(hot: np.ndarray, layer_device: np.ndarray | None = None, slots: int | None = None) -> Policy:
    """llama.cpp expert cache: LRU shared by the layers of each device, filled with `hot`, passes <= 32 tokens,
    misses uploaded."""
    return Policy("llama.cpp-expert-cache", "lru", "native", False, hot=hot, cache_slots=slots,
                  layer_device=None if layer_device is None else np.asarray(layer_device))


def buun(warm_hot: np.ndarray) -> Policy:
    """buun: decaying-count cache for decode, warmed from the profile; upload threshold Np; overlap on."""
    return Policy("buun", "decay", "native", True, hot=warm_hot)
