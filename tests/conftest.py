"""Session fixtures: the engine built CPU-only once (cached in build/engine/cpu) and tiny synthetic models."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from ostinato.engine.backend import resolve_backend
from ostinato.engine.patches import STAGES
from ostinato.engine.stages import BuildRequest, build

REPO = Path(__file__).resolve().parents[1]
# CPU by default; OSTINATO_ENGINE_BACKEND=cuda runs the same tests on the GPU build (device runs)
BACKEND = os.environ.get("OSTINATO_ENGINE_BACKEND", "cpu")
ENGINE_OUT = REPO / "build" / "engine" / BACKEND
MODEL_CACHE = REPO / "build" / "test-models"
FIXTURES = Path(__file__).parent / "fixtures"


# Fixtures that build the engine: `engine_variants`, and the modules' fixtures that ask for it through
# `request.getfixturevalue` (unless an environment variable names a prebuilt one), which pytest cannot see statically.
ENGINE_FIXTURES = frozenset({"engine_variants", "llama_server_paths", "tree"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `slow` every test that needs the engine build (it is built once, minutes on 2 cores), and skip the
    tests marked `gpu` unless the suite runs on the CUDA build (OSTINATO_ENGINE_BACKEND=cuda, on a GPU machine)."""
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("gpu") and BACKEND != "cuda":
            item.add_marker(pytest.mark.skip(reason="needs a GPU and the CUDA build (OSTINATO_ENGINE_BACKEND=cuda)"))


def engine_request() -> BuildRequest:
    """The build the engine tests use: every variant with the op tests by default. On a GPU machine whose build has
    fewer (e.g. `ostinato engine build --variants stock,ostinato` without `--op-tests`, a device call's time),
    OSTINATO_ENGINE_VARIANTS=stock,ostinato and OSTINATO_ENGINE_OP_TESTS=0 make the tests use that build as it is
    instead of compiling the rest first; the tests that need a variant left out are skipped."""
    sdist = os.environ.get("OSTINATO_ENGINE_SDIST")
    names = os.environ.get("OSTINATO_ENGINE_VARIANTS", ",".join(STAGES))
    variants = tuple(v.strip() for v in names.split(",") if v.strip())
    unknown = [v for v in variants if v not in STAGES]
    if unknown or not variants:
        raise pytest.UsageError(f"OSTINATO_ENGINE_VARIANTS={names!r}: expected a comma-separated subset of "
                                f"{','.join(STAGES)}")
    op_tests = os.environ.get("OSTINATO_ENGINE_OP_TESTS", "1")
    if op_tests not in ("0", "1"):
        raise pytest.UsageError(f"OSTINATO_ENGINE_OP_TESTS={op_tests!r}: expected 0 or 1")
    return BuildRequest(repo=REPO, out=ENGINE_OUT, backend=resolve_backend(BACKEND), variants=variants,
                        op_tests=op_tests == "1", jobs=os.cpu_count() or 2, sdist=Path(sdist) if sdist else None)


class BuiltVariants(dict):
    """Bin directory per built variant; asking for one the build left out skips the test that asks."""

    def __missing__(self, variant: str) -> Path:
        pytest.skip(f"variant {variant!r} is not in this build (OSTINATO_ENGINE_VARIANTS)")


@pytest.fixture(scope="session")
def engine_variants() -> dict[str, Path]:
    """Bin directories of the variants (upstream, stock, ostinato); built on first use, then cached."""
    req = engine_request()
    build(req)
    return BuiltVariants({v: ENGINE_OUT / v / "bin" for v in req.variants})


@pytest.fixture(scope="session")
def engine_bin_dir(engine_variants: dict[str, Path]) -> Path:
    """The stock variant (upstream + replay support), the engine most tests talk to."""
    return engine_variants["stock"]


@pytest.fixture(scope="session")
def llama_tree(engine_variants: dict[str, Path]) -> Path:
    """The pinned llama.cpp tree (its gguf-py writes the synthetic models)."""
    return ENGINE_OUT / "tree"


def _synth(tree: Path, spec: str, vocab: str, expert_type: str, dense_type: str) -> Path:
    from ostinato.models.layout import Types
    from ostinato.models.spec import get_spec
    from ostinato.models.synth import synthesize

    code = hashlib.sha256(b"".join(p.read_bytes() for p in sorted((REPO / "src/ostinato/models").glob("*.py"))))
    out = MODEL_CACHE / f"{spec}-{vocab}-{expert_type}-{dense_type}-{code.hexdigest()[:10]}.gguf"
    if not out.exists():
        synthesize(get_spec(spec), out, tree, vocab=vocab, types=Types(expert_type, dense_type), seed=0)
    return out


@pytest.fixture(scope="session")
def tiny_model(llama_tree: Path) -> Path:
    """A tiny qwen3moe GGUF with a byte vocabulary and F32 weights (exact comparisons)."""
    return _synth(llama_tree, "tiny-qwen3moe", "byte", "f32", "f32")


@pytest.fixture(scope="session")
def tiny_v4_model(llama_tree: Path) -> Path:
    """A tiny deepseek4 GGUF with a byte vocabulary and F32 weights."""
    return _synth(llama_tree, "tiny-v4", "byte", "f32", "f32")


# The fake llama-server (tests/fixtures/fake_llama_server.py) of the replay and fault tests

@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """An executable wrapper that starts the fake llama-server with this Python."""
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FIXTURES / "fake_llama_server.py"}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return model
