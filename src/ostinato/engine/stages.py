"""Staged build of the engine variants in one tree: upstream, then stock, then ostinato, sharing objects.

Each stage checks out the previous stage's commit, applies its patches, rebuilds incrementally (only the
files a stage changes recompile) and copies the binaries to <out>/<variant>/bin with a manifest.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ostinato.engine.backend import Backend
from ostinato.engine.gitutil import git
from ostinato.engine.patches import STAGES, apply_stage, fingerprint, stage_inputs, stage_patches
from ostinato.engine.pin import EnginePin, load_pin
from ostinato.engine.source import UPSTREAM_TAG, fetch_sdist, has_tree, unpack_tarball, unpack_tree

DEFAULT_TARGETS = ("llama-server", "llama-bench")
# op tests a stage builds beside the requested targets when asked (BuildRequest.op_tests): the cases for the ggml
# ops its patches change. The test suite asks for them; the pipeline does not, which keeps getting started short.
STAGE_TARGETS = {"ostinato": ("test-backend-ops", "test-residency-ops")}


@dataclass
class BuildRequest:
    """What to build: which variants, for which backend, into which directory."""

    repo: Path                      # the project root (holds engine/)
    out: Path                       # e.g. build/engine/cpu
    backend: Backend
    variants: tuple[str, ...] = STAGES
    targets: tuple[str, ...] = DEFAULT_TARGETS
    op_tests: bool = False          # also build and install each stage's op tests (STAGE_TARGETS)
    jobs: int = os.cpu_count() or 2
    sdist: Path | None = None       # a local copy of the pinned sdist (else pip downloads it)
    source_tarball: Path | None = None  # a tree packed by `ostinato engine pack-source` (instead of the sdist)
    cache: Path | None = None       # where the sdist is kept (default: <repo>/build/cache)
    log: Path | None = None         # build output goes here (default: <out>/build.log)


@dataclass
class VariantManifest:
    """What a variant's binaries were built from; written next to them as manifest.json."""

    variant: str
    backend: str
    backend_reason: str
    fingerprint: str
    build_number: int
    upstream_commit: str
    tree_commit: str
    patches: list[str]
    cmake_args: list[str]
    targets: list[str]
    build_seconds: float
    built_at: str
    # a sha256 over the stage's inputs alone (pin, patches, engine/src), without build options: the same for every
    # backend, so a replay can tell whether two builds on different machines ran the same engine code ("" in
    # manifests written before it was recorded)
    sources: str = ""


# On x86 the CPU backend is built without Intel AMX: with -march=native on a CPU that has it, llama.cpp b11312 gives
# the AMX buffer type F16 and quantized weights that a deepseek4 graph then multiplies in shapes the AMX kernels do not
# take (the scheduler aborts: GGML_ASSERT(*cur_backend_id != -1)). Explicit -mno-* flags win over -march=native.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _cmake_args(pin: EnginePin, backend: Backend, machine: str | None = None) -> list[str]:
    args = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
            f"-DLLAMA_BUILD_NUMBER={pin.build_number}", f"-DLLAMA_BUILD_COMMIT={pin.short_commit}"]
    if (machine or platform.machine()).lower() in ("x86_64", "amd64"):
        args += [f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}"]
    if shutil.which("ccache"):
        args += ["-DGGML_CCACHE=ON"]
    else:
        args += ["-DGGML_CCACHE=OFF"]
    return args + list(backend.cmake_args)


def _run(cmd: list[str], log: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''} failed (full log: {log}):\n{tail}")


def _manifest_path(out: Path, variant: str) -> Path:
    return out / variant / "manifest.json"


def read_manifest(out: Path, variant: str) -> VariantManifest | None:
    """The manifest of a built variant, or None if it was never built."""
    p = _manifest_path(out, variant)
    if not p.exists():
        return None
    return VariantManifest(**json.loads(p.read_text()))


def _with_op_tests(targets: tuple[str, ...], variant: str) -> tuple[str, ...]:
    return tuple(targets) + tuple(t for t in STAGE_TARGETS.get(variant, ()) if t not in targets)


def stage_targets(req: BuildRequest, variant: str) -> tuple[str, ...]:
    """What a variant builds and installs: the requested targets, and its op tests if asked for."""
    return _with_op_tests(req.targets, variant) if req.op_tests else tuple(req.targets)


