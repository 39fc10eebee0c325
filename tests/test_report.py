"""The evaluator's report on the default config: the whole pipeline (`snakemake --cores 2`) in a temporary copy of the
workflow that reuses the engine build, then `snakemake --report report.html`, then the page in a headless Chromium:
the verdict table first, every figure decoded and shown. Prints how long each step took (`pytest -rP`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from report_browser import chromium, probe, screenshot

REPO = Path(__file__).resolve().parents[1]
BACKEND = os.environ.get("OSTINATO_ENGINE_BACKEND", "cpu")
PARTS = ("Snakefile", "workflow", "config", "engine", "environment.yml", "data", "notebooks", "artifact")
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Run:
    """A finished default-config run: its directory and how long the pipeline and the report took."""

    repo: Path
    pipeline_s: float
    report_s: float


def _snakemake(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, env=env)


def _link_engine(build: Path, repo: Path) -> None:
    """The engine build as the pipeline's build_engine leaves it, made of links to the suite's build: the variants'
    binaries and manifests file by file (a job that replaced its outputs would replace the links, never the build)
    and the pinned tree (its gguf-py writes the model). The links are newer than the copied engine/ sources, so
    Snakemake has nothing to rebuild."""
    out = repo / "build" / "engine" / BACKEND
    out.mkdir(parents=True)
    (out / "tree").symlink_to(build / "tree")
    for variant in ("stock", "ostinato"):
        (out / variant / "bin").mkdir(parents=True)
        (out / variant / "manifest.json").symlink_to(build / variant / "manifest.json")
        for tool in ("llama-server", "llama-bench"):
            (out / variant / "bin" / tool).symlink_to(build / variant / "bin" / tool)


@pytest.fixture(scope="module")
def default_run(engine_variants: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("default-run")
    repo = root / "repo"
    repo.mkdir()
    for part in PARTS:
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, repo / part)
    _link_engine(engine_variants["stock"].parent.parent.resolve(), repo)
    shared = REPO.parent / "shared"  # the default config reads its traces from the mirror ../shared/traces if present
    if (shared / "traces").is_dir():
        (root / "shared").symlink_to(shared)
    t0 = time.monotonic()
    proc = _snakemake("--cores", "2", cwd=repo)
    pipeline_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    assert "rule build_engine" not in proc.stdout + proc.stderr, "the run rebuilt the engine"
    t0 = time.monotonic()
    proc = _snakemake("--report", "report.html", cwd=repo)
    report_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    print(f"default-config pipeline: {pipeline_s / 60:.1f} min; snakemake --report: {report_s:.0f} s")
    return Run(repo, pipeline_s, report_s)


def _report_data(page: Path) -> tuple[dict, dict]:
    """The report's `results` and `categories` (JSON it embeds for its app)."""
    text = page.read_text(encoding="utf-8")
    found = {}
    for name in ("results", "categories"):
        m = re.search(rf'<script id="{name}">\s*var {name} = (.*?);\s*</script>', text, re.S)
        assert m, f"report.html holds no `{name}`"
        found[name] = json.loads(m.group(1))
    return found["results"], found["categories"]


def test_the_verdict_has_every_claim_with_its_numbers(default_run: Run) -> None:
    from ostinato.artifact.checks import load_claims

    df = pd.read_csv(default_run.repo / "tables" / "claims.csv")
    claims = load_claims(REPO / "artifact" / "claims.yaml")
    assert list(dict.fromkeys(df["claim"])) == [c.id for c in claims]
    assert set(df["outcome"]) <= {"met", "not met", "not applicable here", "not run"}
    mine = df[df["on"] == "this run"]
    # what a CPU-only default run shows: its own checks met, the speed checks not applicable, the tests' not run
    # (no results/artifact/pytest.xml in the copy), and no this-run check without its input otherwise
    for _, r in mine.iterrows():
        if r["source"].startswith("results/artifact/pytest.xml"):
            assert r["outcome"] == "not run", r["check"]
        elif BACKEND == "cpu" and r["applies"] == "gpu":
            assert r["outcome"] == "not applicable here", r["check"]
        else:
            assert r["outcome"] in ("met", "not met"), (r["check"], r["note"])
            assert isinstance(r["measured"], str) and r["measured"], r["check"]
    assert (mine[mine["check"].isin(["A1.1", "A4.1", "A6.1", "A7.1", "A8.1", "A15.1", "A21.1"])]["outcome"]
            == "met").all()
    md = (default_run.repo / "tables" / "claims.md").read_text()
    assert md.startswith("# Verdict of the claims") and "| A21 |" in md and "| C8 |" in md
    agent = json.loads((default_run.repo / "results" / "artifact" / "local_agent.json").read_text())
    assert agent["ok"] and {e["name"] for e in agent["exchanges"]} == {"plan", "chat", "stream", "tools",
                                                                        "tool_result"}


def test_the_report_holds_every_figure_and_table_by_section(default_run: Run) -> None:
    page = default_run.repo / "report.html"
    results, categories = _report_data(page)
    assert sorted(categories)[0] == "Claims: the verdict"
    sections = [c for c in sorted(categories) if c.startswith("Section ")]
    assert sections == sorted(sections) and len(sections) == 8, sorted(categories)
    figures = sorted(p for p in results if p.startswith("figures/"))
    expected = {f"figures/{r}.png" for r in ("table2", "routing_stats", "calibrate", "predicted", "table3", "fig1",
                                             "fig4", "table7", "fig5", "fig6", "fig7b", "table8", "table4",
                                             "sim_validation", "replay_summary")}
    assert set(figures) == expected
    for path, entry in results.items():
        assert entry["caption"].strip(), f"{path} has no caption"
        assert entry["data_uri"].startswith("data:"), path
    # the captions say which series are measured, and on what machine
    machine = pd.read_csv(default_run.repo / "results" / "replay" / "sessions.csv")["machine"].iloc[0]
    assert f"measured ({machine})" in results["figures/table3.png"]["caption"]
    text = page.read_text(encoding="utf-8")
    assert "ostinato-verdict" in text and len(text) < 50e6


def test_the_report_opens_in_a_browser_with_its_images(default_run: Run, tmp_path: Path) -> None:
    if chromium() is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; `make test` installs it as root)")
    results, _ = _report_data(default_run.repo / "report.html")
    t0 = time.monotonic()
    found = probe(default_run.repo / "report.html", tmp_path)
    print(f"chromium probe: {time.monotonic() - t0:.0f} s")
    assert not found.errors, found.errors
    n_claims = pd.read_csv(default_run.repo / "tables" / "claims.csv")["claim"].nunique()
    assert found.verdict_rows == n_claims  # the verdict table is on the first page
    n_images = sum(1 for e in results.values() if e["mime_type"].startswith("image/"))
    assert len(found.images) == len(found.shown) == n_images
    assert found.images_ok, [i for i in found.images + found.shown if not i["ok"]] + found.broken_img
    shot = screenshot(default_run.repo / "report.html", tmp_path)
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.std() > 0.01, "the report's first page renders blank"
