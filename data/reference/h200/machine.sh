# Sourced by the GPU machine's scripts that run snakemake (heldout/, branches/, baselines/; bash). config/h200.yaml
# labels its measured series `h200`, but a device call may be lent an H100 in its place (since 2026-12-05 a call that
# names no kind gets one first): then the label follows the GPU that ran, so that no H100 timing is shown as the
# H200's, and its results belong under data/reference/h100/. `replay same-engine` (the held-out resumption) keeps no
# replay carried from another GPU model.

# the machine label of this GPU: h200 or h100 by nvidia-smi's first GPU name, else `auto` (the host name)
gpu_machine() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  case "$name" in
    *H200*) echo h200 ;;
    *H100*) echo h100 ;;
    *) echo auto ;;
  esac
}
