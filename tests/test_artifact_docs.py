"""ARTIFACT.md and the reference READMEs are rendered from their data: no quoted number can drift from its file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ostinato.artifact import docs, facts

REPO = Path(__file__).resolve().parents[1]

# Literal numbers a template may keep: references into the paper, versions and identifiers, code, tolerances.
_ALLOWED = [
    r"`[^`\n]*`",                                              # code, paths, flags, commands
    r"```.*?```",                                              # code blocks
    r"\b(?:Sections?|Props?|Prop\.|Appendix|Eq\.|Tables?|Figures?|Lemma|Figure)\s*\(?[0-9A-Z][0-9a-z.,–\- ()and]*",
    r"\b\d+(?:\.\d+){2,}\b",                                   # versions such as 580.159.04
    r"\b[A-Za-z_]+[-\w]*\d[\w.\-]*",                           # identifiers: h200, v4flash-slice-8, run1, b11312
    r"\b\d+e-\d+\b",                                           # tolerances such as 1e-3
]


def _literal_text(template: str) -> str:
    """The template's own text: expressions, statements and comments removed."""
    return re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", " ", template, flags=re.S)


def measurement_literals(template: str) -> list[str]:
    """Numbers written into a template's text that look like measurements: with decimals, or as percentages."""
    text = _literal_text(template)
    for pattern in _ALLOWED:
        text = re.sub(pattern, " ", text, flags=re.S)
    return re.findall(r"[−\-+]?\d[\d,]*(?:\.\d+)?\s?%|[−\-+]?\d[\d,]*\.\d+", text)


@pytest.mark.parametrize("template", sorted(docs.TEMPLATES))
def test_document_equals_its_rendering(template: str) -> None:
    out = REPO / docs.TEMPLATES[template]
    assert (REPO / template).is_file(), f"{template} missing"
    assert out.read_text(encoding="utf-8") == docs.render(REPO, template), (
        f"{docs.TEMPLATES[template]} differs from {template}'s rendering: run `ostinato artifact docs`")


def declared_literals(template: str) -> set[str]:
    """The numbers a template declares as definitions, not data (`{#- literals: 0.6 95% -#}`: goals, configured
    values, model shapes)."""
    m = re.search(r"\{#-?\s*literals:(.*?)-?#\}|^# literals:(.*)$", template, re.S | re.M)
    return set((m.group(1) or m.group(2)).split()) if m else set()


@pytest.mark.parametrize("template", sorted(docs.TEMPLATES))
def test_measured_numbers_come_from_data(template: str) -> None:
    """A number with decimals or a % sign in a template's own text is read from data, or declared a definition."""
    text = (REPO / template).read_text(encoding="utf-8")
    found = set(measurement_literals(text)) - declared_literals(text)
    assert not found, f"{template}: numbers written by hand instead of read from data: {sorted(found)}"


def test_claims_texts_read_their_numbers_from_data() -> None:
    """artifact/claims.yaml's texts are templates too (rendered into ARTIFACT.md)."""
    text = (REPO / "artifact" / "claims.yaml").read_text(encoding="utf-8")
    found = set(measurement_literals(text)) - declared_literals(text)
    assert not found, f"artifact/claims.yaml: numbers written by hand instead of read from data: {sorted(found)}"


def test_the_audit_catches_a_hand_written_number() -> None:
    assert declared_literals("{#- literals: 0.6 95% -#}x") == {"0.6", "95%"}
    assert measurement_literals("decode 9.57 ms, 11.0% saved, {{ x | num }} and `--resident-share 0.5`") == [
        "9.57", "11.0%"]
    assert measurement_literals("Section 3.2, driver 580.159.04, v4flash-slice-8, rtol 1e-3") == []


def test_number_formatting() -> None:
    assert docs.num(-0.7, ".1f") == "\u22120.7" and docs.num(3072, ",d") == "3,072" and docs.num(2.0, "+.1f") == "+2.0"
    assert docs.pct(0.11, scale=100) == "11.0%" and docs.rng(0.49, 0.56) == "0.49–0.56" and docs.rng(1, 1.001) == "1.00"
    assert docs.sci(0.0001847, 1) == "1.8e-4" and docs.sci(1.807e-5) == "2e-5" and docs.sci(-0.003) == "\u22123e-3"
    with pytest.raises(ValueError, match="missing"):
        docs.num(float("nan"))
    assert [docs.and_join(x) for x in ([], ["a"], ["a", "b"], ["a", "b", "c"])] == ["", "a", "a and b", "a, b and c"]
    assert docs.code("ostinato") == "`ostinato`"


