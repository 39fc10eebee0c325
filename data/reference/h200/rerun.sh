# Sourced by heldout/run.sh (bash, set -e): the finished replays marked up to date, and the replays of RERUN's engines
# made again on this machine. Each replay's input is the one before it in the engine order (replay_after,
# workflow/rules/common/replay.smk: the order, nothing it reads), so a replay made again makes every finished one after
# it in that order outdated, and a snakemake call whose targets lie past them replays those again too (2026-12-07:
# RERUN="ostinato ktransformers-placement" replayed buun again and left no time for ktransformers-placement). So each
# target gets a snakemake call of its own, the finished replays touched before it (`snakemake --touch` leaves a missing
# output missing): only the target and the replays before it that are not finished run. (ancient() on the order's input
# would fix it in the workflow, but snakemake 9.27.1 then drops a missing replay that follows one it must run: its DAG
# masks the jobs after a needed one and passes ancient inputs over when it walks them.)

# the finished replays of every engine, set and run (not the summary's sessions.csv, not the bitwise check's)
finished_replays() {
  find results/replay -name '*.sessions.csv' ! -name sessions.csv ! -path 'results/replay/bitwise/*' | sort
}

# FILES (finished replays' sessions.csv) marked up to date, where snakemake would make them again; log appended to
# $OUT/snakemake-touch.log
touch_replays() {
  python3 -m snakemake --nolock --cores 1 "${CONFIG[@]}" --touch "$@" >> "$OUT/snakemake-touch.log" 2>&1
}

# each target not made yet in turn: the finished replays touched, then `smk SECONDS TARGET` (heldout/run.sh's snakemake
# call) for the seconds left of the call (CALL seconds from `start`); its log in $OUT/snakemake-replay-<time>.log. Stops
# when less than 30 s are left; returns the last failed call's status.
replay_each() {
  local t done_now left rc=0
  for t in "$@"; do
    [ -f "$t" ] && continue
    done_now=$(finished_replays)
    if [ -n "$done_now" ]; then touch_replays $done_now; fi
    left=$(( CALL - ($(date +%s) - start) ))
    [ "$left" -gt 30 ] || break
    smk "$left" "$t" > "$OUT/snakemake-replay-$(date +%s).log" 2>&1 || rc=$?
  done
  return $rc
}
