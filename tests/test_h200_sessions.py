"""The GPU machine's scripts put the carried session sets in results/sessions/ before snakemake runs
(data/reference/h200/sessions.sh): that machine has no trace mirror, and sets built there from the committed per-turn
tables have other token ids, hence other development routing, plans and replays."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "data" / "reference" / "h200"


def _carried_sessions(cwd: Path, **env: str) -> subprocess.CompletedProcess:
    script = f"set -euo pipefail; source {H200 / 'sessions.sh'}; carried_sessions"
    return subprocess.run(["bash", "-c", script], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True)


def test_carried_sessions_replace_sets_built_from_the_tables(tmp_path):
    carried, results = tmp_path / ".carry" / "sessions", tmp_path / "results" / "sessions"
    (carried / "traces").mkdir(parents=True)
    (carried / "tau2-heldout.jsonl").write_text('{"session": "mirror"}\n')
    (carried / "traces" / "tau2.json").write_text('{"mode": "mirror"}\n')
    results.mkdir(parents=True)
    (results / "tau2-heldout.jsonl").write_text('{"session": "tables"}\n')  # what the GPU machine built itself
    (results / "swe-dev-few.jsonl").write_text('{"session": "tables"}\n')  # a set the carry lacks: left as it is
    first = _carried_sessions(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "2 carried file(s) copied" in first.stdout
    assert (results / "tau2-heldout.jsonl").read_text() == '{"session": "mirror"}\n'
    assert (results / "traces" / "tau2.json").read_text() == '{"mode": "mirror"}\n'
    assert (results / "swe-dev-few.jsonl").read_text() == '{"session": "tables"}\n'
    # the next call on the same machine finds them there and touches nothing (snakemake remakes nothing)
    for p in results.rglob("*"):
        os.utime(p, (1_000_000, 1_000_000))
    second = _carried_sessions(tmp_path)
    assert second.returncode == 0 and "copied" not in second.stdout
    assert {p.stat().st_mtime for p in results.rglob("*")} == {1_000_000}


def test_carried_sessions_are_required_where_the_replays_need_them(tmp_path):
    required = _carried_sessions(tmp_path, REQUIRE_SESSIONS="1")
    assert required.returncode == 4 and "no .carry/sessions/ carried" in required.stderr
    optional = _carried_sessions(tmp_path)
    assert optional.returncode == 0 and "from the committed per-turn tables" in optional.stderr


@pytest.mark.parametrize("script, before", [
    ("heldout/run.sh", r"plans\(\) \{\n  carried_sessions\n  smk"),
    ("heldout/run.sh", r"replay\(\) \{\n  carried_sessions\n"),
    ("branches/run.sh", r"carried_sessions[^\n]*\n  rc=0; smk \"\$BUDGET\""),
    ("baselines/run.sh", r"REQUIRE_SESSIONS=1 carried_sessions[^\n]*\n(?:.*\n){0,12}?\s+timeout \"\$BUDGET\" python3 -m snakemake"),
    ("baselines/run.sh", r"carried_sessions[^\n]*\n  rc=0\n  timeout \"\$BUDGET\" python3 -m snakemake[^\n]*\n(?:[^\n]*\n){1,3}"
                         r"\s+--rerun-triggers mtime --keep-going results/sweep/rows.csv"),
])
def test_gpu_scripts_put_the_carried_sets_in_before_snakemake(script, before):
    text = (H200 / script).read_text()
    assert 'source "$(dirname "$0")/../sessions.sh"' in text
    assert re.search(before, text), f"{script}: carried_sessions does not come before its snakemake call"


def _gpu_machine(tmp_path: Path, smi: str | None) -> str:
    """gpu_machine (data/reference/h200/machine.sh) with a stand-in nvidia-smi printing `smi` (None: no nvidia-smi)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if smi is not None:
        (bindir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s\\n' '{smi}, 580.159.04, 81559, 5, 16, GPU-0e1f2a3b-4c5d-6e7f-8091-a2b3c4d5e6f7'\n")
        (bindir / "nvidia-smi").chmod(0o755)
    script = f"set -euo pipefail; source {H200 / 'machine.sh'}; gpu_machine"
    env = {**os.environ, "PATH": f"{bindir}:{Path(sys.executable).parent}:/usr/bin:/bin",
           "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("smi, label", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
                                        (None, f"cpu-{os.cpu_count()}c")])
def test_the_measured_series_take_the_label_of_the_gpu_that_ran(tmp_path, smi, label):
    """A device call may be lent an H100 for config/h200.yaml: its series are then labelled h100, not h200."""
    assert _gpu_machine(tmp_path, smi) == label


@pytest.mark.parametrize("script", ["heldout/run.sh", "branches/run.sh", "baselines/run.sh"])
def test_every_gpu_snakemake_call_sets_the_machine_label(script):
    text = (H200 / script).read_text()
    assert 'source "$(dirname "$0")/../machine.sh"' in text
    calls = len(re.findall(r"python3 -m snakemake (?:--nolock )?--cores all", text))
    assert calls and text.count('"machine=$(gpu_machine)"') == (1 if script == "heldout/run.sh" else calls)


