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


@pytest.fixture(scope="session")
def engine_variants() -> dict[str, Path]:
    """Bin directories of the variants (upstream, stock, ostinato); built on first use, then cached."""
    sdist = os.environ.get("OSTINATO_ENGINE_SDIST")
    req = BuildRequest(repo=REPO, out=ENGINE_OUT, backend=resolve_backend(BACKEND), variants=STAGES, op_tests=True,
                       jobs=os.cpu_count() or 2, sdist=Path(sdist) if sdist else None)
    build(req)
    return {v: ENGINE_OUT / v / "bin" for v in STAGES}


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
