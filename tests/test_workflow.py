"""The Snakemake workflow: lint-clean, a complete DAG on the default config, and config errors that name the key."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # each test runs snakemake in a subprocess


def _snakemake(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    exe = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or "snakemake"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, env=env)


def test_lint_is_clean():
    proc = _snakemake("--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


def test_default_dag_reaches_every_stage(tmp_path):
    proc = _snakemake("-n", "--quiet", "rules", "--cores", "2", "--forceall")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rule in ("build_engine", "synth_model", "get_traces", "split_sessions", "build_sessions", "replay",
                 "summarize_replay", "render_replay_summary", "render_table2", "make_routing", "render_routing_stats",
                 "simulate", "compute_limit", "render_sim_validation", "calibrate", "sweep_prefill", "render_fig7b",
                 "check_memory_model", "run_replay_capacity_test", "render_result", "render_calibrate",
                 "render_predicted", "check_costmodel", "plan_residency", "record_routing", "check_local_agent",
                 "check_claims", "tune_borrow"):
        assert rule in proc.stdout, rule


def test_the_sweeps_borrow_presets_take_the_parameters_of_the_development_sessions():
    """The GPU config's sweep measures Figure 8c's step 4 with what `tune_borrow` chose on the development sessions,
    as the replays do; the default config's sweep, without a preset with borrowed memory, needs no tuning."""
    proc = _snakemake("results/sweep/summary.json", "-n", "-p", "--forceall", "--cores", "16",
                      "--configfile", "config/h200.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep = [l for l in proc.stdout.splitlines() if "ostinato sweep " in l]
    assert "rule tune_borrow:" in proc.stdout and len(sweep) == 1, sweep
    assert "--engines llama.cpp-layers," in sweep[0] and "ostinato-graph-borrow" in sweep[0]
    assert "--borrow-params results/residency/replay/v4flash-slice-8-calibrated.borrow.json" in sweep[0]
    proc = _snakemake("results/sweep/summary.json", "-n", "-p", "--forceall", "--cores", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep = [l for l in proc.stdout.splitlines() if "ostinato sweep " in l]
    assert len(sweep) == 1 and "--borrow-params" not in sweep[0] and "rule tune_borrow:" not in proc.stdout


def test_borrow_replays_take_their_parameters_from_the_development_sessions(tmp_path):
    """`ostinato-borrow`'s replay starts the engine with what `tune_borrow` chose on the development set's recorded
    routing (never the held-out sessions); the GPU config's bitwise check adds borrowed memory to both its replays."""
    proc = _snakemake("-n", "-p", "--forceall", "--cores", "1", "results/replay/tau2-few/ostinato-borrow")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "rule tune_borrow:" in out and "--routing results/residency/recorded/swe-dev-few/routing" in out
    assert "--sessions results/sessions/swe-dev-few.jsonl" in out
    assert "--preset ostinato-borrow" in out and "--borrow-params results/residency/replay/tiny-v4.borrow.json" in out
    # under a deadline, a session of an engine that has recorded nothing is estimated from the others' replays
    assert "--deadline-rates-from results/replay/tau2-few " in out  # run 1's directory of the set, named once
    # and before any engine has replayed a session of the set, from the replays of the other set
    assert "--deadline-rates-from results/replay/tau2-few --deadline-rates-elsewhere results/replay/swe-few &&" in out
    proc = _snakemake("results/replay/bitwise/tau2-heldout/overlap.json", "-n", "-p", "--forceall", "--cores", "16",
                      "--configfile", "config/h200.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [l for l in proc.stdout.splitlines() if "ostinato replay run" in l and "bitwise/tau2-heldout" in l]
    assert len(runs) == 2 and all("--server-arg=--residency-borrow --server-arg=all" in l for l in runs), runs
    assert "rule summarize_replay:" in proc.stdout  # after the timed replays ...
    alone = tmp_path / "alone.yaml"
    alone.write_text("replay:\n  bitwise:\n    after_replays: false\n")
    proc = _snakemake("results/replay/bitwise/tau2-heldout/overlap.json", "-n", "-p", "--forceall", "--cores", "16",
                      "--configfile", "config/h200.yaml", str(alone))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rule summarize_replay:" not in proc.stdout and "rule replay:" not in proc.stdout  # ... or alone
    runs = [l for l in proc.stdout.splitlines() if "ostinato replay run" in l and "bitwise/tau2-heldout" in l]
    assert len(runs) == 2 and all("--server-arg=--residency-borrow --server-arg=all" in l for l in runs), runs
    # the GPU config's ostinato takes one graph per decode step; its variants go back to per-segment graphs,
    # overlapped and in turn (a later flag overrides an earlier one)
    proc = _snakemake("results/replay/bitwise/tau2-heldout/inturn.json", "-n", "-p", "--forceall", "--cores", "16",
                      "--configfile", "config/h200.yaml", str(alone))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = {l.split("--out ")[1].split()[0]: l for l in proc.stdout.splitlines()
            if "ostinato replay run" in l and "bitwise/tau2-heldout" in l}
    assert set(runs) == {"results/replay/bitwise/tau2-heldout/.partial-base",
                         "results/replay/bitwise/tau2-heldout/.partial-inturn"}, runs
    # each replays all its sessions on one server start: an interrupted one's partial results are removed first
    assert all(f"rm -rf {p} && ostinato replay run" in l for p, l in runs.items()), runs
    assert all("--preset ostinato-graph" in l for l in runs.values()), runs
    assert ("--server-arg=--residency-borrow --server-arg=all --server-arg=--residency-graph --server-arg=segments "
            "--server-arg=--residency-branches --server-arg=inturn") in runs[
        "results/replay/bitwise/tau2-heldout/.partial-inturn"], runs


def test_replays_are_declared_outputs_that_forcerun_measures_again():
    """A finished replay's sessions are the output of its job: asking for them (after deleting them) or
    `--forcerun replay` runs the replays again instead of resuming from files Snakemake does not know."""
    proc = _snakemake("-n", "-p", "--forceall", "--cores", "1", "results/replay/tau2-few/ostinato")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rule replay:" in proc.stdout and "--out results/replay/tau2-few/.partial" in proc.stdout
    assert "mv results/replay/tau2-few/.partial/ostinato results/replay/tau2-few/ostinato" in proc.stdout
    proc = _snakemake("-n", "--quiet", "rules", "--cores", "1", "--forcerun", "replay", "tables/replay_compare.md")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    n = len(cfg["replay"]["sets"]) * len(cfg["replay"]["engines"])
    assert re.search(rf"^replay\s+{n}$", proc.stdout, re.M), proc.stdout
    proc = _snakemake("-n", "-p", "--forceall", "--cores", "1", "results/residency/recorded/swe-dev-few")
    assert proc.returncode == 0 and "rule record_routing:" in proc.stdout, proc.stdout + proc.stderr


def test_rules_call_the_package_through_the_interpreter_of_snakemake(tmp_path):
    """`.venv/bin/snakemake` works without activating the venv: a rule runs `ostinato` with no venv on PATH."""
    for part in ("Snakefile", "workflow", "config", "engine", "environment.yml", "data/profiles", "data/paper", "artifact"):
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / part)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = "/usr/bin:/bin"
    exe = Path(sys.executable).parent / "snakemake"
    out = subprocess.run([str(exe), "--cores", "1", "results/costmodel/checks-paper-4x4090d.json"], cwd=tmp_path,
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads((tmp_path / "results/costmodel/checks-paper-4x4090d.json").read_text())["checks"]


def test_bad_config_names_the_key(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["engine"]["backend"] = "metal"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("-n", "--configfile", str(bad), "--cores", "1")
    assert proc.returncode != 0
    assert "metal" in proc.stdout + proc.stderr and "backend" in proc.stdout + proc.stderr

    cfg["engine"]["backend"] = "cpu"
    cfg["replay"]["model"] = "no-such-model"
    bad.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("-n", "--configfile", str(bad), "--cores", "1")
    assert proc.returncode != 0 and "replay.model" in proc.stdout + proc.stderr


def _schema_keys(node: dict, prefix: str = "") -> list[str]:
    keys = []
    for name, sub in node.get("properties", {}).items():
        key = f"{prefix}{name}"
        keys.append(key)
        keys += _schema_keys(sub, key + ".")
    if isinstance(node.get("additionalProperties"), dict):
        placeholder = {"models": "<name>", "sets": "<set>", "engines": "<engine>"}.get(prefix.rstrip(".").split(".")[-1])
        if placeholder:
            keys += _schema_keys(node["additionalProperties"], f"{prefix}{placeholder}.")
    return keys


def test_every_config_key_is_documented():
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    doc = (REPO / "config" / "README.md").read_text()
    keys = _schema_keys(schema)
    assert "replay.engines.<engine>.variant" in keys and "models.<name>.spec" in keys
    missing = [k for k in keys if f"`{k}`" not in doc and f"`{k}." not in doc]
    assert not missing, f"config keys without a row in config/README.md: {missing}"


def test_forced_routing_config_puts_traces_before_the_replay(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["replay"]["routing_force"] = True
    bad = tmp_path / "forced.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("-n", "--configfile", str(bad), "--cores", "1")
    assert proc.returncode != 0 and "replay.routing_force" in proc.stdout + proc.stderr
    cfg["routing"]["sets"] = list(cfg["replay"]["sets"])
    cfg["routing"]["model"] = {"n_layer": 4, "n_expert": 16, "n_expert_used": 4}
    good = tmp_path / "forced-ok.yaml"
    good.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("results/replay/tau2-few/llama.cpp-layers.sessions.csv", "-n", "-p", "--forceall", "--cores",
                      "1", "--configfile", str(good))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "make_routing" in proc.stdout and "--routing-force-dir results/routing/tau2-few" in proc.stdout
    # every preset gets the GPU memory of the ostinato pool
    assert "--preset llama.cpp-layers" in proc.stdout and "--resident-share 0.5" in proc.stdout


def test_repeated_replays_alternate_the_engine_order(tmp_path):
    """replay.repeats: run r >= 2 under results/replay/run<r>/, each replay after the one before it in an order that
    reverses between sets and between runs, and one summary whose sessions are tagged per run."""
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["replay"]["repeats"] = 2
    path = tmp_path / "repeats.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # the engines' order is the config's
    proc = _snakemake("results/replay/sessions.csv", "-n", "-p", "--forceall", "--cores", "1", "--configfile", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sets, engines = cfg["replay"]["sets"], list(cfg["replay"]["engines"])
    expected = []
    for r, run in enumerate(["", "run2/"]):
        for i, s in enumerate(sets):
            expected += [(run, s, e) for e in (engines if (i + r) % 2 == 0 else engines[::-1])]
    jobs = re.findall(r"wildcards: run=(\S*), set=(\S+), engine=(\S+)", proc.stdout)
    assert sorted(jobs) == sorted(expected)
    # every replay but the first waits for the one before it, so the dry run lists them in that order
    assert jobs == expected
    assert "--runs 2" in proc.stdout and "results/replay/run2/swe-few/ostinato" in proc.stdout
    assert _snakemake("results/replay/run3/swe-few/ostinato.sessions.csv", "-n", "--cores", "1",
                      "--configfile", str(path)).returncode != 0
    cfg["replay"]["repeats"] = 0
    path.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("-n", "--cores", "1", "--configfile", str(path))
    assert proc.returncode != 0 and "repeats" in proc.stdout + proc.stderr


def test_engines_replayed_again_replay_no_other_finished_replay(tmp_path):
    """RERUN (data/reference/h200/rerun.sh, `replay_each`): each replay waits for the one before it in the engine
    order, so making one again outdates every finished one after it; with a snakemake call per target and the finished
    replays touched before each, only the engines named are replayed again."""
    for entry in subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.split():
        top = entry.split("/", 1)[0]
        if not (tmp_path / top).exists():
            (tmp_path / top).symlink_to(REPO / top)
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    url = {"url": "http://127.0.0.1:9", "api": "openai", "model_name": "m"}
    engines = {e: None for e in cfg["replay"]["engines"]} | {"a": url, "b": url, "c": url}
    (tmp_path / "order.yaml").write_text(yaml.safe_dump(
        {"replay": {"sets": ["tau2-few"], "bitwise": {"engine": ""}, "engines": engines}}, sort_keys=False))
    rep = tmp_path / "results" / "replay" / "tau2-few"
    rep.mkdir(parents=True)
    (tmp_path / "results" / "sessions").mkdir()
    (tmp_path / "results" / "sessions" / "tau2-few.jsonl").write_text("{}\n")
    # b finished; a (before it) and c (after it) dropped to be replayed again
    (rep / "b").mkdir()
    for f in ("b.sessions.csv", "b.requests.csv"):
        (rep / f).write_text("")
    # a stand-in for run.sh's snakemake call: the jobs a dry run lists, then the target made
    script = """set -euo pipefail
source data/reference/h200/rerun.sh
CONFIG=(--configfile order.yaml --allowed-rules replay); OUT=out; CALL=600; start=$(date +%s); mkdir -p out
smk() {
  python3 -m snakemake --nolock --cores 1 "${CONFIG[@]}" --rerun-triggers mtime -n -- "$2" \\
    | sed -n 's/.*wildcards: .*engine=\\(\\S*\\)$/\\1/p' >> jobs.txt
  mkdir -p "${2%.sessions.csv}"; touch "$2" "${2%.sessions.csv}.requests.csv"
}
replay_each results/replay/tau2-few/a.sessions.csv results/replay/tau2-few/c.sessions.csv
"""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "jobs.txt").read_text().split() == ["a", "c"]
    assert (rep / "b.sessions.csv").stat().st_mtime > (rep / "a.sessions.csv").stat().st_mtime  # touched, not made


def test_engine_reached_by_url_in_the_replay(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["replay"]["engines"]["vllm"] = {"url": "http://127.0.0.1:8000", "api": "openai", "model_name": "m"}
    good = tmp_path / "url.yaml"
    good.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("results/replay/tau2-few/vllm.sessions.csv", "-n", "-p", "--forceall", "--cores", "1",
                      "--configfile", str(good))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--server-url http://127.0.0.1:8000 --api openai --model-name m" in proc.stdout
    assert "--server-bin" not in proc.stdout.split("--server-url")[1].split("\n")[0]
    cfg["replay"]["engines"]["vllm"]["preset"] = "ostinato"
    good.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("-n", "--configfile", str(good), "--cores", "1")
    assert proc.returncode != 0 and "replay.engines.vllm" in proc.stdout + proc.stderr


def test_llama_fork_reached_by_url_in_the_replay(tmp_path):
    """A llama.cpp fork without our replay fields (ik_llama.cpp) runs beside the others as api llama-generate."""
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["replay"]["engines"]["ik_llama.cpp"] = {"url": "http://127.0.0.1:8090", "api": "llama-generate"}
    path = tmp_path / "ik.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("results/replay/tau2-few/ik_llama.cpp.sessions.csv", "-n", "-p", "--forceall", "--cores", "1",
                      "--configfile", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--server-url http://127.0.0.1:8090 --api llama-generate" in proc.stdout
    cfg["replay"]["engines"]["ik_llama.cpp"] = {"variant": "stock", "api": "llama-generate"}
    path.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("-n", "--configfile", str(path), "--cores", "1")
    assert proc.returncode != 0 and "api llama-generate needs url" in proc.stdout + proc.stderr


def test_gpu_config_dag_and_result_sources(tmp_path):
    """config/h200.yaml merges into the default and reaches every result; Table 4 takes Qwen series only."""
    proc = _snakemake("results/figures/table3.params.yaml", "results/figures/table4.params.yaml", "figures/table3.pdf",
                      "-n", "-p", "--forceall", "--cores", "16", "--configfile", "config/h200.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "models/v4flash-slice-8-calibrated.gguf" in out and "--preset llama.cpp-layers" in out
    t3 = next(line for line in out.splitlines() if "table3.params.yaml" in line and "figures params" in line)
    assert "measured_sessions=[results/replay/sessions.csv]" in t3 and "reference_runs=[]" in t3
    t4 = next(line for line in out.splitlines() if "table4.params.yaml" in line and "figures params" in line)
    assert "measured_sessions=[]" in t4 and "sim_sessions=[]" in t4 and "reference_runs=[]" in t4
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["models"]["tiny-qwen"] = {"spec": "tiny-qwen3moe", "vocab": "qwen"}
    cfg["replay"]["model"] = "tiny-qwen"
    qwen = tmp_path / "qwen.yaml"
    qwen.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("results/figures/table4.params.yaml", "-n", "-p", "--forceall", "--cores", "1",
                      "--configfile", str(qwen))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "measured_sessions=[results/replay/sessions.csv]" in proc.stdout
    assert "reference_runs=[data/reference/h200/qwen/run1, data/reference/h200/qwen/run2" in proc.stdout


def test_recorded_routing_stats_of_the_replayed_model(tmp_path):
    """routing.recorded (config/h200.yaml): the stock engine's recorded routing of the calibrated-router model on the
    held-out sets, measured against the development set's at the paper's shares, labelled an input; the default
    config adds nothing; a held-out set that is the development set or not a session set is refused by key."""
    proc = _snakemake("tables/routing_stats_recorded.md", "-n", "-p", "--forceall", "--cores", "16",
                      "--configfile", "config/h200.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "--router calibrated --router-ranking moe-l2" in out
    stats = next(line for line in out.splitlines() if "ostinato routing stats" in line)
    assert "--dev results/residency/recorded/swe-dev-few/routing --dev-sessions results/sessions/swe-dev-few.jsonl" in stats
    assert ("--heldout results/residency/recorded/swe-long/routing results/residency/recorded/tau2-heldout/routing "
            "--heldout-sessions results/sessions/swe-long.jsonl results/sessions/tau2-heldout.jsonl") in stats
    assert "--paper-shares" in stats and "synthetic model v4flash-slice-8-calibrated" in stats
    assert "an input, not evidence" in stats
    proc = _snakemake("-n", "--forceall", "--cores", "1")
    assert proc.returncode == 0 and "compute_recorded_routing_stats" not in proc.stdout
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for bad, key in ((["swe-dev-few"], "is replay.residency.dev_set"), (["nope"], "is not a key of sessions.sets")):
        cfg["routing"]["recorded"] = {"heldout": bad}
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = _snakemake("-n", "--configfile", str(path), "--cores", "1")
        assert proc.returncode != 0 and "routing.recorded.heldout" in proc.stdout + proc.stderr
        assert key in proc.stdout + proc.stderr


def test_capacity_budget_sizes_the_pool_and_every_preset(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["replay"]["residency"]["budget"] = "capacity"
    path = tmp_path / "capacity.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("results/replay/swe-few/llama.cpp-layers.sessions.csv", "results/residency/replay/tiny-v4.frequency.plan.json",
                      "-n", "-p", "--forceall", "--cores", "1", "--configfile", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--capacity results/residency/memory/tiny-v4.capacity.json" in proc.stdout
    assert "--expert-capacity results/residency/memory/tiny-v4.capacity.json" in proc.stdout
    assert "--resident-share" not in proc.stdout


def test_a_config_file_leaves_out_a_default_engine_by_null(tmp_path):
    """`replay.engines.<engine>: null` in a config file on top of the default drops that engine from every replay
    (config/h200.yaml drops `ostinato-borrow`), and the local-agent check starts `ostinato` with its preset's flags."""
    drop = tmp_path / "drop.yaml"
    drop.write_text("replay:\n  engines:\n    buun: null\n")
    proc = _snakemake("-n", "-p", "--forceall", "--cores", "1", "results/replay/sessions.csv", "--configfile", str(drop))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--engine-name buun" not in proc.stdout and "--engine-name ostinato-borrow" in proc.stdout
    proc = _snakemake("-n", "-p", "--forceall", "--cores", "16", "results/replay/sessions.csv",
                      "results/artifact/local_agent.json", "--configfile", "config/h200.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--engine-name ostinato-borrow" not in proc.stdout and "--engine-name buun" in proc.stdout
    agent = next(line for line in proc.stdout.splitlines() if "ostinato artifact agent" in line)
    assert "--server-arg=--residency-graph --server-arg=step" in agent and "--residency-plan" not in agent


def test_bitwise_variants_of_the_default_and_the_gpu_config():
    """The default config checks in turn against overlapped and against one graph per decode step; config/h200.yaml,
    whose ostinato takes one graph per decode step, leaves out the default's `graph` variant by null."""
    proc = _snakemake("-n", "--forceall", "--cores", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for v in ("overlap", "graph"):
        assert f"results/replay/bitwise/tau2-few/{v}.json" in proc.stdout
    proc = _snakemake("-n", "--forceall", "--cores", "16", "--configfile", "config/h200.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "bitwise/tau2-heldout/inturn.json" in proc.stdout and "bitwise/tau2-heldout/overlap.json" in proc.stdout
    assert "bitwise/tau2-heldout/graph" not in proc.stdout


def _job_stats(out: str) -> dict[str, int]:
    """The rules and job counts of a dry run's `Job stats` table."""
    table = out.split("Job stats:", 1)[1].split("\ntotal", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"(?m)^(\w+)\s+(\d+)$", table)}


def test_the_gpu_build_call_makes_the_plans_on_the_stock_build_alone(tmp_path):
    """The held-out GPU build call (data/reference/h200/heldout/run.sh build) makes the model, the development routing
    and the plans while the ostinato variant compiles: with only the stock build there, they need no engine build,
    so snakemake never starts a second one beside it."""
    for entry in subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.split():
        top = entry.split("/", 1)[0]
        if not (tmp_path / top).exists():
            (tmp_path / top).symlink_to(REPO / top)
    stock = tmp_path / "build" / "engine" / "cpu" / "stock"
    (stock / "bin").mkdir(parents=True)
    (tmp_path / "build" / "engine" / "cpu" / "tree").mkdir()
    for f in ("bin/llama-server", "bin/llama-bench", "manifest.json"):
        (stock / f).write_text("")
    # the targets run.sh's `plans` gives snakemake on an H100 (`carried_plans`: `carried_inputs` of the shipped tarball)
    plans = subprocess.run(
        ["bash", "-c", 'source data/reference/h200/machine.sh; carried_inputs "$1" "$2"', "_",
         "data/reference/h100/heldout/run1/replay.tar.gz",
         "results/residency/replay/v4flash-slice-8-calibrated.frequency.plan.json"],
        cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert "results/residency/replay/v4flash-slice-8-calibrated.borrow.json" in plans, plans
    args = ("-n", "--quiet", "rules", "--cores", "16", "--configfile", "config/h200.yaml",
            "--config", "engine={backend: cpu}", "--", *plans)
    proc = _snakemake(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = _job_stats(proc.stdout)
    assert {"synth_model", "record_routing", "plan_replay_residency", "tune_borrow"} <= set(jobs), jobs
    assert "build_engine" not in jobs, jobs
    (stock / "manifest.json").unlink()  # no stock build yet: the plans wait for one
    proc = _snakemake(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "build_engine" in _job_stats(proc.stdout)
