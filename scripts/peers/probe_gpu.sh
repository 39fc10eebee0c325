#!/usr/bin/env bash
# Probe of the Python peers on the GPU machine (one H200, Python 3.12, PyTorch 2.11): what FreeToken 0.2.1 and
# KTransformers 0.7.2 need there, and how far FreeToken gets as a user would run it. Writes $OUT/peers/probe.json
# (every command, exit code, seconds and output tail) and logs beside it. Installs nothing outside a temporary
# directory: the carried wheels go to $TMP/site (pip --target), every cache (HOME, Triton, tvm-ffi, torch
# extensions, Hugging Face) under $TMP, removed at the end. Stops itself after PROBE_BUDGET_S (default 170) s.
# Usage (repository root): bash scripts/peers/probe_gpu.sh [CARRY]  with CARRY from prepare_gpu_probe.sh
# (PYTHON=... picks another interpreter than python3, e.g. to try the steps on a machine without a GPU)
set -u
CARRY=${1:-.carry/peers}
OUTDIR=${OUT:-/tmp/peers-probe-out}/peers
mkdir -p "$OUTDIR"
TMP=$(mktemp -d /tmp/peers-probe.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/home"
export HOME="$TMP/home" XDG_CACHE_HOME="$TMP/cache" TRITON_CACHE_DIR="$TMP/triton" TORCH_EXTENSIONS_DIR="$TMP/torch_ext" \
  TVM_FFI_CACHE_DIR="$TMP/tvm-ffi" HF_HOME="$TMP/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INPUT=1 \
  PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 MAX_JOBS=16
DEADLINE=$(( $(date +%s) + ${PROBE_BUDGET_S:-170} ))
timeout $(( ${PROBE_BUDGET_S:-170} + 5 )) "${PYTHON:-python3}" scripts/peers/probe_gpu.py --carry "$CARRY" --tmp "$TMP" \
  --out "$OUTDIR" --deadline "$DEADLINE"
rc=$?
echo "probe_gpu: exit $rc; $OUTDIR/probe.json"
exit $rc