def test_a_template_reads_a_file_that_comes_and_goes(tmp_path: Path) -> None:
    """`exists` lets a template read a run's files under way (collect.sh's partial.*) only while they are there;
    `csv` of a missing file is an error naming it."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "a.csv").write_text("engine,x\nostinato,1.5\n")
    t = tmp_path / "run" / "t.md.j2"
    t.write_text('{{ csv("a.csv").one("x") if exists("a.csv") else "none" }} '
                 '{{ csv("/run/b.csv").one("x") if exists("/run/b.csv") else "none" }}')
    env = docs.environment(tmp_path, t)
    assert env.get_template("t.md.j2").render() == "1.5 none"
    t.write_text('{{ csv("b.csv").one("x") }}')
    with pytest.raises(FileNotFoundError, match=r"run/b.csv: a document quotes this file, and it is missing"):
        docs.environment(tmp_path, t).get_template("t.md.j2").render()


def _facts(folder: str) -> facts.Facts:
    """The `facts` of a template in `folder` (relative to the repository root)."""
    return facts.Facts(docs.Loader(REPO, REPO / folder))


def test_allclose_failure_of_the_shipped_rerun() -> None:
    f = _facts("data/reference/h200").allclose_failure("test_engine_rerun.txt")
    assert f["rtol"] == 1e-4 and f["atol"] == 1e-5 and (f["mismatched"], f["elements"]) == (11, 40)
    assert f["max_rel"] == pytest.approx(1.847e-4) and f["max_abs"] == pytest.approx(6.0654e-4)
    assert (f["columns"], f["rows"]) == (4, 10)


def test_server_decodes_and_the_overlap_bound(tmp_path: Path) -> None:
    """A gzipped server log's decode requests (the server's ms per token), and issue 14's bound worked by hand."""
    import gzip
    import json

    line = "slot print_timing: id  0 | task {t} |        eval time = {ms} ms / {n} tokens ({per} ms per token, 1 t/s)"
    log = "\n".join([line.format(t=1, ms="0.00", n=1, per="0.00"), line.format(t=2, ms="966.50", n=128, per="7.61"),
                     line.format(t=3, ms="10.00", n=2, per="10.00")])
    (tmp_path / "s.log.gz").write_bytes(gzip.compress(log.encode()))
    f = facts.Facts(docs.Loader(tmp_path, tmp_path))
    d = f.server_decodes("s.log.gz")
    assert d["tokens"].tolist() == [128, 2] and d["ms_per_token"].tolist() == [7.61, 10.0]  # a 1-token answer is no decode
    (tmp_path / "fit.json").write_text(json.dumps({"n_moe_layer": 8, "engine_gpu_branch_ms": 0.1,
                                                   "engine_alpha_ms": 0.05, "engine_beta_ms": 0.25}))
    (tmp_path / "summary.json").write_text(json.dumps({"rows": [
        {"engine": "ostinato", "kind": "decode", "prefix": 64, "median_s": 0.008},
        {"engine": "ostinato", "kind": "decode", "prefix": 128, "median_s": 0.006}]}))
    (tmp_path / "cold.json").write_text(json.dumps({"by_prefix": {"64": {"ostinato": {"decode": 1.0}},
                                                                  "128": {"ostinato": {"decode": 0.1}}}}))
    b = f.decode_bound("fit.json", "summary.json", "cold.json", 64)
    # C = 0.05 + 0.25 * 1.0 = 0.3 > G: 8 * 0.1 ms hidden of 8 ms
    assert b["c_ms"] == pytest.approx(0.3) and b["hidden_ms"] == pytest.approx(0.8) and b["bound_ms"] == pytest.approx(7.2)
    b = f.decode_bound("fit.json", "summary.json", "cold.json", 128)
    # C = 0.075 < G: the CPU branch is what hides
    assert b["hidden_ms"] == pytest.approx(0.6) and b["bound_ms"] == pytest.approx(5.4)


def test_op_test_logs_of_the_shipped_calibration() -> None:
    f = _facts("data/reference/h200/calibrate")
    ops = f.backend_ops("test-backend-ops.txt")
    assert ops.groupby(["op", "status"]).size().to_dict() == {("MUL_MAT_ID_POOL", "OK"): 60,
                                                              ("MUL_MAT_ID_SKIP", "not supported"): 60}
    assert sorted(ops["cold_share"].astype(float).unique()) == [0.0, 0.3, 1.0]
    res = f.residency_ops("test-residency-ops.txt")  # some lines split by CUDA's warm-up messages
    assert len(res) == 240 and (res["status"] == "OK").all()
    assert (res["kind"] == "cpu").sum() == 160 and set(res["threads"].dropna()) == {"1", "3"}
    assert set(res.loc[res["kind"] == "sched", "backend"]) == {"CUDA0"}


