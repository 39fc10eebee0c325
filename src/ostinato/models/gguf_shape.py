"""The MoE shape of a GGUF model as a residency plan needs it: layers, experts, k and bytes of one expert per layer."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_(ch)?exps\.weight$")


@dataclass(frozen=True)
class MoeShape:
    """What a plan file's `model` block states about a model (engine checks every field)."""

    name: str
    n_layer: int
    n_expert: int
    n_expert_used: int
    expert_bytes: tuple[int, ...]  # per layer: bytes of one routed expert (0: no routed experts)
    n_vocab: int = 0               # tokens of the model's vocabulary (0: unknown)

    def moe_layers(self) -> list[int]:
        return [i for i, b in enumerate(self.expert_bytes) if b > 0]


def moe_shape_from_gguf(model: str | Path, tree: str | Path) -> MoeShape:
    """Read the shape from the GGUF's metadata and expert tensors (with the pinned tree's gguf-py)."""
    from ostinato.models.gguf_import import load_gguf

    reader = load_gguf(tree).GGUFReader(str(model))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()

    def key(name: str) -> int:
        f = reader.fields.get(f"{arch}.{name}")
        if f is None:
            raise ValueError(f"{model}: GGUF key {arch}.{name} missing (expected a MoE model)")
        return int(f.parts[-1][0])

    n_layer, n_expert, n_used = key("block_count"), key("expert_count"), key("expert_used_count")
    per_layer = [0] * n_layer
    for t in reader.tensors:
        m = _EXPERT_TENSOR.match(t.name)
        if m and int(m.group(1)) < n_layer:
            per_layer[int(m.group(1))] += int(t.n_bytes) // n_expert
    if not any(per_layer):
        raise ValueError(f"{model}: no routed-expert tensors (blk.N.ffn_*_exps.weight); is it a MoE model?")
    toks = reader.fields.get("tokenizer.ggml.tokens")
    return MoeShape(Path(model).stem, n_layer, n_expert, n_used, tuple(per_layer), len(toks.data) if toks else 0)


def moe_shape_from_spec(spec_name: str, expert_type: str) -> MoeShape:
    """The shape `ostinato models synth --spec NAME` gives a model with experts of `expert_type`, without the GGUF
    (every block of a synthesized model has routed experts; the model takes the spec's name)."""
    from ostinato.models.layout import BLOCK_BYTES
    from ostinato.models.spec import get_spec
    from ostinato.models.vocab import VOCAB_SIZES

    spec = get_spec(spec_name)
    if expert_type not in BLOCK_BYTES:
        raise ValueError(f"expert type {expert_type!r}: expected one of {', '.join(BLOCK_BYTES)}")
    block, size = BLOCK_BYTES[expert_type]
    return MoeShape(spec.name, spec.n_layer, spec.n_expert, spec.n_expert_used,
                    (spec.expert_params() // block * size,) * spec.n_layer, VOCAB_SIZES[spec.vocab])