def variant_fingerprint(req: BuildRequest, variant: str) -> str:
    """Changes whenever the variant's tree or build options change (the same with or without the op tests, so
    a build that adds them reuses the stage's tree and objects)."""
    engine = req.repo / "engine"
    pin = load_pin(engine / "pin.json")
    extra = "\n".join([req.backend.name, *_cmake_args(pin, req.backend), *_with_op_tests(req.targets, variant)])
    return fingerprint(stage_inputs(engine, variant), extra)


def sources_fingerprint(engine: Path, variant: str) -> str:
    """The variant's engine code (pin, patches, engine/src) as one sha256, without build options."""
    return fingerprint(stage_inputs(engine, variant))


def is_current(req: BuildRequest, variant: str) -> bool:
    """The variant's binaries exist and were built from the current inputs."""
    m = read_manifest(req.out, variant)
    return (m is not None and m.fingerprint == variant_fingerprint(req, variant)
            and all((req.out / variant / "bin" / t).exists() for t in stage_targets(req, variant)))


def _with_sources(req: BuildRequest, variant: str) -> VariantManifest:
    """The manifest of a current variant, its `sources` filled in if it was written before they were recorded (the
    fingerprint matched the current inputs, so the sources are the current ones)."""
    m = read_manifest(req.out, variant)
    assert m is not None
    if not m.sources:
        m.sources = sources_fingerprint(req.repo / "engine", variant)
        tmp = _manifest_path(req.out, variant).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(m), indent=2) + "\n")
        os.replace(tmp, _manifest_path(req.out, variant))
    return m


