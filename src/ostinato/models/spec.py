"""Named shape specs of the MoE models the project synthesizes (a registry plus `*-slice-L` name parsing)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

ARCHS = ("qwen3moe", "deepseek4")


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and hyperparameters of one synthesized model; every block has a MoE FFN (no leading dense blocks)."""

    name: str
    arch: str  # llama.cpp architecture: "qwen3moe" or "deepseek4"
    n_layer: int  # transformer blocks, each with a MoE FFN
    hidden: int  # embedding length
    expert_ffn: int  # FFN width of one routed (and shared) expert
    n_expert: int  # routed experts per layer
    n_expert_used: int  # top-k
    n_shared: int  # shared experts per layer (deepseek4 only)
    n_head: int
    n_head_kv: int
    head_dim: int  # key/value head size
    rope_dim: int  # rotary dimensions of a head
    vocab: str  # default vocabulary kind: "byte", "deepseek" or "qwen"
    context_length: int
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-6
    # deepseek4 only (see llama.cpp src/models/deepseek4.cpp)
    q_lora_rank: int = 0
    o_groups: int = 0
    o_lora_rank: int = 0
    sliding_window: int = 0
    compress_ratios: tuple[int, ...] = ()  # per layer: 0 (window only), 4 (CSA + indexer) or 128 (HCA)
    compress_rope_freq_base: float = 160000.0
    indexer_heads: int = 0
    indexer_head_dim: int = 0
    indexer_top_k: int = 0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    n_hash_layers: int = 0  # leading layers routed by token id (ffn_gate_tid2eid)
    expert_weights_scale: float = 1.0
    swiglu_clamp: float = 10.0
    doc: str = ""

    def __post_init__(self) -> None:
        """Reject shapes llama.cpp's loader or graph would refuse, with a message naming the field."""
        if self.arch not in ARCHS:
            raise ValueError(f"spec {self.name!r}: arch {self.arch!r} is not one of {ARCHS}")
        if self.n_layer < 1 or not 1 <= self.n_expert_used <= self.n_expert:
            raise ValueError(f"spec {self.name!r}: need n_layer >= 1 and 1 <= n_expert_used <= n_expert")
        if self.arch == "deepseek4":
            if len(self.compress_ratios) != self.n_layer:
                raise ValueError(f"spec {self.name!r}: compress_ratios needs one entry per layer ({self.n_layer})")
            if any(r not in (0, 4, 128) for r in self.compress_ratios):
                raise ValueError(f"spec {self.name!r}: compress_ratios entries must be 0, 4 or 128")
            if self.hc_mult != 4 or self.n_head_kv != 1 or self.n_head % self.o_groups:
                raise ValueError(f"spec {self.name!r}: deepseek4 needs hc_mult 4, n_head_kv 1, n_head % o_groups == 0")
            if self.n_hash_layers > self.n_layer:
                raise ValueError(f"spec {self.name!r}: n_hash_layers exceeds n_layer")
            # llama.cpp b11312 divides by zero (llama_kv_cache::build_input_k_rot) when the lightning-indexer
            # cache has no layer, or when head_dim == indexer_head_dim and any DSV4 cache has no layer.
            if 4 not in self.compress_ratios or self.head_dim == self.indexer_head_dim:
                raise ValueError(f"spec {self.name!r}: deepseek4 needs a ratio-4 layer and head_dim != indexer_head_dim")
            if self.indexer_head_dim % 64:
                raise ValueError(f"spec {self.name!r}: indexer_head_dim must be a multiple of 64")

    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up and down matrices)."""
        return 3 * self.hidden * self.expert_ffn


_TINY_QWEN3MOE = ModelSpec(
    name="tiny-qwen3moe",
    arch="qwen3moe",
    n_layer=4,
    hidden=64,
    expert_ffn=32,
    n_expert=16,
    n_expert_used=4,
    n_shared=0,
    n_head=4,
    n_head_kv=2,
    head_dim=16,
    rope_dim=16,
    vocab="byte",
    context_length=32768,
    rope_freq_base=1000000.0,
    doc="Tiny qwen3moe for tests: 4 MoE layers, hidden 64, 16 experts top-4 of FFN 32, GQA 4/2 heads of 16.",
)

_TINY_V4 = ModelSpec(
    name="tiny-v4",
    arch="deepseek4",
    n_layer=4,
    hidden=64,
    expert_ffn=64,
    n_expert=16,
    n_expert_used=4,
    n_shared=1,
    n_head=4,
    n_head_kv=1,
    head_dim=64,
    rope_dim=32,
    vocab="byte",
    context_length=32768,
    q_lora_rank=64,
    o_groups=2,
    o_lora_rank=32,
    sliding_window=32,
    compress_ratios=(0, 4, 128, 4),
    indexer_heads=4,
    indexer_head_dim=128,
    indexer_top_k=16,
    hc_sinkhorn_iters=4,
    n_hash_layers=1,
    expert_weights_scale=1.5,
    doc=(
        "Tiny deepseek4 for tests: 4 MoE layers (the first hash-routed), hidden 64, 16 experts top-4 of FFN 64 "
        "plus 1 shared, hyper-connections x4, window 32, one layer of each attention kind (window only, "
        "CSA ratio 4 with indexer top-16, HCA ratio 128)."
    ),
)

_MINI_V4 = ModelSpec(
    name="mini-v4",
    arch="deepseek4",
    n_layer=8,
    hidden=128,
    expert_ffn=64,
    n_expert=256,
    n_expert_used=6,
    n_shared=1,
    n_head=4,
    n_head_kv=1,
    head_dim=64,
    rope_dim=32,
    vocab="deepseek",
    context_length=32768,
    q_lora_rank=64,
    o_groups=2,
    o_lora_rank=32,
    sliding_window=128,
    compress_ratios=(4, 128, 4, 128, 4, 128, 4, 128),
    indexer_heads=4,
    indexer_head_dim=128,
    indexer_top_k=64,
    hc_sinkhorn_iters=4,
    n_hash_layers=3,
    expert_weights_scale=1.5,
    doc=(
        "Small deepseek4 with DeepSeek-V4-Flash's routing shape at a tiny width, for measuring a synthesized router on "
        "the CPU: 8 MoE layers (the first three hash-routed), 256 experts top-6 of FFN 64 plus 1 shared, hidden 128, "
        "CSA (ratio 4) and HCA (ratio 128) layers alternating, window 128, the DeepSeek-V4 vocabulary."
    ),
)

_MINI_QWEN3MOE = ModelSpec(
    name="mini-qwen3moe",
    arch="qwen3moe",
    n_layer=8,
    hidden=128,
    expert_ffn=64,
    n_expert=128,
    n_expert_used=8,
    n_shared=0,
    n_head=4,
    n_head_kv=2,
    head_dim=32,
    rope_dim=32,
    vocab="qwen",
    context_length=40960,
    rope_freq_base=1000000.0,
    doc=(
        "Small qwen3moe with Qwen3-235B-A22B's routing shape at a tiny width, for measuring a synthesized router on the "
        "CPU: 8 MoE layers, 128 experts top-8 of FFN 64, hidden 128, GQA 4/2 heads of 32, the Qwen3 vocabulary."
    ),
)

_V4FLASH_LAYERS = 43
_QWEN3_235B_LAYERS = 94


def v4flash_slice(n_layer: int) -> ModelSpec:
    """DeepSeek-V4-Flash cut to `n_layer` MoE layers (real deepseek4 architecture, real MoE shapes).

    Real (paper Table 1): hidden 4096, 256 routed experts of FFN 2048 (13.4 MB each in MXFP4), top-6,
    one shared expert per layer, sqrt-softplus routing with a per-expert bias, the first three layers
    hash-routed by token id (tid2eid), hyper-connections x4 with Sinkhorn mixing, vocabulary of 129,280.
    Attention keeps DeepSeek-V4's design (one shared 512-dim KV head, 64 query heads through a
    1024-rank Q LoRA, grouped low-rank output 8 x 1024, sliding window 128, CSA layers (ratio 4, 64-head
    indexer of dim 128, top-512) alternating with HCA layers (ratio 128), starting with CSA); these
    attention sizes are from the public release as best known here and are not verified against its
    config.json (the 43-layer spec totals 284.3 B parameters, the published 284 B), so attention timings
    are indicative only. Nothing is shrunk: at these sizes attention is ~40% of the per-token
    multiply-adds at short context, not the bulk. Not included: window-only (ratio 0) layers, because the
    pinned llama.cpp crashes on a model without a CSA layer (so a 1-layer slice must be CSA), and MTP.
    Context length is the pre-YaRN 65,536 (the paper runs YaRN x16 over it; pass the rope-scaling flags
    and -c to the engine).
    """
    if not 1 <= n_layer <= _V4FLASH_LAYERS:
        raise ValueError(f"--spec v4flash-slice-{n_layer}: L must be an integer in 1..{_V4FLASH_LAYERS}")
    ratios = tuple(4 if i % 2 == 0 else 128 for i in range(n_layer))
    return ModelSpec(
        name=f"v4flash-slice-{n_layer}",
        arch="deepseek4",
        n_layer=n_layer,
        hidden=4096,
        expert_ffn=2048,
        n_expert=256,
        n_expert_used=6,
        n_shared=1,
        n_head=64,
        n_head_kv=1,
        head_dim=512,
        rope_dim=64,
        vocab="deepseek",
        context_length=65536,
        q_lora_rank=1024,
        o_groups=8,
        o_lora_rank=1024,
        sliding_window=128,
        compress_ratios=ratios,
        indexer_heads=64,
        indexer_head_dim=128,
        indexer_top_k=512,
        hc_sinkhorn_iters=20,
        n_hash_layers=min(3, n_layer),
        expert_weights_scale=1.5,
        doc=(v4flash_slice.__doc__ or "").strip(),
    )


def qwen3_235b_slice(n_layer: int) -> ModelSpec:
    """Qwen3-235B-A22B cut to `n_layer` MoE layers; every shape is the real one (qwen3moe architecture).

    hidden 4096, 128 experts of FFN 1536, top-8, no shared expert, 64 query / 4 KV heads of 128 with
    QK-norm, rope base 1e6, vocabulary 151,936, context 40,960.
    """
    if not 1 <= n_layer <= _QWEN3_235B_LAYERS:
        raise ValueError(f"--spec qwen3-235b-slice-{n_layer}: L must be an integer in 1..{_QWEN3_235B_LAYERS}")
    return ModelSpec(
        name=f"qwen3-235b-slice-{n_layer}",
        arch="qwen3moe",
        n_layer=n_layer,
        hidden=4096,
        expert_ffn=1536,
        n_expert=128,
        n_expert_used=8,
        n_shared=0,
        n_head=64,
        n_head_kv=4,
        head_dim=128,
        rope_dim=128,
        vocab="qwen",
        context_length=40960,
        rope_freq_base=1000000.0,
        doc=(qwen3_235b_slice.__doc__ or "").strip(),
    )


_FIXED = {s.name: s for s in (_TINY_QWEN3MOE, _TINY_V4, _MINI_V4, _MINI_QWEN3MOE)}
_SLICES = {"v4flash": v4flash_slice, "qwen3-235b": qwen3_235b_slice}
# layers of the full models the slices are cut from (the largest L accepted)
SLICE_MAX_LAYERS = {"v4flash": _V4FLASH_LAYERS, "qwen3-235b": _QWEN3_235B_LAYERS}
_SLICE_RE = re.compile(r"^(?P<family>v4flash|qwen3-235b)-slice-(?P<n>.*)$")


def spec_names() -> list[str]:
    """Names accepted by `get_spec`, the slice families written with a literal `L`."""
    return [*_FIXED, *(f"{family}-slice-L" for family in _SLICES)]


def get_spec(name: str) -> ModelSpec:
    """Return the spec called `name` (`tiny-v4`, `tiny-qwen3moe`, `mini-v4`, `mini-qwen3moe`, `v4flash-slice-L`,
    `qwen3-235b-slice-L`)."""
    if name in _FIXED:
        return _FIXED[name]
    match = _SLICE_RE.match(name)
    if match is None:
        raise ValueError(f"--spec {name!r}: unknown spec; expected one of {', '.join(spec_names())} (L an integer)")
    text = match.group("n")
    if not text.isdigit():
        raise ValueError(f"--spec {name!r}: L must be a positive integer, got {text!r}")
    return _SLICES[match.group("family")](int(text))


def slice_name(family: str, n_layer: int) -> str:
    """`<family>-slice-<n_layer>`, with n_layer capped at the full model's layer count."""
    return f"{family}-slice-{min(n_layer, SLICE_MAX_LAYERS[family])}"


def with_layers(spec: ModelSpec, n_layer: int) -> ModelSpec:
    """Return `spec` with `n_layer` blocks (compress ratios and hash layers cut or extended to match)."""
    ratios = spec.compress_ratios
    if spec.arch == "deepseek4":
        ratios = tuple(ratios[i] if i < len(ratios) else ratios[-1] for i in range(n_layer))
    return replace(spec, n_layer=n_layer, compress_ratios=ratios, n_hash_layers=min(spec.n_hash_layers, n_layer))
