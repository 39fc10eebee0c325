"""Ship a run of the default config as a reference: the deterministic results the documents quote, with the commit,
the command and the machine (`data/reference/<machine>/`, written by `ostinato artifact collect`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd

from ostinato.atomic import atomic_open
from ostinato.machine import describe_machine

# What the documents quote of a run of config/config.yaml: the outcomes that do not depend on the machine's speed
# (sessions, routing facts, plans, simulator, limit, memory model) and the replay's correctness columns.
COLLECTED = (
    "tables/table2.csv",
    "tables/routing_stats.csv",
    "results/residency/summary.json",
    "results/residency/memory/tiny-v4.check.json",
    "results/costmodel/checks-paper-4x4090d.json",
    "results/routing/synthetic-swe-heldout/manifest.json",
    "results/sim/synthetic-swe-heldout/sessions.csv",
    "results/limit/synthetic-swe-heldout.json",
    "tables/sim_validation.csv",
    "tables/sim_validation_ablation.csv",
    "tables/sim_validation_fig7a.csv",
    "tables/sim_validation_limit.csv",
    "tables/sim_validation_tool_ttft.csv",
    "results/replay/sessions.csv",
    "results/replay/requests.csv",
    "tables/replay_compare.csv",
)


def benchmarks(root: Path) -> pd.DataFrame:
    """Every rule's Snakemake benchmark of the run (`results/<stage>/...benchmark.tsv`): stage, file, wall seconds,
    CPU seconds and peak memory."""
    rows = []
    for p in sorted((root / "results").rglob("*.benchmark.tsv")):
        b = pd.read_csv(p, sep="\t")
        rel = p.relative_to(root / "results")
        rows.append({"stage": rel.parts[0], "benchmark": str(rel), "s": float(b["s"].iloc[0]),
                     "cpu_time_s": float(b["cpu_time"].iloc[0]), "max_rss_mb": float(b["max_rss"].iloc[0])})
    if not rows:
        raise FileNotFoundError(f"{root}/results: no *.benchmark.tsv (a run of this version's rules writes them)")
    return pd.DataFrame(rows)


def disk_bytes(root: Path) -> dict[str, int]:
    """Bytes on disk of what the run made: each results/<stage>/, models/, figures/, tables/, build/, .venv/."""
    def size(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink()) if p.is_dir() else 0

    out = {f"results/{d.name}": size(d) for d in sorted((root / "results").iterdir()) if d.is_dir()}
    out.update({name: size(root / name) for name in ("models", "figures", "tables", "build", ".venv")})
    return out


def collect(root: Path, out: Path, label: str, command: str) -> list[Path]:
    """Copy `COLLECTED` from a finished run under `root` into `out`, keeping the paths, with `run.json` (commit,
    command, machine). A missing file is an error naming it: the run is incomplete."""
    missing = [p for p in COLLECTED if not (root / p).is_file()]
    if missing:
        raise FileNotFoundError(f"{root}: the run lacks {', '.join(missing)} (run `{command}` first)")
    # the tree's state before this copy writes into it (out is usually inside the repository)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True).stdout.strip())
    written = []
    for rel in COLLECTED:
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, dst)
        written.append(dst)
    with atomic_open(out / "benchmarks.csv") as f:
        benchmarks(root).to_csv(f, index=False)
    doc = {"commit": commit, "dirty": dirty, "command": command, "machine": describe_machine(label).to_json(),
           "disk_bytes": disk_bytes(root), "files": list(COLLECTED)}
    with atomic_open(out / "run.json") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    return written + [out / "benchmarks.csv", out / "run.json"]
