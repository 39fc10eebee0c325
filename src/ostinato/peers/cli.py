"""`ostinato peers build|wheels`: build a pinned peer engine's server from its source, or fetch a Python peer's
pinned wheels (engine/peers.json)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from ostinato.engine.backend import resolve_backend
from ostinato.peers.build import PeerBuildRequest, build_peer
from ostinato.peers.pin import PEERS_FILE, load_peers
from ostinato.peers.wheels import fetch_wheels


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `peers` group with `build` and `wheels`."""
    group = subparsers.add_parser("peers", help="peer engines from pinned sources (engine/peers.json)")
    sub = group.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="check a peer's source against its pin and build its server with CMake")
    b.add_argument("name", help="the peer, a key of engines in engine/peers.json (e.g. ik_llama.cpp)")
    b.add_argument("--src", required=True, type=Path,
                   help="a git repository at the pinned commit (bare or a work tree), or a plain copy of its files")
    b.add_argument("--out", type=Path, default=None,
                   help="build directory: tree/, cmake/, bin/, manifest.json, build.log (default build/peers/NAME/BACKEND)")
    b.add_argument("--backend", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (default) or cuda (needs nvcc; the GPU machine)")
    b.add_argument("--cuda-arch", default=None, help="with --backend cuda: CMAKE_CUDA_ARCHITECTURES (default: the GPU's)")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel compile jobs (default: all cores)")
    b.add_argument("--pins", type=Path, default=PEERS_FILE, help=f"the pin file (default {PEERS_FILE})")
    b.set_defaults(func=build_cmd)
    w = sub.add_parser("wheels", help="download a Python peer's pinned wheels (those small enough to carry) and "
                                      "check their sha256")
    w.add_argument("name", help="the peer, a key of wheels in engine/peers.json (freetoken, ktransformers)")
    w.add_argument("--dest", required=True, type=Path, help="directory for the wheels (e.g. .carry/peers/wheels)")
    w.add_argument("--all", action="store_true", help="also the wheels marked carry: false (too large to carry)")
    w.add_argument("--pins", type=Path, default=PEERS_FILE, help=f"the pin file (default {PEERS_FILE})")
    w.set_defaults(func=wheels_cmd)


def build_cmd(args: argparse.Namespace) -> int:
    """Handler of `peers build`."""
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if not args.pins.is_file():
        raise FileNotFoundError(f"--pins {args.pins} not found (run from the repository root or pass --pins)")
    pin = load_peers(args.pins).engine(args.name)
    backend = resolve_backend(args.backend, args.cuda_arch)
    if backend.name == "cpu":
        backend = replace(backend, reason="--backend cpu")
    out = args.out if args.out is not None else Path("build") / "peers" / args.name / backend.name
    manifest = build_peer(PeerBuildRequest(pin=pin, src=args.src.resolve(), out=out, backend=backend, jobs=args.jobs))
    for path, digest in manifest.binaries.items():
        print(f"{out.resolve() / path}  sha256 {digest}")
    return 0


def wheels_cmd(args: argparse.Namespace) -> int:
    """Handler of `peers wheels`."""
    if not args.pins.is_file():
        raise FileNotFoundError(f"--pins {args.pins} not found (run from the repository root or pass --pins)")
    peers = load_peers(args.pins)
    if args.name not in peers.wheels:
        raise ValueError(f"no pinned wheels for {args.name!r} in {args.pins}; known: {', '.join(sorted(peers.wheels))}")
    chosen = [w for w in peers.wheels[args.name] if w.carry or args.all]
    paths = fetch_wheels(chosen, args.dest)
    total = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} wheel(s) of {args.name} in {args.dest}, {total / 2**20:.1f} MiB, sha256 as pinned")
    return 0
