"""The engine build: pin checks, backend choice, the patch queue and its export round trip."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ostinato.engine import backend as backend_mod
from ostinato.engine.patches import STAGES, stage_inputs, stage_patches
from ostinato.engine.pin import load_pin
from ostinato.engine.source import fetch_sdist, verify_sdist
from ostinato.engine.stages import read_manifest, sources_fingerprint

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "engine"


def test_pin_is_complete():
    pin = load_pin(ENGINE / "pin.json")
    assert pin.build_number == 11312 and pin.commit.startswith("0c1e570") and len(pin.sha256) == 64


def test_pin_missing_key_names_file_and_key(tmp_path):
    data = json.loads((ENGINE / "pin.json").read_text())
    del data["sha256"]
    (tmp_path / "pin.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"pin.json: missing key 'sha256'"):
        load_pin(tmp_path / "pin.json")


def test_wrong_sdist_checksum_is_rejected(tmp_path):
    pin = load_pin(ENGINE / "pin.json")
    fake = tmp_path / pin.sdist
    fake.write_bytes(b"not the sdist")
    with pytest.raises(ValueError, match="does not match the pinned"):
        verify_sdist(fake, pin)
    with pytest.raises(ValueError, match="does not match the pinned"):
        fetch_sdist(pin, tmp_path / "cache", local=fake)
    assert not (tmp_path / "cache" / pin.sdist).exists()


def test_stage_series():
    assert STAGES == ("upstream", "stock", "ostinato")
    assert stage_patches(ENGINE, "upstream") == []
    names = [p.name for p in stage_patches(ENGINE, "stock")]
    assert names == sorted(names) and len(names) >= 3
    # later stages depend on everything earlier ones do
    assert set(stage_inputs(ENGINE, "stock")) <= set(stage_inputs(ENGINE, "ostinato"))
    with pytest.raises(ValueError, match="unknown engine variant"):
        stage_patches(ENGINE, "turbo")


def test_backend_choice(monkeypatch):
    monkeypatch.setattr(backend_mod, "gpu_compute_caps", lambda: [])
    b = backend_mod.resolve_backend("auto")
    assert b.name == "cpu" and "no NVIDIA GPU" in b.reason
    monkeypatch.setattr(backend_mod, "gpu_compute_caps", lambda: ["90"])
    monkeypatch.setattr(backend_mod, "cuda_toolkit", lambda: None)
    assert backend_mod.resolve_backend("auto").name == "cpu"
    with pytest.raises(RuntimeError, match="no CUDA toolkit"):
        backend_mod.resolve_backend("cuda")
    with pytest.raises(ValueError, match="engine.backend"):
        backend_mod.resolve_backend("metal")


def test_cuda_backend_options(monkeypatch, tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib64").mkdir()
    (tmp_path / "lib64" / "libcublas.so.13").write_bytes(b"")
    monkeypatch.setattr(backend_mod, "gpu_compute_caps", lambda: ["90"])
    monkeypatch.setattr(backend_mod, "cuda_toolkit", lambda: tmp_path)
    b = backend_mod.resolve_backend("auto")
    assert b.name == "cuda" and "-DGGML_CUDA=ON" in b.cmake_args
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in b.cmake_args


def test_built_variants_have_manifests(engine_variants):
    pin = load_pin(ENGINE / "pin.json")
    for v, bin_dir in engine_variants.items():
        m = read_manifest(bin_dir.parent.parent, v)
        assert m is not None and m.backend == os.environ.get("OSTINATO_ENGINE_BACKEND", "cpu")
        assert m.build_number == pin.build_number
        assert m.sources == sources_fingerprint(ENGINE, v)  # the code alone, for replays across machines
        assert len(m.patches) == sum(len(stage_patches(ENGINE, s)) for s in STAGES[1 : STAGES.index(v) + 1])
        out = subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True, text=True)
        assert f"(build {pin.build_number}, commit {pin.short_commit})" in out.stdout + out.stderr


def test_patch_queue_round_trip(engine_variants, tmp_path):
    """A developer tree exports back to exactly the committed series and engine/src."""
    from ostinato.engine import devtree

    repo = tmp_path / "repo"
    (repo / "engine").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(ENGINE / "pin.json"), str(ENGINE / "patches"), str(ENGINE / "src"),
                    str(repo / "engine")], check=True)
    base = engine_variants["upstream"].parent.parent / "tree"
    tree = devtree.make_tree(repo, tmp_path / "tree", "stock", REPO / "build" / "cache", base_tree=base)
    assert (tree / "src" / "llama-routing.cpp").exists()
    written = devtree.export_tree(repo, tree, "stock")
    assert [p.name for p in written] == [p.name for p in stage_patches(ENGINE, "stock")]
    for p in written:
        assert p.read_text() == (ENGINE / "patches" / "stock" / p.name).read_text()


def test_op_tests_only_when_asked_and_same_fingerprint(tmp_path):
    """The pipeline builds no op tests, the test suite does; both share the stage's fingerprint and tree."""
    from ostinato.engine.backend import resolve_backend
    from ostinato.engine.stages import BuildRequest, is_current, stage_targets, variant_fingerprint

    plain = BuildRequest(repo=REPO, out=tmp_path, backend=resolve_backend("cpu"))
    with_tests = BuildRequest(repo=REPO, out=tmp_path, backend=resolve_backend("cpu"), op_tests=True)
    assert stage_targets(plain, "ostinato") == ("llama-server", "llama-bench")
    assert stage_targets(with_tests, "ostinato") == ("llama-server", "llama-bench", "test-backend-ops", "test-residency-ops")
    assert stage_targets(with_tests, "stock") == ("llama-server", "llama-bench")
    assert variant_fingerprint(plain, "ostinato") == variant_fingerprint(with_tests, "ostinato")
    # a stage built without its op tests is current for the pipeline and not for the test suite
    bin_dir = tmp_path / "ostinato" / "bin"
    bin_dir.mkdir(parents=True)
    for t in ("llama-server", "llama-bench"):
        (bin_dir / t).write_text("")
    (tmp_path / "ostinato" / "manifest.json").write_text(json.dumps({
        "variant": "ostinato", "backend": "cpu", "backend_reason": "", "fingerprint": variant_fingerprint(plain, "ostinato"),
        "build_number": 0, "upstream_commit": "", "tree_commit": "", "patches": [], "cmake_args": [],
        "targets": ["llama-server", "llama-bench"], "build_seconds": 0.0, "built_at": ""}))
    assert is_current(plain, "ostinato")
    assert not is_current(with_tests, "ostinato")


