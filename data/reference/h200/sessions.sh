# Sourced by the GPU machine's scripts that run snakemake (heldout/, branches/ and the scripts that call it, baselines/;
# bash, set -e). That machine has no trace mirror and no network, so snakemake there builds the session sets from the
# committed per-turn tables (`ostinato sessions get`'s fallback): the same lengths with other token ids than a CPU
# machine's sets from the mirror, hence other development routing, other plans and other replays than those of a
# session that carried the sets. On 2026-12-05 a sweep's call built them so on a machine that the held-out replay's
# call then found with its plans differing from the carried replays' (their replays were not kept, and that call
# replayed other sessions than the held-out ones). So the carried sets go in before snakemake runs, in every call.
CARRIED_SESSIONS=.carry/sessions

# every file of .carry/sessions/ copied into results/sessions/ where it is missing or differs (the whole folder then
# touched, so that snakemake takes the sets as up to date and remakes what was made from others); a call that finds
# them there already changes nothing. Without the carried folder: exit 4 when REQUIRE_SESSIONS=1 (the held-out
# replays), else a warning that the sets come from the tables.
carried_sessions() {
  if [ ! -d "$CARRIED_SESSIONS" ]; then
    if [ "${REQUIRE_SESSIONS:-0}" = 1 ]; then
      echo "sessions: no $CARRIED_SESSIONS/ carried (the session sets of a CPU machine with the trace mirror:" \
           "results/sessions/ of \`snakemake --configfile config/h200.yaml --until build_sessions\`)" >&2
      exit 4
    fi
    echo "sessions: no $CARRIED_SESSIONS/ carried; snakemake builds the session sets from the committed per-turn tables" >&2
    return 0
  fi
  local f changed=0
  while IFS= read -r f; do
    if ! cmp -s "$CARRIED_SESSIONS/$f" "results/sessions/$f"; then
      mkdir -p "results/sessions/$(dirname "$f")" && cp "$CARRIED_SESSIONS/$f" "results/sessions/$f"
      changed=$((changed + 1))
    fi
  done < <(cd "$CARRIED_SESSIONS" && find . -type f | sed 's|^\./||' | sort)
  if [ "$changed" -gt 0 ]; then
    find results/sessions -exec touch {} +
    echo "sessions: $changed carried file(s) copied into results/sessions/"
  fi
}
