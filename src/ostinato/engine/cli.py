"""`ostinato engine ...`: build the variants, show the backend, and the patch-queue workflow."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from ostinato.engine.backend import BACKENDS, resolve_backend
from ostinato.engine.carry import pack_build, repart_pack, unpack_build
from ostinato.engine.devtree import export_tree, make_tree
from ostinato.engine.patches import STAGES
from ostinato.engine.pin import load_pin
from ostinato.engine.source import fetch_sdist, pack_tree, unpack_tree
from ostinato.engine.stages import DEFAULT_TARGETS, BuildRequest, build


def _variants(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in names if v not in STAGES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"--variants {text!r}: expected a comma list of {', '.join(STAGES)}")
    return names


def _cmd_build(args: argparse.Namespace) -> int:
    backend = resolve_backend(args.backend, args.cuda_arch)
    out = Path(args.out) / backend.name if args.per_backend_dir else Path(args.out)
    req = BuildRequest(repo=Path(args.repo).resolve(), out=out.resolve(), backend=backend,
                       variants=args.variants, targets=tuple(args.targets), op_tests=args.op_tests, jobs=args.jobs,
                       sdist=Path(args.sdist) if args.sdist else None,
                       source_tarball=Path(args.source_tarball) if args.source_tarball else None,
                       log=Path(args.log).resolve() if args.log else None)
    print(f"[engine] backend {backend.name}: {backend.reason}")
    manifests = build(req)
    for v, m in manifests.items():
        print(f"[engine] {v}: {out / v / 'bin'} ({m.backend}, {m.build_seconds:.0f} s)")
    return 0


def _cmd_pack_source(args: argparse.Namespace) -> int:
    repo = Path(args.repo).resolve()
    pin = load_pin(repo / "engine" / "pin.json")
    tree = unpack_tree(fetch_sdist(pin, repo / "build" / "cache", Path(args.sdist) if args.sdist else None),
                       pin, repo / "build" / "engine" / "source")
    out = pack_tree(tree, Path(args.out).resolve())
    print(f"{out}: llama.cpp b{pin.build_number} ({pin.short_commit}), {out.stat().st_size / 1e6:.1f} MB")
    return 0


def _cmd_pack_build(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    path, index = pack_build(Path(args.engine_dir), args.variants, Path(args.out), Path(args.repo).resolve(),
                             part_bytes=args.part_size << 20, op_tests=args.op_tests)
    packed = sum(p.bytes for p in index.parts)
    print(f"{path}: {', '.join(index.variants)} ({index.backend}), {index.raw_bytes / 1e6:.1f} MB in "
          f"{len(index.parts)} part(s) of {packed / 1e6:.1f} MB, {time.monotonic() - t0:.0f} s")
    return 0


def _cmd_repart_pack(args: argparse.Namespace) -> int:
    path, index = repart_pack([Path(s) for s in args.src], Path(args.out), args.part_size << 20)
    sizes = ", ".join(f"{p.name} {p.bytes / 1e6:.1f} MB" for p in index.parts)
    print(f"{path}: {', '.join(index.variants)} ({index.backend}) in {len(index.parts)} part(s): {sizes}")
    return 0


def _cmd_unpack_build(args: argparse.Namespace) -> int:
    index, unpacked = unpack_build(Path(args.src), Path(args.out), Path(args.repo).resolve())
    what = "unpacked" if unpacked else "already there, left as it is:"
    print(f"[engine] {what} {', '.join(index.variants)} ({index.backend}) in {Path(args.out) / index.backend}, "
          f"packed from commit {index.commit[:12] or 'unknown'} at {index.packed_at}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    b = resolve_backend(args.backend, args.cuda_arch)
    print(json.dumps({"backend": b.name, "reason": b.reason, "cmake_args": list(b.cmake_args)}, indent=2))
    return 0


def _cmd_tree(args: argparse.Namespace) -> int:
    repo = Path(args.repo).resolve()
    built = sorted((repo / "build" / "engine").glob("*/tree"))
    dest = make_tree(repo, Path(args.dir).resolve(), args.stage, repo / "build" / "cache",
                     Path(args.sdist) if args.sdist else None, base_tree=built[0] if built else None)
    print(f"{dest}: branch 'work' at the {args.stage} stage; edit, commit, then "
          f"`ostinato engine export --dir {args.dir} --stage {args.stage}`")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    written = export_tree(Path(args.repo).resolve(), Path(args.dir).resolve(), args.stage)
    for p in written:
        print(p)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `engine` group."""
    p = sub.add_parser("engine", help="build the patched llama.cpp and manage its patch queue")
    g = p.add_subparsers(dest="engine_cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--repo", default=".", help="project root holding engine/ (default: .)")
    common.add_argument("--sdist", help="local copy of the pinned llama-cpp-python sdist (else pip downloads it)")

    b = g.add_parser("build", parents=[common], help="build the engine variants (staged, incremental)")
    b.add_argument("--backend", choices=BACKENDS, default="auto")
    b.add_argument("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES (default: the visible GPUs')")
    b.add_argument("--variants", type=_variants, default=STAGES, help="comma list (default: all)")
    b.add_argument("--targets", nargs="+", default=list(DEFAULT_TARGETS))
    b.add_argument("--op-tests", action="store_true",
                   help="also build each stage's op tests (the ostinato stage: test-backend-ops, test-residency-ops)")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    b.add_argument("--out", default="build/engine", help="output root (default: build/engine)")
    b.add_argument("--per-backend-dir", action=argparse.BooleanOptionalAction, default=True,
                   help="put the build under <out>/<backend> (default: on)")
    b.add_argument("--log", help="build log file (default: <out>/build.log)")
    b.add_argument("--source-tarball", help="use a tree packed by `engine pack-source` instead of the sdist")
    b.set_defaults(func=_cmd_build)

    k = g.add_parser("pack-source", parents=[common],
                     help="pack the pinned tree (checksum-verified sdist) as a small tar.gz to carry elsewhere")
    k.add_argument("--out", required=True)
    k.set_defaults(func=_cmd_pack_source)

    pb = g.add_parser("pack-build", parents=[common],
                      help="pack built variants (binaries, manifests, the tree's gguf-py) as xz parts to carry to "
                           "another machine of the same kind")
    pb.add_argument("--engine-dir", default="build/engine/cuda", help="the build (default: build/engine/cuda)")
    pb.add_argument("--variants", type=_variants, default=("stock", "ostinato"),
                    help="comma list (default: stock,ostinato)")
    pb.add_argument("--out", required=True, help="folder for engine-<backend>.json and its parts")
    pb.add_argument("--part-size", type=int, default=15, help="MiB per part, at least 1 (default: 15)")
    pb.add_argument("--op-tests", action="store_true",
                    help="also pack the op tests the build has (default: llama-server and llama-bench alone)")
    pb.set_defaults(func=_cmd_pack_build)

    rp = g.add_parser("repart-pack",
                      help="cut a pack made by `engine pack-build` into parts of another size (its parts checked)")
    rp.add_argument("--from", dest="src", action="append", required=True,
                    help="a folder holding the index or some of its parts (repeat for parts kept in several)")
    rp.add_argument("--out", required=True, help="folder for the index and its new parts (not one of --from)")
    rp.add_argument("--part-size", type=int, required=True, help="MiB per part, at least 1")
    rp.set_defaults(func=_cmd_repart_pack)

    ub = g.add_parser("unpack-build", parents=[common],
                      help="unpack a build packed by `engine pack-build` after checking its parts and engine sources")
    ub.add_argument("--from", dest="src", required=True, help="the folder holding engine-<backend>.json and its parts")
    ub.add_argument("--out", default="build/engine", help="output root (default: build/engine)")
    ub.set_defaults(func=_cmd_unpack_build)

    i = g.add_parser("info", help="show which backend `auto` resolves to here, and why")
    i.add_argument("--backend", choices=BACKENDS, default="auto")
    i.add_argument("--cuda-arch")
    i.set_defaults(func=_cmd_info)

    t = g.add_parser("tree", parents=[common], help="make a developer tree with the patches as commits")
    t.add_argument("--dir", required=True, help="where to create the tree")
    t.add_argument("--stage", choices=STAGES[1:], default="stock")
    t.set_defaults(func=_cmd_tree)

    e = g.add_parser("export", parents=[common], help="write a developer tree's commits back to engine/patches")
    e.add_argument("--dir", required=True, help="the developer tree")
    e.add_argument("--stage", choices=STAGES[1:], required=True)
    e.set_defaults(func=_cmd_export)
