"""Write a GGUF model with random weights from a shape spec, streamed tensor by tensor and renamed into place."""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ostinato.models.gguf_import import load_gguf
from ostinato.models.layout import TensorPlan, Types, tensor_plans
from ostinato.models.router import Router
from ostinato.models.spec import ModelSpec
from ostinato.models.vocab import GGUFVocab, build_vocab
from ostinato.models.weights import chunk_jobs

# Show a progress bar by default when the tensor data exceeds this many bytes.
PROGRESS_MIN_BYTES = 256 << 20

_FILE_TYPES = {"mxfp4": "MOSTLY_MXFP4_MOE", "q8_0": "MOSTLY_Q8_0", "f16": "MOSTLY_F16", "f32": "ALL_F32"}


@dataclass(frozen=True)
class SynthResult:
    """What `synthesize` wrote."""

    path: Path
    file_bytes: int
    n_tensors: int
    n_vocab: int
    seconds: float


def _add_hparams(w: Any, gguf: ModuleType, spec: ModelSpec) -> None:
    """Architecture keys read by llama.cpp's loader for spec.arch."""
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.hidden)
    w.add_block_count(spec.n_layer)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.rope_dim)
    w.add_rope_freq_base(spec.rope_freq_base)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    w.add_expert_feed_forward_length(spec.expert_ffn)
    if spec.arch != "deepseek4":
        return
    n = spec.n_layer
    w.add_embedding_length_out(spec.hidden * spec.hc_mult)
    w.add_q_lora_rank(spec.q_lora_rank)
    w.add_sliding_window(spec.sliding_window)
    w.add_expert_shared_count(spec.n_shared)
    w.add_expert_weights_scale(spec.expert_weights_scale)
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SQRTSOFTPLUS)
    w.add_swiglu_clamp_exp([spec.swiglu_clamp] * n)
    w.add_swiglu_clamp_shexp([spec.swiglu_clamp] * n)
    w.add_indexer_head_count(spec.indexer_heads)
    w.add_indexer_key_length(spec.indexer_head_dim)
    w.add_indexer_top_k(spec.indexer_top_k)
    w.add_attention_output_group_count(spec.o_groups)
    w.add_attention_output_lora_rank(spec.o_lora_rank)
    w.add_attention_compress_ratios(list(spec.compress_ratios))
    w.add_attention_compress_rope_freq_base(spec.compress_rope_freq_base)
    w.add_hyper_connection_count(spec.hc_mult)
    w.add_hyper_connection_sinkhorn_iterations(spec.hc_sinkhorn_iters)
    w.add_hyper_connection_epsilon(spec.hc_eps)
    w.add_hash_layer_count(spec.n_hash_layers)


def _add_vocab(w: Any, voc: GGUFVocab, tree: Path) -> None:
    """tokenizer.ggml.* keys (BPE `gpt2` model) and the chat template when the tree ships it."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(voc.pre)
    w.add_token_list(voc.tokens)
    w.add_token_types(voc.token_types)
    w.add_token_merges(voc.merges)
    w.add_bos_token_id(voc.bos_id)
    w.add_eos_token_id(voc.eos_id)
    w.add_pad_token_id(voc.pad_id)
    w.add_add_bos_token(voc.add_bos)
    if voc.chat_template:
        template = tree / "models" / "templates" / voc.chat_template
        if template.is_file():
            w.add_chat_template(template.read_text(encoding="utf-8"))


def check_names(gguf: ModuleType, arch: str, plans: list[TensorPlan]) -> None:
    """Raise RuntimeError if a planned tensor name is not one the tree's gguf-py lists for `arch`."""
    arch_id = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch_id]}
    for plan in plans:
        base = re.sub(r"^blk\.\d+\.", "blk.{bid}.", plan.name.rsplit(".", 1)[0])
        if base not in known:
            raise RuntimeError(f"tensor {plan.name!r} is not a {arch} tensor of this llama.cpp tree's gguf-py")


def _progress_bar(total: int, enabled: bool | None, desc: str) -> Any:
    """A tqdm bar over bytes, or None when disabled (by default only for writes over PROGRESS_MIN_BYTES)."""
    if enabled is False or (enabled is None and total < PROGRESS_MIN_BYTES):
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc)


