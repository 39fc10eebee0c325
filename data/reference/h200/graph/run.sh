#!/usr/bin/env bash
# H200: one graph per decode step (issue 14; engine/README.md, "One graph per decode step"), through the pipeline
# itself (snakemake on config/h200.yaml via ../branches/run.sh), in calls of at most ten minutes on one machine:
#   bash data/reference/h200/graph/run.sh build    # CUDA build of stock and ostinato with the op tests,
#                                                  # test-residency-ops -v (its `branch` cases: GGML_OP_HOST_BRANCH on
#                                                  # CUDA, captured CUDA graphs included), the engine tests of one graph
#                                                  # per decode step on the GPU (pytest -k graph), then the model
#   bash data/reference/h200/graph/run.sh sweep    # plain/: layers, ostinato overlapped on per-segment graphs, ostinato
#                                                  # with one graph per decode step, and with borrowed memory too, after
#                                                  # prefixes of 3,072 and 8,192 tokens (128, 256, 511 new tokens, then
#                                                  # decode)
#   bash data/reference/h200/graph/run.sh reverse  # plain2/: the same sweep in reversed engine order
#   bash data/reference/h200/graph/run.sh threads  # threads<N>/: ostinato-overlap and ostinato-graph with the worker's
#                                                  # --residency-worker-threads N for each N of WORKER_THREADS
#                                                  # (default 16: the worker on every core, the first sweep's
#                                                  # worker), against the default of one thread fewer than -t
#   bash data/reference/h200/graph/run.sh passive  # passive/: the same two engines with OMP_WAIT_POLICY=passive (the
#                                                  # decode step's own CPU splits, e.g. deepseek4's lightning indexer,
#                                                  # leave an OpenMP team that spins beside the worker's threads)
#   bash data/reference/h200/graph/run.sh teams    # teams-t<T>-w<W>/: ostinato-graph (and ostinato-overlap: a sweep
#                                                  # compares two engines at least) with T decode threads (-t T; prefill
#                                                  # keeps -tb BATCH_THREADS, default 16) and a worker of W threads, for
#                                                  # each T:W of TEAMS (default "8:8 4:12 2:14"): the worker's pool has
#                                                  # threads of its own (patch 17), which spin through a step on their
#                                                  # cores, so llama.cpp's decode threads take the cores it leaves
#   bash data/reference/h200/graph/run.sh floor    # floor/: layers, one graph per decode step with and without borrowed
#                                                  # memory, and llama.cpp-gpu-experts, every expert on the GPU (beyond
#                                                  # the sweep's budget: the step a worker that took no time would
#                                                  # leave, which bounds how close to half of layers' decode can come)
#   bash data/reference/h200/graph/run.sh fusion   # fusion/: the qwen3moe case of the bitwise test of one graph per
#                                                  # step against per-segment graphs, as built and with CUDA's fusions
#                                                  # off (GGML_CUDA_DISABLE_FUSION=1), the server logs kept; it needs
#                                                  # the build with the op tests (the default: the engine tests'
#                                                  # fixture builds them otherwise, past the call's ten minutes)
# Every sweep part takes SIZES (new tokens after each prefix, default "128, 256, 511") and PREFIXES (default
# config/h200.yaml's 3,072 and 8,192), e.g. SIZES=128 PREFIXES=3072 WORKER_THREADS="4 8" run.sh threads: the worker's
# time per decode step by its thread count in about half a sweep's time. threads and teams leave their sweeps' files
# in one tar, $OUT/threads.tar or $OUT/teams.tar (the device tool brings back at most eight files of a call).
# A measurement only (README.md, "Speed"): OP_TESTS=0 TESTS_BUDGET=1 for the build (its call then makes the model too).
# Since the ostinato stage changes ggml.h (GGML_OP_HOST_BRANCH), it recompiles every CUDA file after stock's: the
# CUDA build of both takes nearly a call on the H200 (build.txt) and more than a call on an H100, so there the build
# leaves no time for the tests: VARIANTS=ostinato TEST_VARIANTS=stock,ostinato TESTS_BUDGET=300 builds the ostinato
# stage alone and lets the tests' fixture build the stock stage within the tests' time (../../h100/graph/: the build's
# and the tests' times, in two calls there).
# The later calls need the build's machine still warm (it is given back 30 s after a call: a sweep on a bare machine
# stops at once with exit 3 rather than rebuild past the call's limit), so send each as soon as the last returns; or carry a pack of the build
# (PACK=1, or ../heldout/run.sh pack: stock and ostinato) in two calls sent without pause, ../prebuilt.sh:
#   bash data/reference/h200/graph/run.sh stage    # carrying .prebuilt-parts/ (the pack's parts but the last) alone
#   bash data/reference/h200/graph/run.sh sweep    # carrying .whl, .carry and .prebuilt/ (the last part, the index)
# Each sweep's results/sweep goes to $OUT/<name>.tar.gz (default OUT: this directory).
set -euo pipefail
part=${1:?usage: run.sh build|sweep|reverse|floor|threads|teams|passive|fusion|stage}
here=$(cd "$(dirname "$0")" && pwd)
export OUT=${OUT:-$here}
mkdir -p "$OUT"
ENG="llama.cpp-layers, ostinato-overlap, ostinato-graph, ostinato-graph-borrow"
sweep() {  # name, engines[, more server arguments, quoted and comma-separated]
  printf 'sweep:\n  sizes: [%s]\n%b  server_args: ["--load-mode", "none"%s]\n' "${SIZES:-128, 256, 511}" \
      "${PREFIXES:+  prefix: [$PREFIXES]\n}" "${3:+, $3}" > "$OUT/$1.yaml"
  rm -rf results/sweep
  ENGINES="$2" SWEEP_CONFIG="$OUT/$1.yaml" BUDGET=${BUDGET:-540} bash "$here/../branches/run.sh" sweep
  mv "$OUT/sweep.tar.gz" "$OUT/$1.tar.gz"; mv "$OUT/snakemake-sweep.log" "$OUT/snakemake-$1.log"
  mv "$OUT/machine-sweep.txt" "$OUT/$1-machine.txt"
  if [ -n "${BUNDLE:-}" ]; then
    # a part of several sweeps: the device tool brings back at most eight files of a call, so each sweep's four go
    # into one tar as it ends ($OUT/$BUNDLE.tar; a sweep that the call's limit cuts short leaves the others there)
    local files=("$1.yaml" "$1.tar.gz" "snakemake-$1.log" "$1-machine.txt")
    tar -rf "$OUT/$BUNDLE.tar" -C "$OUT" "${files[@]}" && (cd "$OUT" && rm -f "${files[@]}")
  fi
}
case "$part" in
stage) bash "$here/../branches/run.sh" stage ;;  # a carried pack's parts but the last (../prebuilt.sh)
build)
  VARIANTS=${VARIANTS:-stock,ostinato} OP_TESTS=${OP_TESTS:-1} TESTS_K=${TESTS_K:-"graph or worker"} TESTS_BUDGET=${TESTS_BUDGET:-150} CALL_BUDGET=${CALL_BUDGET:-580} \
      bash "$here/../branches/run.sh" build
  ops=$(ls -d build/engine/*/ostinato/bin | head -1)
  timeout 120 "$ops/test-residency-ops" -v > "$OUT/test-residency-ops.txt" 2>&1 || true
  grep -E "branch|tests passed" "$OUT/test-residency-ops.txt" | tail -8
  ;;
sweep) sweep plain "$ENG" ;;
fusion)
  mkdir -p "$OUT/fusion"
  for off in 0 1; do
    rm -rf /tmp/ptest-fusion
    GGML_CUDA_DISABLE_FUSION=$off OSTINATO_ENGINE_BACKEND=cuda PYTHONPATH="$PWD/src:/tmp/site" timeout 200 python3 -m pytest -q \
        -p no:cacheprovider --basetemp=/tmp/ptest-fusion -k "one_graph_per_decode_step and qwen3moe" \
        tests/test_residency_engine.py > "$OUT/fusion/tests-disable-$off.txt" 2>&1 || true
    tail -3 "$OUT/fusion/tests-disable-$off.txt"
    for f in /tmp/ptest-fusion/*/server-graph-*.log; do
      [ -f "$f" ] && gzip -c "$f" > "$OUT/fusion/disable-$off-$(basename "$f").gz"
    done
  done
  ;;
floor) sweep floor "llama.cpp-layers, llama.cpp-gpu-experts, ostinato-graph, ostinato-graph-borrow" ;;
passive) OMP_WAIT_POLICY=passive sweep passive "ostinato-overlap, ostinato-graph" ;;
threads)
  # e.g. WORKER_THREADS="4 8": fewer threads than cores leave the llama.cpp decode threads' OpenMP team room beside
  # the worker's (sweep2/: the worker's time hardly changed with that team asleep, OMP_WAIT_POLICY=passive)
  for n in ${WORKER_THREADS:-16}; do
    BUNDLE=threads sweep "threads$n" "ostinato-overlap, ostinato-graph" "\"--residency-worker-threads\", \"$n\""
  done
  ;;
teams)
  for tw in ${TEAMS:-8:8 4:12 2:14}; do
    t=${tw%%:*}; w=${tw##*:}
    BUNDLE=teams sweep "teams-t$t-w$w" "ostinato-graph, ostinato-overlap" \
        "\"-t\", \"$t\", \"-tb\", \"${BATCH_THREADS:-16}\", \"--residency-worker-threads\", \"$w\""
  done
  ;;
reverse) sweep plain2 "$(echo "$ENG" | tr ',' '\n' | tac | paste -sd, | sed 's/^ *//; s/, */, /g')" ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
