#!/usr/bin/env bash
# H200: issue 14's borrowed memory (engine/README.md, "Borrowed memory") through the pipeline itself (snakemake on
# config/h200.yaml), in calls of at most ten minutes on one machine (the build stays on it between calls):
#   bash data/reference/h200/borrow/run.sh build    # CUDA build, the engine tests on the GPU (borrowed memory's among
#                                                   # them: in turn against overlapped, the Python reference's
#                                                   # counters, upload passes taking the slots back), then the model
#   bash data/reference/h200/borrow/run.sh sweep    # decode and short prefills after prefixes of 3,072 and 8,192
#                                                   # tokens: whole layers, ostinato overlapped without and with
#                                                   # borrowed memory (the engine's defaults; the summary gives the
#                                                   # routes computed on borrowed experts per decode step)
#   bash data/reference/h200/borrow/run.sh sweep2   # the same, engine order reversed
# The parts are those of ../branches/run.sh, which this runs with its results in data/reference/h200/borrow/out.
set -euo pipefail
export ENGINES=${ENGINES:-llama.cpp-layers, ostinato-overlap, ostinato-borrow}
export OUT=${OUT:-$(dirname "$0")/out}
mkdir -p "$OUT"
# the split path's sizes: the decode after the largest then finds the slots lent (an upload pass takes them back).
# SWEEP_CONFIG=" " measures config/h200.yaml's sizes instead, 1,024 and 2,048 new tokens (upload path) among them
printf 'sweep:\n  sizes: [128, 256, 511]\n' > "$OUT/sweep.yaml"
export SWEEP_CONFIG=${SWEEP_CONFIG-$OUT/sweep.yaml}
exec bash "$(dirname "$0")/../branches/run.sh" "$@"
