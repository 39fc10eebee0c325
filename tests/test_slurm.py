"""The SLURM profile (workflow/profiles/slurm): its per-rule resources cover the rules that build, run or time the
engine, and the pipeline runs through a real single-node SLURM (`snakemake --executor slurm`, the pinned
snakemake-executor-plugin-slurm) with the same outputs as a local run. The SLURM test runs where slurm-wlm and munge
are installed (Debian: `apt-get install slurm-wlm munge`) and skips elsewhere; tests/slurm_cluster.py starts the
cluster as root or uses the one that answers `sinfo` (on a cluster of several nodes, give pytest a `--basetemp` that
every node mounts: the workflow copy lives there)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slurm_cluster import Cluster, ClusterUnavailable, missing_tools, single_node_cluster

REPO = Path(__file__).resolve().parents[1]
PROFILE = "workflow/profiles/slurm"
WORKFLOW_PARTS = ("Snakefile", "workflow", "config", "engine", "environment.yml", "data/profiles", "data/paper", "artifact")
TARGETS = ("results/costmodel/checks-paper-4x4090d.json", "results/routing/synthetic-swe-dev")
TARGET_RULES = {"check_costmodel", "make_routing"}
ENGINE_RULES = {"build_engine", "check_memory_model", "check_local_agent", "record_routing", "replay", "replay_bitwise",
                "calibrate", "sweep_prefill"}
# the rules that take the bench (one at a time, the node alone): the timed ones and the bitwise check's replays
TIMED_RULES = {"record_routing", "replay", "replay_bitwise", "calibrate", "sweep_prefill"}
RUNTIME_MIN = 10  # the test's --default-resources, checked in SLURM's record of each job
MEM_MB = 1000
SNAKEMAKE_TIMEOUT_S = 600


def _rule_blocks() -> dict[str, str]:
    """Each rule of workflow/rules/*.smk and the text of its definition."""
    blocks = {}
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for m in re.finditer(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", smk.read_text(), re.M | re.S):
            blocks[m.group(1)] = m.group(2)
    return blocks


def test_profile_sets_the_resources_of_the_rules_that_run_the_engine():
    """The profile names only rules that exist; the rules that ask for a GPU on the CUDA build are those that build
    or run the engine, each has its own runtime and memory in the profile, and the timed ones take the node alone."""
    profile = yaml.safe_load((REPO / PROFILE / "config.yaml").read_text())
    blocks = _rule_blocks()
    assert profile["executor"] == "slurm" and profile["resources"] == {"bench": 1}
    assert isinstance(profile["cores"], int), "timed rules have threads: ALL_CORES (the run's cores), so the profile sets cores"
    unknown = set(profile["set-resources"]) - set(blocks)
    assert not unknown, f"{PROFILE}/config.yaml set-resources names no rule: {sorted(unknown)}"
    assert {r for r, b in blocks.items() if "**ENGINE_GPU" in b} == ENGINE_RULES
    assert {r for r, b in blocks.items() if "bench=1" in b} == TIMED_RULES
    for rule in ENGINE_RULES:
        assert {"runtime", "mem_mb"} <= set(profile["set-resources"][rule]), rule
    for rule in TIMED_RULES:
        assert profile["set-resources"][rule].get("slurm_extra") == "'--exclusive'", rule


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A single-node SLURM for this module's tests (skips where SLURM is not installed or cannot be started)."""
    missing = missing_tools()
    if missing:
        pytest.skip(f"SLURM is not installed here (missing {', '.join(missing)}; Debian: apt-get install slurm-wlm "
                    f"munge)")
    try:
        with single_node_cluster(tmp_path_factory.mktemp("slurm")) as c:
            yield c
    except ClusterUnavailable as e:
        pytest.skip(str(e))


def _copy_workflow(dest: Path) -> Path:
    for part in WORKFLOW_PARTS:
        src = REPO / part
        (dest / part).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / part)
    return dest


def _snakemake(cwd: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "snakemake"
    try:
        return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=SNAKEMAKE_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"snakemake {' '.join(args)} ran over {SNAKEMAKE_TIMEOUT_S} s:\n{e.stdout}\n{e.stderr}")


def _jobcomp(path: Path) -> dict[str, dict[str, str]]:
    """slurmctld's completion record (jobcomp/filetxt: one line of KEY=VALUE per finished job) by job id."""
    records = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        records[fields["JobId"]] = fields
    return records


def _final_state(cluster: Cluster, jobid: str) -> str:
    """A finished job's state as the cluster records it."""
    if cluster.jobcomp is not None:
        return _jobcomp(cluster.jobcomp).get(jobid, {}).get("JobState", "not in jobcomp")
    out = subprocess.run(["scontrol", "show", "job", "-o", jobid], capture_output=True, text=True, timeout=30,
                         env=cluster.env)
    m = re.search(r"JobState=(\w+)", out.stdout)
    if m:
        return m.group(1)
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", jobid, "-o", "State"], capture_output=True, text=True,
                         timeout=30, env=cluster.env)
    return out.stdout.strip() or f"unknown to scontrol and sacct: {out.stderr.strip()}"


@pytest.mark.slow
def test_pipeline_jobs_run_through_slurm(cluster: Cluster, tmp_path: Path):
    """Two cheap targets of the default config, run through the profile on SLURM: each rule is an sbatch job that
    SLURM records as completed (on the started cluster: on its node and partition, with the runtime and memory the
    command line gave), its job log is kept, and the outputs equal those of a local run byte for byte."""
    env = {k: v for k, v in cluster.env.items() if k != "VIRTUAL_ENV"}
    on_slurm = _copy_workflow(tmp_path / "slurm")
    resources, status = [f"runtime={RUNTIME_MIN}", f"mem_mb={MEM_MB}"], []
    if cluster.started:  # no accounting database: slurmctld's jobcomp file records the jobs, squeue follows them
        resources.append(f"slurm_partition={cluster.partition}")
        status = ["--slurm-status-command", "squeue"]
    args = ["--workflow-profile", PROFILE, "--default-resources", *resources, "--slurm-keep-successful-logs",
            "--slurm-init-seconds-before-status-checks", "2", *status]
    proc = _snakemake(on_slurm, [*args, *TARGETS], env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log

    submitted = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.$", log, re.M)
    rules = {re.search(r"/rule_(\w+)/", path).group(1): (jobid, Path(path)) for jobid, path in submitted}
    assert set(rules) == TARGET_RULES and len(submitted) == len(TARGET_RULES), log
    for rule, (jobid, job_log) in rules.items():
        assert _final_state(cluster, jobid) == "COMPLETED", (rule, jobid, log)
        assert job_log.is_file(), f"no SLURM job log {job_log} of {rule}"
        text = job_log.read_text()
        assert f"rule {rule}:" in text and "1 of 1 steps (100%) done" in text, text
        if cluster.jobcomp is not None:
            record = _jobcomp(cluster.jobcomp)[jobid]
            assert record["NodeList"] == cluster.node and record["Partition"] == cluster.partition, record
            assert record["TimeLimit"] == str(RUNTIME_MIN) and f"mem={MEM_MB}M" in record["Tres"], record

    checks = json.loads((on_slurm / TARGETS[0]).read_text())["checks"]
    assert checks and all(c["ok"] for c in checks), checks
    local = _copy_workflow(tmp_path / "local")
    proc = _snakemake(local, ["--cores", "1", *TARGETS], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = sorted(p.relative_to(on_slurm) for t in TARGETS for p in [on_slurm / t, *(on_slurm / t).rglob("*")]
                  if p.is_file())
    assert made and made == sorted(p.relative_to(local) for t in TARGETS
                                   for p in [local / t, *(local / t).rglob("*")] if p.is_file())
    for rel in made:
        assert (on_slurm / rel).read_bytes() == (local / rel).read_bytes(), f"{rel} differs from the local run's"
