"""Which tensors a `qwen3moe` / `deepseek4` GGUF holds, their ggml shapes, storage types and initial values.

Shapes follow llama.cpp's loaders (`src/models/qwen3moe.cpp`, `src/models/deepseek4.cpp`), in ggml order
(ne0 first). Initial scales keep activations O(1) through the blocks: matrices are N(0, 1/fan_in),
output projections are further scaled by 1/sqrt(2 n_layer), norms are 1, biases 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from ostinato.models.router import LayerRouting, Router, calibrated_layers
from ostinato.models.spec import ModelSpec

Init = Literal["normal", "const", "hc_base", "hash_route", "values"]
STORAGE_TYPES = ("mxfp4", "q8_0", "f16", "f32")
# (elements per block, bytes per block) of the ggml types written here
BLOCK_BYTES: dict[str, tuple[int, int]] = {
    "mxfp4": (32, 17),
    "q8_0": (32, 34),
    "f16": (1, 2),
    "f32": (1, 4),
    "i32": (1, 4),
}


@dataclass(frozen=True)
class TensorPlan:
    """One tensor to write: name, ggml shape (ne0 first), storage type, and how to fill it."""

    name: str
    ne: tuple[int, ...]
    dtype: str  # a key of BLOCK_BYTES
    init: Init = "normal"
    std: float = 0.0  # for "normal"
    value: float = 0.0  # for "const"
    n_expert: int = 0  # for "hash_route": experts to draw from
    values: tuple[float, ...] = ()  # for "values": the data; for "hash_route": a selection bias to draw rows with
    pin_col: int = -1  # for dense "normal": element pin_col of row r is pin_values[r % len(pin_values)]
    pin_values: tuple[float, ...] = ()
    zero_rows: tuple[int, int] = (0, 0)  # (period, index): rows r with r % period == index are all zero
    # for dense "normal": row r becomes sqrt(1 - w_r^2) row_r + w_r v, v one random row of the same std (a logit
    # every row shares); for "hash_route": the same weights of a token's shared logit when drawing rows
    mix_rows: tuple[float, ...] = ()

    @property
    def n_elements(self) -> int:
        """Number of elements."""
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        """Size of the stored data in bytes."""
        block, size = BLOCK_BYTES[self.dtype]
        if self.ne[0] % block:
            raise ValueError(f"tensor {self.name}: ne0={self.ne[0]} is not a multiple of the {self.dtype} block {block}")
        return self.n_elements // block * size


@dataclass(frozen=True)
class Types:
    """Storage types chosen for routed experts and for the other (dense) matrices."""

    expert: str = "mxfp4"
    dense: str = "f16"

    def __post_init__(self) -> None:
        """Check both names."""
        if self.expert not in STORAGE_TYPES:
            raise ValueError(f"--expert-type {self.expert!r}: expected one of {', '.join(STORAGE_TYPES)}")
        if self.dense not in ("f16", "f32"):
            raise ValueError(f"--dense-type {self.dense!r}: expected f16 or f32")


def _mat(name: str, ne: tuple[int, ...], dtype: str, gain: float = 1.0) -> TensorPlan:
    """A matrix with fan-in ne0, drawn N(0, gain^2 / ne0)."""
    return TensorPlan(name, ne, dtype, "normal", std=gain / math.sqrt(ne[0]))


def _vec(name: str, ne: tuple[int, ...], value: float) -> TensorPlan:
    """An F32 tensor filled with `value` (norm weights, biases, scales)."""
    return TensorPlan(name, ne, "f32", "const", value=value)


def _experts(spec: ModelSpec, i: int, types: Types, out_gain: float) -> list[TensorPlan]:
    """The routed experts of block i (gate, up: hidden -> ffn; down: ffn -> hidden) and the router."""
    d, f, e = spec.hidden, spec.expert_ffn, spec.n_expert
    return [
        _mat(f"blk.{i}.ffn_gate_inp.weight", (d, e), types.dense),
        _mat(f"blk.{i}.ffn_gate_exps.weight", (d, f, e), types.expert),
        _mat(f"blk.{i}.ffn_up_exps.weight", (d, f, e), types.expert),
        _mat(f"blk.{i}.ffn_down_exps.weight", (f, d, e), types.expert, out_gain),
    ]


# qwen3moe's calibrated router: hidden dimension 0 of the residual stream holds this constant for every token (the
# embeddings' column 0; no layer writes to it), so router weights on it act as a per-expert logit bias.
BIAS_DIM_VALUE = 8.0


def qwen3moe_tensors(spec: ModelSpec, n_vocab: int, types: Types, router: Router = Router()) -> list[TensorPlan]:
    """Tensors of a `qwen3moe` model (token embedding, GQA attention with QK-norm, MoE FFN, output head).

    qwen3moe has no selection bias: llama.cpp picks the top-k of softmax(ffn_gate_inp x), x the RMS-normed residual.
    A calibrated router makes one: every token embedding holds BIAS_DIM_VALUE in dimension 0, the attention and expert
    output projections never write to it (their row 0 is zero), the output head ignores it (column 0 zero), and
    `ffn_gate_inp`'s column 0 is the layer's bias / BIAS_DIM_VALUE. RMS norm scales every logit of a token alike,
    which leaves the top-k unchanged, so the selection is the top-k of N(0, s^2) logits + bias / s, with s the RMS of
    the residual stream's other dimensions (1 at the embeddings; it stays within a few percent of 1 through the
    depth for these weights, see docs/models.md)."""
    d, hd, dense = spec.hidden, spec.head_dim, types.dense
    out_gain = 1.0 / math.sqrt(2 * spec.n_layer)
    calibrated = (calibrated_layers(router, spec.n_layer, spec.n_expert, spec.n_expert_used, "softmax")
                  if router.calibrated else None)
    pinned = {"pin_col": 0} if calibrated else {}
    no_dim0 = {"zero_rows": (d, 0)} if calibrated else {}
    plans = [
        TensorPlan("token_embd.weight", (d, n_vocab), dense, "normal", std=1.0,
                   **({"pin_col": 0, "pin_values": (BIAS_DIM_VALUE,)} if calibrated else {})),
        _vec("output_norm.weight", (d,), 1.0),
        replace(_mat("output.weight", (d, n_vocab), dense), **pinned, **({"pin_values": (0.0,)} if calibrated else {})),
    ]
    for i in range(spec.n_layer):
        experts = _experts(spec, i, types, out_gain)
        if calibrated:
            gate_col = tuple(b / BIAS_DIM_VALUE for b in calibrated[i].bias)
            experts = [replace(experts[0], pin_col=0, pin_values=gate_col, mix_rows=calibrated[i].mix), experts[1],
                       experts[2], replace(experts[3], **no_dim0)]
        plans += [
            _vec(f"blk.{i}.attn_norm.weight", (d,), 1.0),
            _mat(f"blk.{i}.attn_q.weight", (d, hd * spec.n_head), dense),
            _mat(f"blk.{i}.attn_k.weight", (d, hd * spec.n_head_kv), dense),
            _mat(f"blk.{i}.attn_v.weight", (d, hd * spec.n_head_kv), dense),
            replace(_mat(f"blk.{i}.attn_output.weight", (hd * spec.n_head, d), dense, out_gain), **no_dim0),
            _vec(f"blk.{i}.attn_q_norm.weight", (hd,), 1.0),
            _vec(f"blk.{i}.attn_k_norm.weight", (hd,), 1.0),
            _vec(f"blk.{i}.ffn_norm.weight", (d,), 1.0),
            *experts,
        ]
    return plans


def _mixed(experts: list[TensorPlan], layer: LayerRouting | None) -> list[TensorPlan]:
    """The experts' tensors with the router's rows (`ffn_gate_inp`, first) sharing the calibrated layer's logit."""
    if layer is None or not layer.mix:
        return experts
    return [replace(experts[0], mix_rows=layer.mix), *experts[1:]]