def test_an_edit_during_the_build_is_refused(tmp_path):
    """engine/src enters at the stock stage: an edit while stock compiles must not leave ostinato built on the old
    tree under a manifest of the new inputs (found when engine/src was exported during a build)."""
    import shutil

    from ostinato.engine.backend import resolve_backend
    from ostinato.engine.stages import BuildRequest, check_inputs_unchanged, variant_fingerprint

    repo = tmp_path / "repo"
    shutil.copytree(ENGINE, repo / "engine")
    req = BuildRequest(repo=repo, out=tmp_path / "out", backend=resolve_backend("cpu"))
    made_from = {s: variant_fingerprint(req, s) for s in ("upstream", "stock")}
    check_inputs_unchanged(req, made_from)  # nothing changed
    src = repo / "engine" / "src" / "src" / "llama-residency.cpp"
    src.write_text(src.read_text() + "\n// edited\n")
    assert variant_fingerprint(req, "upstream") == made_from["upstream"]  # upstream has no engine/src
    with pytest.raises(RuntimeError, match="inputs for stage 'stock'.*changed during the build"):
        check_inputs_unchanged(req, made_from)


def test_x86_builds_leave_intel_amx_out_of_the_cpu_backend() -> None:
    """On x86 the CPU backend is compiled without AMX (its buffer type takes deepseek4 weights its kernels cannot
    multiply, and the scheduler aborts), so the engine runs the same on CPUs with and without it; elsewhere the flags,
    which other architectures' compilers reject, are not passed."""
    from ostinato.engine.backend import Backend
    from ostinato.engine.stages import NO_AMX_FLAGS, _cmake_args

    pin = load_pin(REPO / "engine" / "pin.json")
    cpu = Backend("cpu", ("-DGGML_CUDA=OFF",), "test")
    x86 = _cmake_args(pin, cpu, machine="x86_64")
    assert f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}" in x86 and f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}" in x86
    assert "-mno-amx-int8" in NO_AMX_FLAGS
    assert not any("amx" in a for a in _cmake_args(pin, cpu, machine="aarch64"))


def test_engine_tests_take_a_smaller_build_from_the_environment(monkeypatch):
    """A GPU machine's build of stock and ostinato without op tests is used as it is (no upstream compiled first);
    a test that asks for a variant left out is skipped, and a bad value is a usage error that names the variable."""
    from conftest import BuiltVariants, engine_request

    monkeypatch.delenv("OSTINATO_ENGINE_VARIANTS", raising=False)
    monkeypatch.delenv("OSTINATO_ENGINE_OP_TESTS", raising=False)
    assert engine_request().variants == STAGES and engine_request().op_tests
    monkeypatch.setenv("OSTINATO_ENGINE_VARIANTS", "stock, ostinato")
    monkeypatch.setenv("OSTINATO_ENGINE_OP_TESTS", "0")
    req = engine_request()
    assert req.variants == ("stock", "ostinato") and not req.op_tests
    built = BuiltVariants({"stock": Path("s"), "ostinato": Path("o")})
    assert built["ostinato"] == Path("o")
    with pytest.raises(pytest.skip.Exception, match="'upstream' is not in this build"):
        built["upstream"]
    monkeypatch.setenv("OSTINATO_ENGINE_VARIANTS", "stock,cuda")
    with pytest.raises(pytest.UsageError, match="OSTINATO_ENGINE_VARIANTS='stock,cuda'"):
        engine_request()
    monkeypatch.setenv("OSTINATO_ENGINE_VARIANTS", "ostinato")
    monkeypatch.setenv("OSTINATO_ENGINE_OP_TESTS", "no")
    with pytest.raises(pytest.UsageError, match="OSTINATO_ENGINE_OP_TESTS='no'"):
        engine_request()


