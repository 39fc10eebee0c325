#!/usr/bin/env bash
# Two or more runs of one session set as one comparison (replay.repeats: run 1 in the config's engine order, run 2
# reversed, ...), from the replay.tar.gz a device call brought back (run.sh), on a CPU machine, from the repository
# root with the project's .venv:
#   bash data/reference/h200/heldout/pool.sh TARBALL DEST [SET]
# SET (default tau2-heldout): the session set. Its runs are results/replay/<set>/ (run 1) and
# results/replay/run<r>/<set>/ (run r = 2, 3, ... as long as the tarball holds one in which an engine finished the
# set); the engines pooled are those that finished it in every run, Ostinato among them. Writes into DEST (made if
# missing; nothing else is touched):
#   sessions.csv, requests.csv   `ostinato replay summarize --runs <n>` over their replays, run by run, as the
#                                pipeline's summary does with replay.repeats: a session's id gets #run<i>
#   compare.{csv,md}             `ostinato replay compare` on them: each session run counts as a session
# The foreign-load threshold is `replay summarize`'s default, as in the default config (FLT=<share> to override).
set -euo pipefail
export LC_ALL=C
usage="usage: pool.sh TARBALL DEST [SET]"
tarball=${1:?$usage}
dest=${2:?$usage}
set_=${3:-tau2-heldout}
BIN=${BIN:-.venv/bin}
ost() { "$BIN/ostinato" "$@"; }
load=(${FLT:+--foreign-load-threshold "$FLT"})
target=ostinato

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$tarball" -C "$tmp" results/replay
root="$tmp/results/replay"

finished_in() { local f; for f in "$1"/*.sessions.csv; do [ -e "$f" ] && basename "$f" .sessions.csv; done; return 0; }

# the runs of the set, in order, and the engines every one of them finished
dirs=()
[ -n "$(finished_in "$root/$set_")" ] && dirs+=("$root/$set_")
r=2
while [ ${#dirs[@]} -eq $((r - 1)) ] && [ -n "$(finished_in "$root/run$r/$set_")" ]; do
  dirs+=("$root/run$r/$set_"); r=$((r + 1))
done
[ ${#dirs[@]} -ge 2 ] || {
  echo "pool.sh: $tarball holds ${#dirs[@]} run(s) of $set_ with a finished engine; pooling needs 2 or more" >&2; exit 2; }
common=$(finished_in "${dirs[0]}")
for d in "${dirs[@]:1}"; do common=$(comm -12 <(echo "$common") <(finished_in "$d")); done
engines=($common)
printf '%s\n' "${engines[@]}" | grep -qx "$target" && [ ${#engines[@]} -gt 1 ] || {
  echo "pool.sh: $set_: the engines that finished every one of its ${#dirs[@]} runs (${engines[*]:-none}) do not" \
       "include $target and another engine" >&2; exit 2; }
echo "$set_: ${#dirs[@]} runs; pooled: ${engines[*]}"

inputs=()
for d in "${dirs[@]}"; do for e in "${engines[@]}"; do inputs+=("$d/$e"); done; done
mkdir -p "$dest"
ost replay summarize --in "${inputs[@]}" --runs ${#dirs[@]} --out "$dest/sessions.csv" \
    --requests-out "$dest/requests.csv" "${load[@]}"
ost replay compare --sessions "$dest/sessions.csv" --requests "$dest/requests.csv" --out "$dest/compare"
