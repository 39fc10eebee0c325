"""The memory model's terms, from a GGUF and from what the engine reports, checked against the engine's own numbers.

Weights come from the GGUF's tensors (per layer: dense bytes and the bytes of one routed expert; the output
head; token embeddings stay on the CPU) and are checked against the model buffers llama-server reports. The
context (KV caches, compressor states, output buffer) is read from the server's start-up log
(`... buffer size = X MiB`) at three context sizes, fitted as fixed + per token on two and checked on the third.
The compute buffers grow with the context too (attention scores) but not linearly (the graph allocator reuses
memory), so the memory model takes them as reported at the largest context and the run's batch size, which
bounds them for every shorter context; how far a line through the two smaller sizes misses the largest is
reported. The terms become a memory-model YAML for `ostinato residency capacity`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ostinato.server.launcher import LlamaServer, ServerConfig

MIB = 2**20
# "<time> I <func>:  <device> <what> buffer size =  X MiB", e.g. "llama_kv_cache:  CPU KV buffer size =  1.00 MiB"
BUFFER_RE = re.compile(r"\s(\w+):\s+(\S+)\s+(.*?)\s*buffer size =\s+([0-9.]+) MiB")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_EXPERTS = re.compile(r"^blk\.\d+\.ffn_(?:gate|up|down|gate_up)_exps\.")


@dataclass(frozen=True)
class Buffers:
    """Buffers one llama-server start reported, in bytes, by kind (model, context, compute) and device."""

    model: dict[str, float]
    context: dict[str, float]
    compute: dict[str, float]
    lines: dict[str, int]          # reported lines per kind (each rounded to 0.01 MiB)

    def total(self, kind: str) -> float:
        """All devices' bytes of one kind."""
        return float(sum(getattr(self, kind).values()))


def parse_buffers(log_text: str) -> Buffers:
    """The buffer sizes of a server log: `model` (weights), `compute`, and `context` (KV, states, output)."""
    out: dict[str, dict[str, float]] = {"model": {}, "context": {}, "compute": {}}
    lines = {"model": 0, "context": 0, "compute": 0}
    for _, dev, what, mib in BUFFER_RE.findall(log_text):
        kind = "model" if what == "model" else "compute" if what == "compute" else "context"
        out[kind][dev] = out[kind].get(dev, 0.0) + float(mib) * MIB
        lines[kind] += 1
    if not lines["model"] or not lines["compute"]:
        raise ValueError("the server log reports no model or compute buffer sizes (start llama-server with -lv 4)")
    return Buffers(out["model"], out["context"], out["compute"], lines)


@dataclass(frozen=True)
class GgufWeights:
    """Weight bytes of a GGUF: per layer dense and per-expert bytes, output head, token embeddings."""

    n_layer: int
    n_expert: int
    n_expert_used: int
    dense_bytes: tuple[int, ...]
    expert_bytes: tuple[int, ...]   # one routed expert per layer (0: dense layer)
    output_bytes: int               # output head, final norm and every other tensor outside the blocks
    token_embd_bytes: int

    @property
    def total(self) -> int:
        return (sum(self.dense_bytes) + self.n_expert * sum(self.expert_bytes) + self.output_bytes
                + self.token_embd_bytes)


def gguf_weights(model: str | Path, tree: str | Path) -> GgufWeights:
    """Sum the GGUF's tensor bytes into the memory model's weight terms."""
    from ostinato.models.gguf_import import load_gguf

    reader = load_gguf(tree).GGUFReader(str(model))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    n_layer = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    def key(name: str) -> int:
        f = reader.fields.get(f"{arch}.{name}")
        return int(f.parts[-1][0]) if f is not None else 0

    n_expert, n_expert_used = key("expert_count"), key("expert_used_count")
    dense, experts = [0] * n_layer, [0] * n_layer
    output = embd = 0
    for t in reader.tensors:
        m = _BLOCK.match(t.name)
        n = int(t.n_bytes)
        if m and int(m.group(1)) < n_layer:
            il = int(m.group(1))
            if _EXPERTS.match(t.name) and n_expert:
                experts[il] += n // n_expert
            else:
                dense[il] += n
        elif t.name.startswith("token_embd."):
            embd += n
        else:
            output += n
    return GgufWeights(n_layer, n_expert, n_expert_used, tuple(dense), tuple(experts), output, embd)


def measure_buffers(server_bin: Path, model: Path, ctx: int, ubatch: int, log_path: Path,
                    extra_args: tuple[str, ...] = (), startup_timeout_s: float = 300) -> Buffers:
    """Start llama-server with this context and batch size, wait until it serves, stop it, read its buffers."""
    args = ["-c", str(ctx), "-b", str(max(ubatch, 2048)), "-ub", str(ubatch), "-fit", "off", "-lv", "4",
            *extra_args]
    log_path.unlink(missing_ok=True)  # the server appends: one start per log
    with LlamaServer(ServerConfig(binary=server_bin, model=model, args=args, log_path=log_path,
                                  startup_timeout_s=startup_timeout_s)):
        pass
    return parse_buffers(log_path.read_text(encoding="utf-8", errors="replace"))


