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

# the replay tarball carried for this machine's GPU model: .carry/resume/<label>/replay.tar.gz, else
# .carry/resume/replay.tar.gz, else nothing. A call learns its GPU only when it runs, so a tarball per GPU model can be
# carried at once; one of another GPU model's replays is never used, since replays compare only within one GPU model
carried_resume() {
  local f
  for f in ".carry/resume/$(gpu_machine)/replay.tar.gz" .carry/resume/replay.tar.gz; do
    if [ -f "$f" ]; then echo "$f"; return 0; fi
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
