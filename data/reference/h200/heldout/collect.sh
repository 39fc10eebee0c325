#!/usr/bin/env bash
# A shipped run folder of whole held-out sessions from the replay.tar.gz a device call brought back (run.sh), on a CPU
# machine, from the repository root with the project's .venv:
#   bash data/reference/h200/heldout/collect.sh TARBALL DEST [SET]
# SET: one session set; without it, every set of the tarball that an engine finished or has sessions of under way.
# The τ² set's tables go into DEST (the layout of the shipped run folders), another set's into DEST/<set>/ (made if
# missing; the files below are replaced, nothing else is touched):
#   replay.tar.gz                     the tarball itself (in DEST), which a later device session resumes (../carry.sh)
#   sessions.csv, requests.csv        `ostinato replay summarize` over the engines that finished the set
#                                     (<engine>.sessions.csv beside their directories)
#   runs-<engine>.json                each engine's runs.json: its builds, machines and calls
#   compare.{csv,md}, by-new-tokens.{csv,md}
#                                     `ostinato replay compare` on them (and `--by-new-tokens`, the paper's Figure 7a),
#                                     when Ostinato is among them
#   partial.{sessions,requests}.csv, compare-<engine>.{csv,md}
#                                     for the engines under way (their .partial/ directories with sessions): their
#                                     finished sessions, and Ostinato against each on the sessions both finished;
#                                     partial.* is removed when none is under way, compare-<engine>.* when the
#                                     engine and Ostinato finished the set
# RUN=<r> (default 1): the replay.repeats run to collect. Run 1 is results/replay/<set>/, a later run <r> (the engine
# order reversed, and so on) results/replay/run<r>/<set>/, collected into its own DEST (e.g. a run<r>/ beside run1/)
# without a copy of the tarball: run 1's DEST keeps the one a later device session resumes, which holds every run.
# The foreign-load threshold is `replay summarize`'s default, as in the default config (FLT=<share> to override).
set -euo pipefail
usage="usage: collect.sh TARBALL DEST [SET]"
tarball=${1:?$usage}
dest=${2:?$usage}
only=${3:-}
BIN=${BIN:-.venv/bin}
ost() { "$BIN/ostinato" "$@"; }
load=(${FLT:+--foreign-load-threshold "$FLT"})
target=ostinato

run=${RUN:-1}
[[ "$run" =~ ^[1-9][0-9]*$ ]] || { echo "collect.sh: RUN=$run: expected a run number (1, 2, ...)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$tarball" -C "$tmp" results/replay
root="$tmp/results/replay"
if [ "$run" -gt 1 ]; then
  root="$root/run$run"
  [ -d "$root" ] || { echo "collect.sh: $tarball holds no results/replay/run$run (RUN=$run)" >&2; exit 2; }
fi

# finished and under-way engines of set $1, into the arrays finished and under_way
engines_of() {
  local d="$root/$1" f s
  finished=(); under_way=()
  for f in "$d"/*.sessions.csv; do [ -e "$f" ] && finished+=("$(basename "$f" .sessions.csv)"); done
  for s in "$d"/.partial/*/sessions; do
    [ -n "$(find "$s" -maxdepth 1 -name '*.jsonl' -print -quit 2>/dev/null)" ] && under_way+=("$(basename "$(dirname "$s")")")
  done
  return 0
}

has() { local x=$1; shift; local e; for e in "$@"; do [ "$e" = "$x" ] && return 0; done; return 1; }

sets=()
if [ -n "$only" ]; then
  [ -d "$root/$only" ] || { echo "collect.sh: $tarball holds no ${root#"$tmp/"}/$only" >&2; exit 2; }
  engines_of "$only"
  [ $((${#finished[@]} + ${#under_way[@]})) -gt 0 ] || {
    echo "collect.sh: no engine finished $only or has sessions of it under way in $tarball" >&2; exit 2; }
  sets=("$only")
else
  for d in "$root"/*/; do
    s=$(basename "$d")
    [[ "$s" =~ ^run[0-9]+$ ]] && continue  # a later run's sets (RUN=<r>)
    engines_of "$s"
    [ $((${#finished[@]} + ${#under_way[@]})) -gt 0 ] && sets+=("$s")
  done
  [ ${#sets[@]} -gt 0 ] || { echo "collect.sh: no engine finished a set or has sessions under way in $tarball" >&2; exit 2; }
fi

mkdir -p "$dest"
[ "$run" -gt 1 ] || [ "$(realpath "$tarball")" = "$(realpath -m "$dest/replay.tar.gz")" ] \
  || cp "$tarball" "$dest/replay.tar.gz"
for s in "${sets[@]}"; do
  d="$root/$s"
  out=$dest; [ "$s" = tau2-heldout ] || out="$dest/$s"
  mkdir -p "$out"
  engines_of "$s"
  echo "$s: finished: ${finished[*]:-none}; under way: ${under_way[*]:-none}"
  if [ ${#finished[@]} -gt 0 ]; then
    ost replay summarize --in "${finished[@]/#/$d/}" --out "$out/sessions.csv" --requests-out "$out/requests.csv" \
        "${load[@]}"
    for e in "${finished[@]}"; do cp "$d/$e/runs.json" "$out/runs-$e.json"; done
    if has "$target" "${finished[@]}" && [ ${#finished[@]} -gt 1 ]; then
      ost replay compare --sessions "$out/sessions.csv" --requests "$out/requests.csv" --out "$out/compare" \
          --by-new-tokens "$out/by-new-tokens"
    fi
  fi
  rm -f "$out/partial.sessions.csv" "$out/partial.requests.csv"
  # an earlier collect's comparison on the sessions under way, of an engine compare.* now holds in full
  if has "$target" "${finished[@]}"; then
    for e in "${finished[@]}"; do rm -f "$out/compare-$e.csv" "$out/compare-$e.md"; done
  fi
  [ ${#under_way[@]} -gt 0 ] || continue
  ost replay summarize --in "${under_way[@]/#/$d/.partial/}" --out "$out/partial.sessions.csv" \
      --requests-out "$out/partial.requests.csv" "${load[@]}"
  for e in "${under_way[@]}"; do cp "$d/.partial/$e/runs.json" "$out/runs-$e.json"; done
  has "$target" "${finished[@]}" "${under_way[@]}" || continue
  # Ostinato against each engine under way on the sessions both finished (compare keeps only the sessions every
  # compared engine completed)
  all=("${finished[@]/#/$d/}" "${under_way[@]/#/$d/.partial/}")
  ost replay summarize --in "${all[@]}" --out "$tmp/all.sessions.csv" --requests-out "$tmp/all.requests.csv" \
      "${load[@]}"
  for e in "${under_way[@]}"; do
    [ "$e" = "$target" ] && continue
    ost replay compare --sessions "$tmp/all.sessions.csv" --requests "$tmp/all.requests.csv" --engines "$e" \
        --out "$out/compare-$e"
  done
  # Ostinato itself under way: against each finished engine on the sessions it finished
  if has "$target" "${under_way[@]}"; then
    for e in "${finished[@]}"; do
      ost replay compare --sessions "$tmp/all.sessions.csv" --requests "$tmp/all.requests.csv" --engines "$e" \
          --out "$out/compare-$e"
    done
  fi
done