@dataclass(frozen=True)
class LinearTerm:
    """bytes = fixed + per_unit * units, fitted on two sizes and checked on a third."""

    fixed_bytes: float
    per_unit_bytes: float
    check_units: int
    predicted_bytes: float
    reported_bytes: float
    tolerance_bytes: float

    @property
    def ok(self) -> bool:
        return abs(self.predicted_bytes - self.reported_bytes) <= self.tolerance_bytes


def fit_linear(sizes: tuple[int, int, int], reported: tuple[float, float, float], lines: int,
               rel_tol: float = 0.01) -> LinearTerm:
    """Fit on the first two sizes, predict the third; the tolerance allows 0.005 MiB of rounding per reported line
    and `rel_tol` of the reported size."""
    (a, b, c), (ya, yb, yc) = sizes, reported
    if a == b:
        raise ValueError(f"two different sizes needed to fit, got {a} and {b}")
    per = (yb - ya) / (b - a)
    fixed = ya - per * a
    return LinearTerm(fixed, per, c, fixed + per * c, yc, 2 * 0.005 * MIB * lines + rel_tol * yc)


@dataclass(frozen=True)
class MemoryCheck:
    """The memory model's terms and how they compare with the engine's reports."""

    weights: GgufWeights
    weights_reported_bytes: float
    weights_tolerance_bytes: float
    context: LinearTerm          # fixed + per token of context
    compute: LinearTerm          # compute buffers against the context: reported, not part of `ok`
    ctx_sizes: tuple[int, ...]
    n_ubatch: int
    device: str

    @property
    def weights_ok(self) -> bool:
        return abs(self.weights.total - self.weights_reported_bytes) <= self.weights_tolerance_bytes

    @property
    def ok(self) -> bool:
        """The weights and the context agree with the engine (the compute term is taken as measured)."""
        return self.weights_ok and self.context.ok

    def to_dict(self) -> dict:
        """Plain mapping (JSON), with the checks' outcomes."""
        return {"device": self.device, "ok": self.ok, "ctx_sizes": list(self.ctx_sizes), "n_ubatch": self.n_ubatch,
                "weights": {**asdict(self.weights), "gguf_total_bytes": self.weights.total,
                            "reported_bytes": self.weights_reported_bytes,
                            "tolerance_bytes": self.weights_tolerance_bytes, "ok": self.weights_ok},
                "context": {**asdict(self.context), "ok": self.context.ok},
                "compute": {**asdict(self.compute), "linear_in_context": self.compute.ok,
                            "used_bytes": self.compute.reported_bytes}}

    def memory_model(self, gpu_total_bytes: list[int], margin_bytes: int = 0, reserved_bytes: int = 0) -> dict:
        """A memory-model mapping for `ostinato residency capacity` (`kv_tokens` is set by the capacity rule).

        The context's fixed part (sliding-window caches, compressor states) and the compute buffers reported at
        the largest context go into the fixed compute term; the context's per-token part is spread evenly over
        the layers (the capacity test sums it over a GPU's layers). The resident pools' staging area holds one
        layer's experts, with one zero slot per route position beside it and beside the pool.
        """
        n = self.weights.n_layer
        return {
            "n_layer": n,
            "gpu_total_bytes": [int(x) for x in gpu_total_bytes],
            "dense_bytes": list(self.weights.dense_bytes),
            "expert_bytes": list(self.weights.expert_bytes),
            "kv_bytes_per_token": [int(round(self.context.per_unit_bytes / n))] * n,
            "kv_tokens": 0,
            "output_bytes": self.weights.output_bytes,
            "compute_fixed_bytes": int(round(self.compute.reported_bytes + max(self.context.fixed_bytes, 0))),
            "compute_bytes_per_token": 0,
            "n_ubatch": self.n_ubatch,
            "staging_experts": self.weights.n_expert,
            "zero_slots": 2 * self.weights.n_expert_used,
            "margin_bytes": int(margin_bytes),
            "reserved_bytes": int(reserved_bytes),
        }


def check_memory(server_bin: Path, model: Path, tree: Path, log_dir: Path, ctx_sizes: tuple[int, int, int],
                 n_ubatch: int, device: str = "CPU", extra_args: tuple[str, ...] = ()) -> MemoryCheck:
    """Start the engine at three context sizes with the run's batch size and compare its buffers with the model."""
    w = gguf_weights(model, tree)
    log_dir.mkdir(parents=True, exist_ok=True)
    by_ctx = [measure_buffers(server_bin, model, c, n_ubatch, log_dir / f"server-c{c}-ub{n_ubatch}.log", extra_args)
              for c in ctx_sizes]

    def on(b: Buffers, kind: str) -> float:
        return float(sum(v for k, v in getattr(b, kind).items() if k.startswith(device)))

    ctx = fit_linear(ctx_sizes, tuple(on(b, "context") for b in by_ctx), by_ctx[2].lines["context"])
    comp = fit_linear(ctx_sizes, tuple(on(b, "compute") for b in by_ctx), by_ctx[2].lines["compute"])
    reported = by_ctx[0].total("model")  # every weight is on some device (experts may stay in host memory)
    tol = 2 * 0.005 * MIB * by_ctx[0].lines["model"] + 0.01 * reported
    return MemoryCheck(w, reported, tol, ctx, comp, tuple(ctx_sizes), n_ubatch, device)
