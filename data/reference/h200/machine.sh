# Sourced by the GPU machine's scripts that run snakemake (heldout/, branches/, baselines/; bash). config/h200.yaml
# labels its measured series `h200`, but a device call may be lent an H100 in its place (since 2026-12-05 a call that
# names no kind gets one first): then the label follows the GPU that ran, so that no H100 timing is shown as the
# H200's, and its results belong under data/reference/h100/. `replay same-engine` (the held-out resumption) keeps no
# replay carried from another GPU model.

# the machine label of this GPU (`ostinato.machine`'s default label, from nvidia-smi: h200, h100, ...); needs the
# package on PYTHONPATH, as the scripts set it before their snakemake calls
gpu_machine() {
  python3 -c 'from ostinato.machine import describe_machine; print(describe_machine().label)'
}

# the shipped held-out run whose replay.tar.gz a GPU model (the label, $1) resumes: ../carry.sh copies it into
# .carry/resume/<label>/, and it travels with the tracked files in any case
shipped_resume() {
  case "$1" in
    h200) echo data/reference/h200/heldout/run1-borrow/replay.tar.gz ;;
    h100) echo data/reference/h100/heldout/run1/replay.tar.gz ;;
  esac
}

# the replay tarball carried for this machine's GPU model: .carry/resume/<label>/replay.tar.gz, else
# .carry/resume/replay.tar.gz, else the shipped one of its GPU model (`shipped_resume`, in the working tree), else
# nothing. A call learns its GPU only when it runs, so a tarball per GPU model can be carried at once; one of another
# GPU model's replays is never used, since replays compare only within one GPU model. Where the shipped tarball is the
# latest (a device session's tarball collected and committed), a call needs no .carry/resume/: it saves the 64 MiB a
# call carries for other things
carried_resume() {
  local f label
  label=$(gpu_machine)
  for f in ".carry/resume/$label/replay.tar.gz" .carry/resume/replay.tar.gz "$(shipped_resume "$label")"; do
    if [ -n "$f" ] && [ -f "$f" ]; then echo "$f"; return 0; fi
  done
}

# what this machine is, written to $1 (the commit the working tree came from, then nvidia-smi, nvcc, lscpu, free):
# each call that measures writes its own, since a call may find a fresh machine of the kind, not the build's
machine_info() {
  { git rev-parse HEAD 2>/dev/null || true; nvidia-smi; nvcc --version; lscpu; free -g; } > "$1" 2>&1 || true
}

# the replay inputs that a carried tarball ($1; none: "") ran with and that this machine makes again before it keeps its
# replays (heldout/run.sh's resumption): every plan and every set of borrowed-memory parameters (`tune_borrow`) the
# tarball holds under results/residency/replay/, with the paths given after it (the config's own plan), one per line.
# Each must come out the same here, and each must be made before the carried replays are marked up to date: one made
# after them is newer than their outputs, and snakemake replays them again (on 2026-12-06 `tune_borrow`'s parameters,
# made after the mark, had `ostinato`'s finished τ² replay replayed again, 210 s of device time)
carried_inputs() {
  local listed=""
  if [ -n "$1" ]; then
    listed=$(tar -tzf "$1" | grep -E '^results/residency/replay/[^/]+\.(plan|borrow)\.json$' || true)
  fi
  printf '%s\n' "${@:2}" $listed | sort -u
}