def default_workers() -> int:
    """Threads that draw chunks: the cores this process may use, at most 8 (the writer is then disk-bound)."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def _ordered(jobs: Iterator[Callable[[], np.ndarray]], pool: ThreadPoolExecutor, ahead: int) -> Iterator[np.ndarray]:
    """The jobs' results in job order, at most `ahead` jobs drawn or waiting at a time (what bounds the memory)."""
    pending: deque[Future[np.ndarray]] = deque()
    try:
        for job in jobs:
            pending.append(pool.submit(job))
            if len(pending) >= ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()


def _write_data(w: Any, plans: list[TensorPlan], seed: int, bar: Any, workers: int) -> None:
    """Stream every tensor's data after the header, in file order, `workers` threads drawing the next chunks (each
    chunk has its own seed, so the bytes do not depend on `workers`); about workers + 1 chunks in memory at a time."""
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="synth") as pool:
        for plan in plans:
            start = fout.tell()
            for chunk in _ordered(chunk_jobs(plan, seed), pool, workers + 1):
                fout.write(memoryview(chunk).cast("B"))
                if bar is not None:
                    bar.update(chunk.nbytes)
            written = fout.tell() - start
            if written != plan.nbytes:
                raise RuntimeError(f"tensor {plan.name}: wrote {written} bytes, expected {plan.nbytes}")
            w.write_padding(fout, written)


def synthesize(
    spec: ModelSpec,
    out: str | Path,
    tree: str | Path,
    *,
    vocab: str | None = None,
    types: Types = Types(),
    seed: int = 0,
    progress: bool | None = None,
    router: Router = Router(),
    workers: int | None = None,
) -> SynthResult:
    """Write `spec` with random weights to `out` as a GGUF for llama.cpp; the file appears only when complete.

    `router`: random (the default: the router's random weights alone, no bias) or calibrated (selection biases and
    hash tables from an expert ranking, ostinato.models.router); a calibrated router is named in the metadata
    (`ostinato.synth.router*`), so the routing it gives is labelled an input. `workers`: threads that draw the
    random chunks (default `default_workers()`); the file's bytes are the same for any number."""
    t0 = time.monotonic()
    if seed < 0:
        raise ValueError(f"--seed {seed}: expected an integer >= 0")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers {workers}: expected an integer >= 1")
    tree = Path(tree)
    gguf = load_gguf(tree)
    voc = build_vocab(vocab or spec.vocab)
    plans = tensor_plans(spec, voc.n_vocab, types, router)
    check_names(gguf, spec.arch, plans)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    w = gguf.GGUFWriter(tmp, spec.arch)
    try:
        w.add_name(spec.name)
        w.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[types.expert]]))
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for key, val in (("spec", spec.name), ("vocab", voc.kind), ("expert_type", types.expert),
                         ("dense_type", types.dense)):
            w.add_string(f"ostinato.synth.{key}", val)
        w.add_uint64("ostinato.synth.seed", seed)
        if router.calibrated:  # a random router writes no key, so default models keep their bytes
            for key, val in router.describe().items():
                w.add_string(f"ostinato.synth.{key}", val)
        _add_hparams(w, gguf, spec)
        _add_vocab(w, voc, tree)
        for plan in plans:
            qtype = gguf.GGMLQuantizationType[plan.dtype.upper()]
            # numpy shape order; a non-uint8 dtype with raw_dtype keeps the shape as given
            w.add_tensor_info(plan.name, tuple(reversed(plan.ne)), np.dtype(np.float32), plan.nbytes, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        bar = _progress_bar(sum(p.nbytes for p in plans), progress, out.name)
        try:
            _write_data(w, plans, seed, bar, workers or default_workers())
        finally:
            if bar is not None:
                bar.close()
        w.fout[0].flush()
        os.fsync(w.fout[0].fileno())
        w.close()
        os.replace(tmp, out)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    return SynthResult(out, out.stat().st_size, len(plans), voc.n_vocab, time.monotonic() - t0)

