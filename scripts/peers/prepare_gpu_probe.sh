#!/usr/bin/env bash
# Fill the carried directory of the GPU probe (scripts/peers/probe_gpu.sh), here, before the `run` call:
#   CARRY/wheels/  FreeToken 0.2.1 and the wheels of its Requires-Dist the GPU machine lacks, as pinned in
#                  engine/peers.json (sha256 checked; KTransformers' wheels are too large to carry and are left out)
#   CARRY/models/  the tiny qwen3moe GGUF (byte vocabulary) twice: MXFP4 experts with F16 dense weights (the
#                  pipeline's default types) and all F32 (the tests' model)
# Usage: bash scripts/peers/prepare_gpu_probe.sh [CARRY]   (default .carry/peers, ignored by git)
# Needs .venv (make test or `python3 -m venv .venv && .venv/bin/pip install -e .`) and the engine's llama.cpp tree
# (build/engine/cpu/tree, from `make test` or `ostinato engine build`), whose gguf-py writes the models.
set -euo pipefail
CARRY=${1:-.carry/peers}
OST=${OSTINATO:-.venv/bin/ostinato}
TREE=${LLAMA_TREE:-build/engine/cpu/tree}
[ -x "$OST" ] || { echo "prepare_gpu_probe: $OST not found (set OSTINATO=path/to/ostinato)" >&2; exit 2; }
[ -d "$TREE/gguf-py" ] || { echo "prepare_gpu_probe: no llama.cpp tree at $TREE (set LLAMA_TREE)" >&2; exit 2; }
"$OST" peers wheels freetoken --dest "$CARRY/wheels"
mkdir -p "$CARRY/models"
"$OST" models synth --spec tiny-qwen3moe --vocab byte --expert-type mxfp4 --dense-type f16 \
  --out "$CARRY/models/tiny-qwen3moe-mxfp4.gguf" --llama-tree "$TREE"
"$OST" models synth --spec tiny-qwen3moe --vocab byte --expert-type f32 --dense-type f32 \
  --out "$CARRY/models/tiny-qwen3moe-f32.gguf" --llama-tree "$TREE"
du -sh "$CARRY"