def _install(bin_dir: Path, dest: Path, targets: tuple[str, ...]) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for t in targets:
        shutil.copy2(bin_dir / t, tmp / t)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def build(req: BuildRequest, progress=print) -> dict[str, VariantManifest]:
    """Build the requested variants (and the stages before them) that are not current; return the manifests.

    Holds an exclusive lock on <out>/.lock, so a second build of the same tree (a test session beside a
    pipeline run) waits instead of changing the tree under the first.
    """
    req.out.mkdir(parents=True, exist_ok=True)
    with open(req.out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(req, progress)


def _build_locked(req: BuildRequest, progress) -> dict[str, VariantManifest]:
    engine = req.repo / "engine"
    pin = load_pin(engine / "pin.json")
    req.out.mkdir(parents=True, exist_ok=True)
    log = req.log or (req.out / "build.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    last = max(STAGES.index(v) for v in req.variants)
    wanted = STAGES[: last + 1]
    built = set(req.variants)  # earlier stages not asked for are applied to the tree but not compiled

    result: dict[str, VariantManifest] = {}
    if all(is_current(req, v) for v in built):
        return {v: _with_sources(req, v) for v in wanted if v in built}

    tree = req.out / "tree"
    if not has_tree(tree):
        if req.source_tarball is not None:
            unpack_tarball(req.source_tarball, pin, tree)
        else:
            unpack_tree(fetch_sdist(pin, req.cache or (req.repo / "build" / "cache"), req.sdist), pin, tree)
    bdir = req.out / "cmake"
    args = _cmake_args(pin, req.backend)
    env = {**os.environ, **req.backend.env}

    base = UPSTREAM_TAG
    made_from: dict[str, str] = {}  # stage -> the fingerprint of the inputs its tree was made from
    for stage in wanted:
        tag = f"stage/{stage}"
        if is_current(req, stage) and git(tree, "tag", "-l", tag).strip() == tag:
            progress(f"[engine] {stage}: up to date")
            result[stage] = _with_sources(req, stage)
            made_from[stage] = result[stage].fingerprint
            base = tag
            continue
        if stage not in built:
            # a stage under the requested ones: its patches go on the tree (tagged), nothing is compiled
            # (an annotated tag whose message is the stage's fingerprint, so a changed patch re-applies it)
            git(tree, "am", "--abort", check=False)
            fp = variant_fingerprint(req, stage)
            if git(tree, "tag", "-l", "--format=%(contents)", tag).strip() != fp:
                progress(f"[engine] {stage}: applying {len(stage_patches(engine, stage))} patch(es) on {base} "
                         "(not built)")
                git(tree, "checkout", "-q", "-f", "--detach", base)
                git(tree, "clean", "-q", "-fd")
                apply_stage(tree, engine, stage)
                git(tree, "tag", "-f", "-a", tag, "-m", fp)
            made_from[stage] = fp
            base = tag
            continue
        t0 = time.monotonic()
        # taken before the stage's inputs are read: an edit during the build makes the next build redo the stage
        fp = variant_fingerprint(req, stage)
        check_inputs_unchanged(req, made_from)  # the earlier stages' trees still match the inputs fp covers
        git(tree, "am", "--abort", check=False)
        old = read_manifest(req.out, stage)
        head = git(tree, "rev-parse", "HEAD").strip()
        clean = not git(tree, "status", "--porcelain").strip()
        at_tag = (git(tree, "tag", "-l", tag).strip() == tag and clean
                  and head == git(tree, "rev-parse", f"{tag}^{{commit}}").strip())
        resumed = False
        if at_tag and old is not None and old.fingerprint == fp:
            # the tree is at this stage already and only targets are missing (e.g. the op tests): build just them
            progress(f"[engine] {stage}: tree at {tag}, adding targets")
        elif at_tag and git(tree, "tag", "-l", "--format=%(contents)", tag).strip() == fp:
            # the tag, annotated with the fingerprint of the inputs its tree was made from, says a compilation of this
            # very tree was interrupted (no manifest yet): applying the patches again would give every patched file a
            # new time and recompile what was compiled already, so the build goes on from there
            progress(f"[engine] {stage}: tree at {tag} from these inputs, resuming its compilation")
            resumed = True
        else:
            progress(f"[engine] {stage}: applying {len(stage_patches(engine, stage))} patch(es) on {base}")
            at_base = head == git(tree, "rev-parse", f"{base}^{{commit}}").strip()
            if not (at_base and clean):
                # only files that differ are rewritten, so only they (and their dependents) recompile
                git(tree, "checkout", "-q", "-f", "--detach", base)
                git(tree, "clean", "-q", "-fd")
            apply_stage(tree, engine, stage)
            git(tree, "tag", "-f", "-a", tag, "-m", fp)
        if not (bdir / "CMakeCache.txt").exists() or _cached_args(bdir) != args:
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            _run(["cmake", "-S", str(tree), "-B", str(bdir), *gen, *args], log, env=env)
            (bdir / "ostinato-cmake-args.json").write_text(json.dumps(args))
        targets = stage_targets(req, stage)
        progress(f"[engine] {stage}: building {', '.join(targets)} ({req.backend.name}, {req.jobs} jobs)")
        compile_ = ["cmake", "--build", str(bdir), "-j", str(req.jobs), "--target", *targets]
        try:
            _run(compile_, log, env=env)
        except RuntimeError:
            if not resumed:
                raise
            # a compiler killed with the interrupted build can leave a truncated object newer than its source, which
            # no incremental build replaces: once more from clean objects, then a failure is the code's
            progress(f"[engine] {stage}: the resumed compilation failed, compiling again from clean objects")
            _run(["cmake", "--build", str(bdir), "--target", "clean"], log, env=env)
            _run(compile_, log, env=env)
        _install(bdir / "bin", req.out / stage / "bin", targets)
        made_from[stage] = fp
        check_inputs_unchanged(req, made_from)  # no manifest for binaries of inputs that changed while compiling
        m = VariantManifest(
            variant=stage, backend=req.backend.name, backend_reason=req.backend.reason,
            fingerprint=fp, build_number=pin.build_number,
            upstream_commit=pin.commit, tree_commit=git(tree, "rev-parse", "HEAD").strip(),
            patches=[str(p.relative_to(req.repo)) for s in STAGES[1 : STAGES.index(stage) + 1]
                     for p in stage_patches(engine, s)],
            cmake_args=args, targets=list(targets), build_seconds=round(time.monotonic() - t0, 1),
            built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), sources=sources_fingerprint(engine, stage))
        _manifest_path(req.out, stage).write_text(json.dumps(asdict(m), indent=2) + "\n")
        progress(f"[engine] {stage}: done in {m.build_seconds:.0f} s")
        result[stage] = m
        base = tag
    return result


def check_inputs_unchanged(req: BuildRequest, made_from: dict[str, str]) -> None:
    """Refuse to go on when engine/ changed during the build: a later stage would otherwise be built on an earlier
    stage's tree made from the old inputs (engine/src enters at the stock stage) under a manifest that claims the
    new ones, and later builds would take the stale binaries as current."""
    for stage, fp in made_from.items():
        if variant_fingerprint(req, stage) != fp:
            raise RuntimeError(f"the engine's inputs for stage {stage!r} (engine/pin.json, engine/patches, engine/src) "
                               f"changed during the build; run `ostinato engine build` again")


def _cached_args(bdir: Path) -> list[str] | None:
    p = bdir / "ostinato-cmake-args.json"
    return json.loads(p.read_text()) if p.exists() else None
