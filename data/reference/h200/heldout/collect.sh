#!/usr/bin/env bash
# A shipped run folder of whole held-out sessions from the replay.tar.gz a device call brought back (run.sh), on a CPU
# machine, from the repository root with the project's .venv:
#   bash data/reference/h200/heldout/collect.sh TARBALL DEST [SET]      (SET: the session set, default tau2-heldout)
# It writes into DEST (made if missing; the files below are replaced, nothing else is touched):
#   replay.tar.gz                     the tarball itself, which a later device session resumes (../carry.sh)
#   sessions.csv, requests.csv        `ostinato replay summarize` over the engines that finished SET (<engine>.sessions.csv
#                                     beside their directories)
#   runs-<engine>.json                each engine's runs.json: its builds, machines and calls
#   compare.{csv,md}, by-new-tokens.{csv,md}
#                                     `ostinato replay compare` on them (and `--by-new-tokens`, the paper's Figure 7a)
#   partial.{sessions,requests}.csv, compare-<engine>.{csv,md}
#                                     for the engines under way (their .partial/ directories): their finished sessions
#                                     and Ostinato against each on those sessions; partial.* is removed when none is
# The foreign-load threshold is `replay summarize`'s default, as in the default config (FLT=<share> to override).
set -euo pipefail
tarball=${1:?usage: collect.sh TARBALL DEST [SET]}
dest=${2:?usage: collect.sh TARBALL DEST [SET]}
set_name=${3:-tau2-heldout}
BIN=${BIN:-.venv/bin}
ost() { "$BIN/ostinato" "$@"; }
load=(${FLT:+--foreign-load-threshold "$FLT"})

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$tarball" -C "$tmp" results/replay
d="$tmp/results/replay/$set_name"
[ -d "$d" ] || { echo "collect.sh: $tarball holds no results/replay/$set_name" >&2; exit 2; }
finished=(); under_way=()
for f in "$d"/*.sessions.csv; do [ -e "$f" ] && finished+=("$(basename "$f" .sessions.csv)"); done
for s in "$d"/.partial/*/sessions; do [ -d "$s" ] && under_way+=("$(basename "$(dirname "$s")")"); done
[ ${#finished[@]} -gt 0 ] || { echo "collect.sh: no engine finished $set_name in $tarball" >&2; exit 2; }
echo "finished: ${finished[*]}; under way: ${under_way[*]:-none}"

mkdir -p "$dest"
[ "$(realpath "$tarball")" = "$(realpath -m "$dest/replay.tar.gz")" ] || cp "$tarball" "$dest/replay.tar.gz"
ost replay summarize --in "${finished[@]/#/$d/}" --out "$dest/sessions.csv" --requests-out "$dest/requests.csv" "${load[@]}"
for e in "${finished[@]}"; do cp "$d/$e/runs.json" "$dest/runs-$e.json"; done
ost replay compare --sessions "$dest/sessions.csv" --requests "$dest/requests.csv" --out "$dest/compare" \
    --by-new-tokens "$dest/by-new-tokens"

rm -f "$dest/partial.sessions.csv" "$dest/partial.requests.csv"
if [ ${#under_way[@]} -gt 0 ]; then
  ost replay summarize --in "${under_way[@]/#/$d/.partial/}" --out "$dest/partial.sessions.csv" \
      --requests-out "$dest/partial.requests.csv" "${load[@]}"
  # Ostinato against each engine under way on the sessions that engine finished (compare keeps only the sessions
  # every compared engine completed)
  ost replay summarize --in "${finished[@]/#/$d/}" "${under_way[@]/#/$d/.partial/}" --out "$tmp/all.sessions.csv" \
      --requests-out "$tmp/all.requests.csv" "${load[@]}"
  for e in "${under_way[@]}"; do
    cp "$d/.partial/$e/runs.json" "$dest/runs-$e.json"
    ost replay compare --sessions "$tmp/all.sessions.csv" --requests "$tmp/all.requests.csv" --engines "$e" \
        --out "$dest/compare-$e"
  done
fi
