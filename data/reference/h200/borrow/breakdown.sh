#!/usr/bin/env bash
# H200: where a decode step's time goes with and without borrowed memory (issue 14), through the pipeline itself
# (snakemake on config/h200.yaml via ../branches/run.sh), in two calls of at most ten minutes on one machine:
#   bash data/reference/h200/borrow/breakdown.sh build   # CUDA build of stock and ostinato (no op tests), the
#                                                        # borrowed-memory engine tests on the GPU, the model
#   bash data/reference/h200/borrow/breakdown.sh sweeps  # three sweeps after prefixes of 3,072 and 8,192 tokens:
#     plain/   layers, ostinato overlapped, ostinato with borrowed memory (128, 256, 511 new tokens, then decode); the
#              decode rows carry borrowed memory's copies and waits (GET /residency `borrow`: admissions, ms, wait_ms)
#     timers/  the two ostinato engines with the engine's timers (--residency-timers: each layer's GPU and CPU branch
#              timed, the branches then one after the other): per decode step the GPU branch, the CPU branch, the
#              per-layer larger of the two, the cold routes the CPU computes
#     t15/     the two ostinato engines with 15 CPU threads instead of 16 (-t 15: one core left to the copy thread)
#   bash data/reference/h200/borrow/breakdown.sh reverse # plain/ again in reversed engine order (plain2/)
#   bash data/reference/h200/borrow/breakdown.sh churn   # the CUDA build without tests, then two sweeps of the two
#                                                        # ostinato engines with fewer copies per step (511 new tokens):
#     admit1/  --residency-borrow-admit 1 (one copy queued per pool and token boundary instead of four)
#     stable/  the same with --residency-borrow-decay 0.99 and --residency-borrow-margin 1 (scores that last longer, and
#              a newcomer must score twice the expert it replaces)
# Each sweep's results/sweep goes to $OUT/<name>.tar.gz (default OUT: breakdown/ beside this script). A sweep of one size
# measures decode only: every round after the first finds its prompt cached (the summary leaves such prefills out).
set -euo pipefail
part=${1:?usage: breakdown.sh build|sweeps|reverse|churn}
here=$(cd "$(dirname "$0")" && pwd)
export OUT=${OUT:-$here/breakdown}
mkdir -p "$OUT"
case "$part" in
build)
  VARIANTS=stock,ostinato OP_TESTS=0 TESTS_K=borrow TESTS_BUDGET=${TESTS_BUDGET:-120} \
      bash "$here/../branches/run.sh" build
  ;;
sweeps|reverse|churn)
  OST="ostinato-overlap, ostinato-borrow"
  sweep() {  # name, engines, sizes, extra server args (YAML list items)
    printf 'sweep:\n  sizes: [%s]\n  server_args: ["--load-mode", "none"%s]\n' "$3" "$4" > "$OUT/$1.yaml"
    rm -rf results/sweep
    ENGINES="$2" SWEEP_CONFIG="$OUT/$1.yaml" BUDGET=${BUDGET:-200} bash "$here/../branches/run.sh" sweep
    mv "$OUT/sweep.tar.gz" "$OUT/$1.tar.gz"; mv "$OUT/snakemake-sweep.log" "$OUT/snakemake-$1.log"
    mv "$OUT/machine-sweep.txt" "$OUT/$1-machine.txt"
  }
  if [ "$part" = churn ]; then
    VARIANTS=stock,ostinato OP_TESTS=0 TESTS_K=no_test_matches_this TESTS_BUDGET=30 bash "$here/../branches/run.sh" build
    sweep admit1 "$OST" "511" ', "--residency-borrow-admit", "1"'
    sweep stable "$OST" "511" ', "--residency-borrow-admit", "1", "--residency-borrow-decay", "0.99", "--residency-borrow-margin", "1"'
  elif [ "$part" = reverse ]; then
    sweep plain2 "ostinato-borrow, ostinato-overlap, llama.cpp-layers" "128, 256, 511" ""
  else
    sweep plain "llama.cpp-layers, $OST" "128, 256, 511" ""
    sweep timers "$OST" "511" ', "--residency-timers"'
    sweep t15 "$OST" "511" ', "-t", "15"'
  fi
  ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