def _fake_stage_build(monkeypatch, tmp_path, fail_once: str | None):
    """`stages.build` on a small git tree with its patches and cmake faked: which stages were applied, compiled and
    cleaned. A stage named by `fail_once` stops in its first compilation, as a build the device tool stopped."""
    from ostinato.engine import stages
    from ostinato.engine.backend import resolve_backend
    from ostinato.engine.gitutil import git
    from ostinato.engine.source import UPSTREAM_TAG

    out = tmp_path / "out"
    tree = out / "tree"
    tree.mkdir(parents=True)
    git(tree, "init", "-q")
    (tree / "llama.c").write_text("int llama;\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "--no-verify", "-m", "upstream")
    git(tree, "tag", UPSTREAM_TAG)
    events: list[str] = []
    failed: list[str] = []

    def apply_stage(t, engine, stage):  # the upstream stage has no patches; a commit of its own here
        events.append(f"apply:{stage}")
        (t / f"{stage}.c").write_text(f"int {stage};\n")
        git(t, "add", "-A")
        git(t, "commit", "-q", "--no-verify", "-m", stage)

    def run(cmd, log, cwd=None, env=None):
        stage = git(tree, "log", "-1", "--format=%s").strip()
        if "--build" not in cmd:
            bdir = Path(cmd[cmd.index("-B") + 1])
            bdir.mkdir(parents=True, exist_ok=True)
            (bdir / "CMakeCache.txt").write_text("")
            return
        if "clean" in cmd:
            events.append(f"clean:{stage}")
            return
        events.append(f"compile:{stage}")
        if stage == fail_once and not failed:
            failed.append(stage)
            raise RuntimeError("cmake --build failed")
        bin_dir = Path(cmd[cmd.index("--build") + 1]) / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for t in cmd[cmd.index("--target") + 1:]:
            (bin_dir / t).write_text(stage)

    monkeypatch.setattr(stages, "apply_stage", apply_stage)
    monkeypatch.setattr(stages, "_run", run)
    req = stages.BuildRequest(repo=REPO, out=out, backend=resolve_backend("cpu"), variants=("stock", "ostinato"))
    return req, tree, events


def test_an_interrupted_compilation_resumes_on_the_stages_tree(monkeypatch, tmp_path):
    """A build stopped while the ostinato stage compiled (a GPU call's limit) goes on from the tree it left: its patches
    are not applied again (which gave every patched file a new time and recompiled the stage from its first object, about
    300 s of an H100 call), and a stage whose inputs changed since is applied again."""
    from ostinato.engine import stages
    from ostinato.engine.gitutil import git

    req, tree, events = _fake_stage_build(monkeypatch, tmp_path, fail_once="ostinato")
    with pytest.raises(RuntimeError, match="cmake --build failed"):
        stages.build(req, progress=events.append)
    assert read_manifest(req.out, "ostinato") is None and read_manifest(req.out, "stock") is not None
    patched = (tree / "ostinato.c").stat().st_mtime_ns
    events.clear()
    built = stages.build(req, progress=events.append)
    assert "apply:ostinato" not in events and "[engine] stock: up to date" in events
    assert "[engine] ostinato: tree at stage/ostinato from these inputs, resuming its compilation" in events
    assert (tree / "ostinato.c").stat().st_mtime_ns == patched
    assert built["ostinato"].fingerprint == stages.variant_fingerprint(req, "ostinato")
    assert (req.out / "ostinato" / "bin" / "llama-server").read_text() == "ostinato"
    # a tree whose stage tag was made from other inputs (an edited patch) is made again
    events.clear()
    (req.out / "ostinato" / "manifest.json").unlink()
    git(tree, "tag", "-f", "-a", "stage/ostinato", "-m", "0" * 64)
    stages.build(req, progress=events.append)
    assert "apply:ostinato" in events and not any("resuming" in str(e) for e in events)


def test_a_resumed_compilation_that_fails_compiles_once_more_from_clean_objects(monkeypatch, tmp_path):
    """A compiler killed with the build can leave a truncated object that an incremental build keeps: a resumed
    compilation that fails cleans the objects and compiles once more, and only then fails."""
    from ostinato.engine import stages

    req, _, events = _fake_stage_build(monkeypatch, tmp_path, fail_once="ostinato")
    with pytest.raises(RuntimeError):
        stages.build(req, progress=events.append)
    events.clear()
    calls = {"n": 0}
    run = stages._run

    def fail_first_resumed(cmd, log, cwd=None, env=None):
        if "--build" in cmd and "clean" not in cmd and calls["n"] == 0:
            calls["n"] += 1
            raise RuntimeError("undefined reference in a truncated object")
        run(cmd, log, cwd=cwd, env=env)

    monkeypatch.setattr(stages, "_run", fail_first_resumed)
    stages.build(req, progress=events.append)
    assert "[engine] ostinato: the resumed compilation failed, compiling again from clean objects" in events
    assert events.index("clean:ostinato") < events.index("compile:ostinato")
    assert read_manifest(req.out, "ostinato") is not None
