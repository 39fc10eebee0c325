"""`ostinato models …`: synthesize GGUF models from named specs, download real ones, list the specs."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ostinato.models.download import check_sha256, check_url, download
from ostinato.models.gguf_import import gguf_py_dir
from ostinato.models.layout import BLOCK_BYTES, STORAGE_TYPES, Types, total_bytes, total_params
from ostinato.models.router import ROUTERS, Router
from ostinato.models.spec import ModelSpec, get_spec, slice_name, spec_names
from ostinato.models.vocab import VOCAB_KINDS, VOCAB_SIZES

_GIB = float(1 << 30)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `models` group with `synth`, `download` and `specs`."""
    group = subparsers.add_parser("models", help="synthesize or download GGUF models")
    sub = group.add_subparsers(dest="models_command", required=True)

    synth = sub.add_parser("synth", help="write a random-weight GGUF from a named shape spec")
    synth.add_argument("--spec", required=True, help=f"spec name: {', '.join(spec_names())}")
    synth.add_argument("--out", required=True, help="output .gguf path (written atomically)")
    synth.add_argument("--llama-tree", required=True, help="llama.cpp source tree whose gguf-py writes the file")
    synth.add_argument("--vocab", choices=VOCAB_KINDS, help="vocabulary (default: the spec's)")
    synth.add_argument("--expert-type", choices=STORAGE_TYPES, default="mxfp4", help="routed experts (default mxfp4)")
    synth.add_argument("--dense-type", choices=("f16", "f32"), default="f16",
                       help="attention, router, embeddings and shared experts (default f16)")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synth.add_argument("--router", choices=ROUTERS, default="random",
                       help="random: the router's random weights alone (default); calibrated: selection biases and "
                            "hash tables (deepseek4) or a bias carried by the router weights (qwen3moe) from an "
                            "expert ranking, skewed like the paper's routing facts (docs/routing.md; the routing "
                            "is an input, not evidence)")
    synth.add_argument("--router-ranking", default="moe-l2", metavar="SOURCE",
                       help="with --router calibrated: the experts' ranking per layer: moe-l2 (DeepSeek-V4-Flash's "
                            "hot lists, placeholder layers seeded; default), seeded, or profile:PATH (a routing "
                            "profile of `ostinato residency profile`, most routed first)")
    synth.add_argument("--router-seed", type=int, default=0,
                       help="with --router calibrated: seed of the rankings' seeded parts (default 0)")
    synth.add_argument("--workers", type=int, default=None, metavar="N",
                       help="threads that draw the random data (default: the cores this process may use, at most "
                            "8); the file's bytes are the same for any N")
    synth.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="progress bar (default: only for writes over 256 MiB)")
    synth.set_defaults(func=run_synth)

    dl = sub.add_parser("download", help="download a GGUF and verify its sha256")
    dl.add_argument("--url", required=True, help="http(s):// or file:// URL")
    dl.add_argument("--sha256", required=True, help="expected sha256 (64 hex digits)")
    dl.add_argument("--out", required=True, help="destination path (only verified data is ever moved there)")
    dl.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bar")
    dl.set_defaults(func=run_download)

    specs = sub.add_parser("specs", help="list the named specs with their sizes")
    specs.add_argument("--layers", type=int, default=8, help="L used for the *-slice-L specs (default 8)")
    specs.add_argument("--expert-type", choices=STORAGE_TYPES, default="mxfp4")
    specs.add_argument("--dense-type", choices=("f16", "f32"), default="f16")
    specs.set_defaults(func=run_specs)


def run_synth(args: argparse.Namespace) -> int:
    """Handle `models synth`."""
    from ostinato.models.synth import synthesize

    spec = get_spec(args.spec)
    router = Router(args.router, args.router_ranking, args.router_seed)
    gguf_py_dir(args.llama_tree)
    types = Types(args.expert_type, args.dense_type)
    result = synthesize(spec, args.out, args.llama_tree, vocab=args.vocab, types=types, seed=args.seed,
                        progress=args.progress, router=router, workers=args.workers)
    routing = f", router {router.kind}" + (f" ({router.ranking})" if router.calibrated else "")
    print(f"{result.path}: {spec.name} ({spec.arch}), {result.n_tensors} tensors, vocab {result.n_vocab}, "
          f"{result.file_bytes / _GIB:.3f} GiB in {result.seconds:.1f} s{routing}")
    return 0


def run_download(args: argparse.Namespace) -> int:
    """Handle `models download`."""
    check_url(args.url)
    check_sha256(args.sha256)
    result = download(args.url, args.sha256, args.out, progress=args.progress)
    state = "already present, verified" if result.reused else "downloaded, verified"
    print(f"{result.path}: {result.size} bytes, {state}")
    return 0


@dataclass(frozen=True)
class SpecRow:
    """One line of the `models specs` table."""

    spec: ModelSpec
    params: int
    file_bytes: int
    expert_bytes: int


def spec_rows(layers: int, types: Types) -> list[SpecRow]:
    """Sizes of every named spec (slices at `layers` layers) with these storage types and the spec's vocabulary."""
    rows = []
    for name in spec_names():
        family = name.removesuffix("-slice-L")
        spec = get_spec(slice_name(family, layers) if family != name else name)
        n_vocab = VOCAB_SIZES[spec.vocab]
        block, size = BLOCK_BYTES[types.expert]
        expert_bytes = spec.expert_params() // block * size
        rows.append(SpecRow(spec, total_params(spec, n_vocab), total_bytes(spec, n_vocab, types), expert_bytes))
    return rows


def _count(n: int) -> str:
    """A parameter count in M or B."""
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def _size(n: int) -> str:
    """A byte count in MiB or GiB."""
    return f"{n / _GIB:.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.2f} MiB"


def run_specs(args: argparse.Namespace) -> int:
    """Handle `models specs`: one line per spec."""
    rows = spec_rows(args.layers, Types(args.expert_type, args.dense_type))
    header = ("spec", "arch", "layers", "hidden", "experts", "top-k", "exp.ffn", "shared", "heads(q/kv x d)",
              "vocab", "params", "expert MB", "data")
    table = [header]
    for r in rows:
        s = r.spec
        table.append((s.name, s.arch, str(s.n_layer), str(s.hidden), str(s.n_expert), str(s.n_expert_used),
                      str(s.expert_ffn), str(s.n_shared), f"{s.n_head}/{s.n_head_kv} x {s.head_dim}",
                      f"{s.vocab} ({VOCAB_SIZES[s.vocab]})", _count(r.params), f"{r.expert_bytes / 1e6:.4g}",
                      _size(r.file_bytes)))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"types: experts {args.expert_type}, dense {args.dense_type}; slices shown at L={args.layers}",
          file=sys.stderr)
    return 0