def _carried_resume(cwd: Path, gpu: str) -> str:
    """carried_resume (data/reference/h200/machine.sh) in `cwd` on a machine whose GPU label is `gpu`."""
    script = f"set -euo pipefail; source {H200 / 'machine.sh'}; gpu_machine() {{ echo {gpu}; }}; carried_resume"
    out = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_resumed_tarball_is_the_one_of_the_gpu_that_runs(tmp_path):
    """Both GPU models' tarballs are carried before a call knows which GPU it gets; each machine resumes its own."""
    assert _carried_resume(tmp_path, "h100") == ""
    resume = tmp_path / ".carry" / "resume"
    resume.mkdir(parents=True)
    (resume / "replay.tar.gz").write_bytes(b"unlabelled")
    assert _carried_resume(tmp_path, "h100") == ".carry/resume/replay.tar.gz"
    for gpu in ("h100", "h200"):
        (resume / gpu).mkdir()
        (resume / gpu / "replay.tar.gz").write_bytes(gpu.encode())
    assert _carried_resume(tmp_path, "h100") == ".carry/resume/h100/replay.tar.gz"
    assert _carried_resume(tmp_path, "h200") == ".carry/resume/h200/replay.tar.gz"


def test_without_a_carried_tarball_a_gpu_resumes_its_shipped_run(tmp_path):
    """Without .carry/resume/ each GPU model resumes its shipped run (it travels with the tracked files), the one carry.sh
    carries; a carried one comes first, and a GPU model without a shipped run resumes nothing."""
    shipped = {"h100": "data/reference/h100/heldout/run1/replay.tar.gz",
               "h200": "data/reference/h200/heldout/run1-borrow/replay.tar.gz"}
    for gpu, path in shipped.items():
        assert (H200.parents[2] / path).is_file()
        (tmp_path / path).parent.mkdir(parents=True)
        (tmp_path / path).write_bytes(gpu.encode())
        assert _carried_resume(tmp_path, gpu) == path
    assert _carried_resume(tmp_path, "a100") == ""
    (tmp_path / ".carry" / "resume" / "h100").mkdir(parents=True)
    (tmp_path / ".carry" / "resume" / "h100" / "replay.tar.gz").write_bytes(b"carried")
    assert _carried_resume(tmp_path, "h100") == ".carry/resume/h100/replay.tar.gz"
    assert _carried_resume(tmp_path, "h200") == shipped["h200"]


def test_heldout_run_resumes_only_the_carried_tarball_of_its_gpu():
    text = (H200 / "heldout" / "run.sh").read_text()
    assert "RESUME=$(carried_resume)" in text
    assert ".carry/resume/replay.tar.gz" not in re.sub(r"(?m)^\s*#.*$", "", text), "a path read past carried_resume"


