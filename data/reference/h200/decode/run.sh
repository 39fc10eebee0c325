#!/usr/bin/env bash
# H200: issue 14's measurements of the split path's branches, in turn and overlapped, through the pipeline itself
# (snakemake on config/h200.yaml), in calls of at most ten minutes on one machine (the build stays on it between calls):
#   bash data/reference/h200/decode/run.sh build|sweep|calibrate|sweep2
# The parts are those of ../branches/run.sh, which this runs with its results in data/reference/h200/decode/out
# (the build part there also keeps the engine tests' scheduler listings). This folder's run (commit b8fad3e) was of
# the engine before the branch orders became one graph; checking that commit out redoes it.
set -euo pipefail
OUT=${OUT:-$(dirname "$0")/out} exec bash "$(dirname "$0")/../branches/run.sh" "$@"