def test_pooled_replay_facts_of_the_shipped_comparison() -> None:
    f = _facts("data/reference/h200/compare")
    runs = ["run1", "run2", "run3"]
    fig = f.figures_compare(runs)
    assert set(fig["workload"]) == {"SWE", "tau2"} and set(fig["sessions"]) == {6, 9}
    ph = f.phase_changes(runs).set_index("workload")
    assert ph.loc["SWE", "prefill_change_pct"] == pytest.approx(-8.975, abs=1e-3)
    # the notebooks' pooled saved share is `ostinato replay compare`'s over the same tagged runs
    pooled = f.row(f.compare(runs), workload="tau2", engine="llama.cpp-layers")
    assert f.row(fig, workload="tau2", engine="llama.cpp-layers")["saved_pct"] == pytest.approx(pooled["saved_pct"])
    assert f.last_streamed(runs)["forced_match"].all()
    assert f.paper_constant("hot_share") == 0.84


def test_prefill_paths_of_the_shipped_ablation() -> None:
    paths = _facts("data/reference/h200/ablation").prefill_paths(["run1", "run2", "run3"]).set_index("workload")
    paper = paths[paths["series"] == "paper"].iloc[0]
    assert paper["prefill_change_pct"] == pytest.approx(100 * (150.8 / 284.8 - 1))  # Table 8a, steps 3 -> 4
    h200 = paths[paths["series"] != "paper"]
    assert h200.loc["tau2", "sessions"] == 9 and h200.loc["tau2", "saved_pct"] == pytest.approx(32.81, abs=0.01)


def test_decode_floor_of_the_shipped_floor_sweep() -> None:
    """The floor's budget for one graph per step: half of layers' step less the all-GPU step (the sweep's medians)."""
    f = _facts("data/reference/h100/graph/floor")
    fl = f.decode_floor("floor/rows.csv", "ostinato-graph-borrow", 3072)
    t = f.sweep_vs("floor/rows.csv", "llama.cpp-layers")
    ms = {e: 1000 * f.row(t, engine=e, kind="decode", prefix=3072).median_s
          for e in ("llama.cpp-layers", "llama.cpp-gpu-experts", "ostinato-graph-borrow")}
    assert fl["room_ms"] == pytest.approx(ms["llama.cpp-layers"] / 2 - ms["llama.cpp-gpu-experts"])
    assert fl["short_ms"] == pytest.approx(ms["ostinato-graph-borrow"] - ms["llama.cpp-layers"] / 2)
    assert 0.9 < fl["rest_over_floor"] < 1.1 and fl["room_ms"] > 0 < fl["short_ms"]


def test_qwen_requests_short_of_their_forced_tokens() -> None:
    """The Qwen replays' forced_match false: the server stopped at <|im_end|>, one token before the recorded end."""
    f = _facts("data/reference/h200/qwen")
    recs = f.last_streamed(["run1", "run2", "run3"])
    short = recs[~recs["forced_match"]]
    assert len(recs) == 228 and len(short) == 102 and set(short.groupby("run").size()) == {34}
    assert ((short["n_forced"] - short["n_output"]) == 1).all() and set(short["final_stop_type"]) == {"eos"}
    assert {f.qwen_special(i) for i in short["last_streamed"]} == {"<|im_end|>"}


def test_collect_records_the_state_of_the_tree_before_it_writes(tmp_path: Path) -> None:
    """`ostinato artifact collect` into a folder of the repository: run.json says clean for a clean tree (the files it
    copies in are not the run's changes) and dirty when a tracked file was changed before it."""
    import json
    import subprocess

    from ostinato.artifact.collect import COLLECTED, collect

    for rel in COLLECTED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x\n")
    bench = tmp_path / "results/replay/a.benchmark.tsv"
    bench.write_text("s\tcpu_time\tmax_rss\n1.0\t0.5\t10\n")
    out = tmp_path / "data/reference/here"
    for rel in COLLECTED:  # an earlier collect, committed: this one changes those files
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("earlier run\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(git + ["add", "-A"], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-qm", "run"], cwd=tmp_path, check=True)
    collect(tmp_path, out, "here", "make reproduce")
    assert json.loads((out / "run.json").read_text())["dirty"] is False
    (tmp_path / COLLECTED[0]).write_text("changed\n")
    collect(tmp_path, out, "here", "make reproduce")
    assert json.loads((out / "run.json").read_text())["dirty"] is True