def deepseek4_tensors(spec: ModelSpec, n_vocab: int, types: Types, router: Router = Router()) -> list[TensorPlan]:
    """Tensors of a `deepseek4` model: hyper-connections, MQA with low-rank Q/O, compressors, indexer, MoE.

    With a calibrated router, `exp_probs_b` holds each non-hash layer's selection bias and the `tid2eid` rows of
    the hash layers are drawn by that layer's biased router (ostinato.models.router)."""
    calibrated = (calibrated_layers(router, spec.n_layer, spec.n_expert, spec.n_expert_used)
                  if router.calibrated else None)
    d, hd, dense = spec.hidden, spec.head_dim, types.dense
    hc = spec.hc_mult
    hc_dim, hc_mix = hc * d, (2 + hc) * hc
    q_rank, n_head = spec.q_lora_rank, spec.n_head
    out_gain = 1.0 / math.sqrt(2 * spec.n_layer)
    shared_ffn = spec.expert_ffn * spec.n_shared
    plans = [
        TensorPlan("token_embd.weight", (d, n_vocab), dense, "normal", std=1.0),
        _vec("output_norm.weight", (d,), 1.0),
        _mat("output.weight", (d, n_vocab), dense),
        TensorPlan("output_hc_fn.weight", (hc_dim, hc), "f32", "normal", std=0.1 / math.sqrt(hc_dim)),
        _vec("output_hc_base.weight", (hc,), 0.0),
        _vec("output_hc_scale.weight", (1,), 1.0),
    ]
    for i in range(spec.n_layer):
        ratio = spec.compress_ratios[i]
        plans += [
            _vec(f"blk.{i}.attn_norm.weight", (d,), 1.0),
            _vec(f"blk.{i}.attn_sinks.weight", (n_head,), 0.0),
            _mat(f"blk.{i}.attn_q_a.weight", (d, q_rank), dense),
            _vec(f"blk.{i}.attn_q_a_norm.weight", (q_rank,), 1.0),
            _mat(f"blk.{i}.attn_q_b.weight", (q_rank, n_head * hd), dense),
            _mat(f"blk.{i}.attn_kv.weight", (d, hd), dense),
            _vec(f"blk.{i}.attn_kv_a_norm.weight", (hd,), 1.0),
            # stored 2-D; llama.cpp reshapes it to (n_head*hd/o_groups, o_lora_rank, o_groups)
            _mat(f"blk.{i}.attn_output_a.weight", (n_head * hd // spec.o_groups, spec.o_lora_rank * spec.o_groups), dense),
            _mat(f"blk.{i}.attn_output_b.weight", (spec.o_groups * spec.o_lora_rank, d), dense, out_gain),
        ]
        for part in ("attn", "ffn"):
            plans += [
                TensorPlan(f"blk.{i}.hc_{part}_fn.weight", (hc_dim, hc_mix), "f32", "normal", std=0.1 / math.sqrt(hc_dim)),
                TensorPlan(f"blk.{i}.hc_{part}_base.weight", (hc_mix,), "f32", "hc_base"),
                _vec(f"blk.{i}.hc_{part}_scale.weight", (3,), 1.0),
            ]
        if ratio:
            coff = 2 if ratio == 4 else 1
            plans += [
                _mat(f"blk.{i}.attn_compressor_kv.weight", (d, coff * hd), dense),
                _mat(f"blk.{i}.attn_compressor_gate.weight", (d, coff * hd), dense),
                TensorPlan(f"blk.{i}.attn_compressor_ape.weight", (coff * hd, ratio), "f32", "normal", std=0.02),
                _vec(f"blk.{i}.attn_compressor_norm.weight", (hd,), 1.0),
            ]
        if ratio == 4:
            ihd, ih = spec.indexer_head_dim, spec.indexer_heads
            plans += [
                _mat(f"blk.{i}.indexer.proj.weight", (d, ih), dense),
                _mat(f"blk.{i}.indexer.attn_q_b.weight", (q_rank, ih * ihd), dense),
                _mat(f"blk.{i}.indexer_compressor_kv.weight", (d, 2 * ihd), dense),
                _mat(f"blk.{i}.indexer_compressor_gate.weight", (d, 2 * ihd), dense),
                TensorPlan(f"blk.{i}.indexer_compressor_ape.weight", (2 * ihd, ratio), "f32", "normal", std=0.02),
                _vec(f"blk.{i}.indexer_compressor_norm.weight", (ihd,), 1.0),
            ]
        if i < spec.n_hash_layers:
            plans.append(
                TensorPlan(f"blk.{i}.ffn_gate_tid2eid.weight", (spec.n_expert_used, n_vocab), "i32", "hash_route",
                           n_expert=spec.n_expert, values=calibrated[i].bias if calibrated else (),
                           mix_rows=calibrated[i].mix if calibrated else ())
            )
        elif calibrated:
            plans.append(TensorPlan(f"blk.{i}.exp_probs_b.bias", (spec.n_expert,), "f32", "values",
                                    values=calibrated[i].bias))
        else:
            plans.append(_vec(f"blk.{i}.exp_probs_b.bias", (spec.n_expert,), 0.0))
        plans += [
            _vec(f"blk.{i}.ffn_norm.weight", (d,), 1.0),
            *_mixed(_experts(spec, i, types, out_gain), calibrated[i] if calibrated else None),
            _mat(f"blk.{i}.ffn_gate_shexp.weight", (d, shared_ffn), dense),
            _mat(f"blk.{i}.ffn_up_shexp.weight", (d, shared_ffn), dense),
            _mat(f"blk.{i}.ffn_down_shexp.weight", (shared_ffn, d), dense, out_gain),
        ]
    return plans


def tensor_plans(spec: ModelSpec, n_vocab: int, types: Types, router: Router = Router()) -> list[TensorPlan]:
    """All tensors of `spec` in file order (`router`: how the model routes; random by default)."""
    if spec.arch == "qwen3moe":
        return qwen3moe_tensors(spec, n_vocab, types, router)
    return deepseek4_tensors(spec, n_vocab, types, router)


def total_bytes(spec: ModelSpec, n_vocab: int, types: Types) -> int:
    """Bytes of tensor data (without padding and metadata) of `spec` with these types."""
    return sum(p.nbytes for p in tensor_plans(spec, n_vocab, types))


def total_params(spec: ModelSpec, n_vocab: int) -> int:
    """Number of parameters of `spec`."""
    return sum(p.n_elements for p in tensor_plans(spec, n_vocab, Types("f32", "f32")))