def _carried_inputs(cwd: Path, tarball: str, *given: str) -> list[str]:
    script = f"set -euo pipefail; source {H200 / 'machine.sh'}; carried_inputs {tarball!r} {' '.join(given)}"
    out = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_carried_replays_inputs_include_their_borrow_parameters(tmp_path):
    """The held-out resumption remakes, before it marks the carried replays up to date, every plan and every set of
    borrow parameters they ran with: a borrow.json made after the mark had a finished replay replayed again."""
    import tarfile

    replay = tmp_path / "results" / "residency" / "replay"
    replay.mkdir(parents=True)
    names = ["m.frequency.plan.json", "m.uniform.plan.json", "m.borrow.json", "m.borrow.log", "m.plan.md"]
    for n in names:
        (replay / n).write_text("{}")
    with tarfile.open(tmp_path / "replay.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "results", arcname="results")
    own = "results/residency/replay/m.frequency.plan.json"
    assert _carried_inputs(tmp_path, "replay.tar.gz", own) == [
        "results/residency/replay/m.borrow.json", own, "results/residency/replay/m.uniform.plan.json"]
    assert _carried_inputs(tmp_path, "", own) == [own]  # nothing carried: the config's plan alone


def test_heldout_run_makes_the_borrow_parameters_before_it_keeps_replays():
    text = (H200 / "heldout" / "run.sh").read_text()
    assert re.search(r"carried_plans\(\) \{\n  carried_inputs \"\$RESUME\" ", text)
    plans, touch = text.index('rc=0; plans "$left"'), text.index("touch_replays $done_csv")
    assert plans < touch


_FAKE_PYTHON = """#!/bin/bash
# python3 as the held-out run.sh calls it, its engine build and snakemake replaced by timed events
log() { echo "$1 $(date +%s.%N)" >> "$EVENTS"; }
case "$1 $2" in
  "-m pip") exit 0 ;;
  "-m ostinato")
    if [ "$3 $4" = "engine build" ]; then
      v=$(echo "$@" | sed 's/.*--variants \\([^ ]*\\).*/\\1/')
      log "build:$v:start"; sleep 1.5; echo log >> "$OUT/build.log"; echo "[engine] $v: done in 1 s"; log "build:$v:end"
    fi
    exit 0 ;;
  "-m snakemake")
    # a lock a stopped call left refuses every run but one with --nolock, as snakemake's LockException does
    if [ -n "$(ls .snakemake/locks 2>/dev/null)" ] && [[ " $* " != *" --nolock "* ]]; then
      echo "LockException: Directory cannot be locked" >&2; exit 1
    fi
    log "snakemake:start"; sleep 0.3; log "snakemake:end"
    # SNAKEMAKE_FAILS=N: the first N runs fail (a call's plans cut short)
    n=$(( $(cat "$EVENTS.smk" 2>/dev/null || echo 0) + 1 )); echo $n > "$EVENTS.smk"
    exit $(( n <= ${SNAKEMAKE_FAILS:-0} )) ;;
  "-m pytest") log "tests:start"; sleep 0.3; log "tests:end"; echo "1 passed"; exit 0 ;;
esac
exec "$REAL_PYTHON" "$@"
"""


def _run_heldout_build(tmp_path: Path, **env_extra: str) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    """`run.sh build` with python3's engine build, snakemake and pytest faked: its output, the order of their events
    and its OUT."""
    for name in ("heldout/run.sh", "prebuilt.sh", "sessions.sh", "machine.sh", "rerun.sh"):
        (tmp_path / "h200" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "h200" / name).write_text((H200 / name).read_text())
    (tmp_path / ".carry" / "sessions").mkdir(parents=True)
    (tmp_path / ".carry" / "sessions" / "tau2-heldout.jsonl").write_text("{}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(_FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    events, out = tmp_path / "events.txt", tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REAL_PYTHON": sys.executable,
           "EVENTS": str(events), "OUT": str(out), "CALL": "100", "OP_TESTS": "0", "TESTS": "0", **env_extra}
    proc = subprocess.run(["bash", "h200/heldout/run.sh", "build"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    order = [line.split()[0] for line in sorted(events.read_text().splitlines(), key=lambda l: float(l.split()[1]))]
    return proc, order, out


def test_the_heldout_build_call_makes_the_plans_while_ostinato_compiles(tmp_path):
    """`run.sh build` starts the model, the development routing and the plans (snakemake) once the stock variant is
    built and before ostinato's compilation ends: they need the stock build alone (tests/test_workflow.py), and after
    the whole build they took the first replay call's first 100 s or so."""
    proc, order, out = _run_heldout_build(tmp_path)
    assert order[:2] == ["build:stock:start", "build:stock:end"], order
    assert order.index("snakemake:start") < order.index("build:stock,ostinato:end"), order
    assert "model and plans, beside ostinato's compilation: snakemake rc=0" in proc.stdout
    assert (out / "build.txt").read_text().count("done in") == 2


def test_the_heldout_build_call_finishes_plans_cut_short_beside_the_engine_tests(tmp_path):
    """Where the plans made beside the compilation fail (cut short), `run.sh build` makes what is left of them after
    the build while the engine tests run (once), and says how the second try ended."""
    proc, order, _ = _run_heldout_build(tmp_path, SNAKEMAKE_FAILS="1", TESTS="1", PLANS_MIN="0")
    assert "model and plans, beside ostinato's compilation: snakemake rc=1" in proc.stdout
    assert "model and plans: snakemake rc=0" in proc.stdout
    assert order.count("snakemake:start") == 2 and order.count("tests:start") == 1, order
    built = order.index("build:stock,ostinato:end")
    second = len(order) - 1 - order[::-1].index("snakemake:start")
    assert built < second and built < order.index("tests:start") < order.index("snakemake:end", second), order


def test_the_heldout_calls_run_snakemake_past_the_lock_a_stopped_call_left(tmp_path):
    """The device tool stops a call at its limit, snakemake's lock stays in .snakemake/locks, and the next call's
    snakemake refused to run (an H100 call of 2026-12-07 lost its time so): run.sh's snakemake runs without the lock,
    as it is the only snakemake on the GPU machine (a call runs after the previous one ended)."""
    (tmp_path / ".snakemake" / "locks").mkdir(parents=True)
    (tmp_path / ".snakemake" / "locks" / "0.input.lock").write_text("results/replay/sessions.csv\n")
    proc, order, _ = _run_heldout_build(tmp_path)
    assert "model and plans, beside ostinato's compilation: snakemake rc=0" in proc.stdout
    assert order.count("snakemake:start") == 1, order


def test_the_heldout_build_call_runs_the_engine_tests_once_after_plans_made_beside_the_build(tmp_path):
    """With the plans made beside the compilation, `run.sh build` runs the engine tests once (TESTS=1) and snakemake
    no second time."""
    proc, order, _ = _run_heldout_build(tmp_path, TESTS="1")
    assert order.count("snakemake:start") == 1 and order.count("tests:start") == 1, order
    assert order.index("build:stock,ostinato:end") < order.index("tests:start"), order
    assert "model and plans: snakemake rc" not in proc.stdout
