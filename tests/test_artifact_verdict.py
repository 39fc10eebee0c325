"""The verdict of the claims (`ostinato artifact check`): the checks of artifact/claims.yaml against their schema,
each outcome on hand-made result files, and the shipped data evaluated as a run without results would see it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from ostinato.artifact import verdict_table
from ostinato.artifact.checks import ClaimsError, load_claims
from ostinato.artifact.readers import SourceError
from ostinato.artifact.verdict import (MET, NOT_APPLICABLE, NOT_MET, NOT_RUN, Context, combine, evaluate,
                                       evaluate_all, verdicts)

REPO = Path(__file__).resolve().parents[1]
CLAIMS = REPO / "artifact" / "claims.yaml"
SCHEMA = REPO / "artifact" / "claims.schema.json"


def _load(tmp_path: Path, checks: list[dict], entry_id: str = "A1") -> list:
    """Claims of a one-entry claims file holding these checks."""
    doc = {"properties": [{"id": entry_id, "title": "a hand-made claim", "property": "p", "how": "h", "expected": "e",
                           "checks": checks}],
           "claims": [{"id": "C1", "title": "another claim", "claim": "c", "target": "t", "expected": "e",
                       "default": "d", "gpu": "g", "checks": [{"metric": "m", "source": "tables/x.csv", "field": "v",
                                                              "target": {"min": 0}, "applies": "any"}]}],
           "not_checked": []}
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_claims(path, SCHEMA)


def _check(tmp_path: Path, **spec):
    base = {"metric": "a metric", "source": "tables/t.csv", "field": "v", "target": {"min": 0}, "applies": "any"}
    return _load(tmp_path, [{**base, **spec}])[0].checks[0]


def _csv(tmp_path: Path, rel: str, text: str) -> None:
    p = tmp_path / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def _ctx(tmp_path: Path, kind: str = "cpu", **variables: str) -> Context:
    return Context(kind, tmp_path, {"machine": "box", **variables})


# --- the claims file -----------------------------------------------------------------------------------------------

def test_every_row_of_artifact_md_has_checks() -> None:
    claims = load_claims(CLAIMS)
    ids = [c.id for c in claims]
    assert ids == [f"A{i}" for i in range(1, 24)] + [f"C{i}" for i in range(1, 9)]
    assert all(c.checks and c.title for c in claims)
    artifact = (REPO / "ARTIFACT.md").read_text()
    for i in ids:
        assert re.search(rf"^\| {i} \|", artifact, re.M), f"{i} has no row in ARTIFACT.md"


def test_every_shipped_source_exists() -> None:
    """A check of shipped data reads files in the repository (a this-run source may be missing: not run)."""
    for claim in load_claims(CLAIMS):
        for check in claim.checks:
            refs = [v for v in check.target.parts().values() if hasattr(v, "sources")]
            for src in list(check.sources) + [s for r in refs for s in r.sources]:
                if src.startswith("data/"):
                    assert (REPO / src).is_file(), f"{check.name}: {src} is not shipped"


def test_schema_errors_name_the_entry_and_key(tmp_path: Path) -> None:
    with pytest.raises(ClaimsError, match=r"properties/0/checks/0 \(entry A1\).*'colour'"):
        _load(tmp_path, [{"metric": "m", "source": "tables/x.csv", "field": "v", "target": {"min": 0},
                          "applies": "any", "colour": "red"}])
    with pytest.raises(ClaimsError, match=r"entry A1"):  # a value needs its tolerance
        _load(tmp_path, [{"metric": "m", "source": "tables/x.csv", "field": "v", "target": {"value": 1},
                          "applies": "any"}])
    with pytest.raises(ClaimsError, match=r"entry A1"):  # only cpu and gpu are machine kinds
        _load(tmp_path, [{"metric": "m", "source": "tables/x.csv", "field": "v", "target": {"min": 0},
                          "applies": ["tpu"]}])
    with pytest.raises(ClaimsError, match="same row's column needs reduce one or each"):
        _load(tmp_path, [{"metric": "m", "source": "tables/x.csv", "field": "v", "target": {"max": {"field": "hi"}},
                          "reduce": "max", "applies": "any"}])


def test_also_evaluates_a_check_on_a_shipped_run(tmp_path: Path) -> None:
    checks = _load(tmp_path, [{"metric": "m", "source": "tables/t.csv", "field": "v", "applies": ["gpu"],
                               "target": {"min": {"source": "tables/t.csv", "field": "lo"}},
                               "also": ["data/reference/box"]}])[0].checks
    run, ref = checks
    assert (run.on, ref.on) == ("this run", "reference (box)") and ref.sources == ("data/reference/box/tables/t.csv",)
    assert ref.applies == {"cpu", "gpu"} and ref.target.min.sources == ("data/reference/box/tables/t.csv",)
    assert (run.name, ref.name, run.shipped, ref.shipped) == ("A1.1", "A1.2", False, True)


# --- each outcome on hand-made files -------------------------------------------------------------------------------

def test_met_and_not_met_with_a_tolerance(tmp_path: Path) -> None:
    _csv(tmp_path, "tables/t.csv", "workload,ratio\nswe,1.01\ntau2,0.97\n")
    check = _check(tmp_path, field="ratio", by=["workload"], reduce="each", target={"value": 1, "tol": 0.05})
    r = evaluate(check, _ctx(tmp_path))
    assert r.outcome == MET and r.measured == "swe 1.01; tau2 0.97" and r.target == "1 ± 0.05"
    check = _check(tmp_path, field="ratio", by=["workload"], reduce="each", target={"value": 1, "tol": 0.02})
    r = evaluate(check, _ctx(tmp_path))
    assert r.outcome == NOT_MET and "outside the target: tau2 0.97" in r.note


def test_not_applicable_on_another_machine_kind(tmp_path: Path) -> None:
    check = _check(tmp_path, applies=["gpu"], target={"max": 0.6}, note="speed needs a GPU")
    r = evaluate(check, _ctx(tmp_path, "cpu"))  # the file is not even read
    assert r.outcome == NOT_APPLICABLE and r.measured == "" and "speed needs a GPU" in r.note
    assert Context.kind_of("cuda") == "gpu" and Context.kind_of("cpu") == "cpu"


def test_missing_inputs_are_not_run_never_met(tmp_path: Path) -> None:
    check = _check(tmp_path, target={"min": 0})
    r = evaluate(check, _ctx(tmp_path))
    assert r.outcome == NOT_RUN and "missing tables/t.csv" in r.note
    _csv(tmp_path, "tables/t.csv", "series,v\nmeasured (other),1\nmeasured (box),\n")
    r = evaluate(_check(tmp_path, where={"series": "measured (nobody)"}), _ctx(tmp_path))
    assert r.outcome == NOT_RUN and "no rows of tables/t.csv match series=measured (nobody)" in r.note
    r = evaluate(_check(tmp_path, where={"series": "measured ({machine})"}), _ctx(tmp_path))
    assert r.outcome == NOT_RUN and "no value of v" in r.note  # an empty cell
    ref = {"min": {"source": "data/paper/missing.csv", "field": "v"}}
    assert evaluate(_check(tmp_path, where={"series": "measured (other)"}, target=ref), _ctx(tmp_path)).outcome \
        == NOT_RUN


def test_targets_read_from_other_files_and_the_same_row(tmp_path: Path) -> None:
    _csv(tmp_path, "data/paper/p.csv", "set,sessions\na,6\nb,13\n")
    _csv(tmp_path, "tables/t.csv", "set,series,sessions,value,lo,hi\na,derived,6,0.5,0.4,0.6\nb,derived,12,0.9,0.4,0.6\n")
    check = _check(tmp_path, field="sessions", by=["set"],
                   target={"equals": {"source": "data/paper/p.csv", "field": "sessions", "by": ["set"]}})
    r = evaluate(check, _ctx(tmp_path))
    assert r.outcome == NOT_MET and "b 12" in r.note and r.target == "= paper's sessions: a 6; b 13"
    check = _check(tmp_path, field="value", by=["set"], target={"min": {"field": "lo"}, "max": {"field": "hi"}})
    r = evaluate(check, _ctx(tmp_path))
    assert r.outcome == NOT_MET and r.note.startswith("outside the target: b 0.9") and r.target == "[row lo, row hi]"
    check = _check(tmp_path, field="value", reduce="sum", target={"gt": {"source": "tables/t.csv", "field": "lo",
                                                                         "reduce": "sum", "scale": 2}})
    assert evaluate(check, _ctx(tmp_path)).outcome == NOT_MET  # 0.5 + 0.9 against 2 × (0.4 + 0.4)
    check = _check(tmp_path, field="value", reduce="sum", target={"lt": {"source": "tables/t.csv", "field": "lo",
                                                                         "reduce": "sum", "scale": 2}})
    assert evaluate(check, _ctx(tmp_path)).outcome == MET


def test_json_paths_lists_and_several_files(tmp_path: Path) -> None:
    for run, ratios in (("run1", [0.5, 0.9]), ("run2", [0.55, 1.2])):
        (tmp_path / "data/reference/box" / run).mkdir(parents=True)
        (tmp_path / "data/reference/box" / run / "summary.json").write_text(json.dumps(
            {"meta": {"ok": True}, "rows": [{"engine": "o", "kind": "prefill", "ratio": ratios[0]},
                                            {"engine": "o", "kind": "decode", "ratio": ratios[1]}]}))
    sources = [f"data/reference/box/{r}/summary.json" for r in ("run1", "run2")]
    check = _check(tmp_path, source=sources, field="rows[].ratio", where={"kind": "decode"}, by=["_dir"],
                   target={"max": 1})
    r = evaluate(check, _ctx(tmp_path))
    assert r.outcome == NOT_MET and r.measured == "run1 0.9; run2 1.2" and check.on == "reference (box)"
    check = _check(tmp_path, source=sources[0], field="meta.ok", target={"equals": True})
    assert evaluate(check, _ctx(tmp_path)).measured == "true"
    with pytest.raises(SourceError, match=r"summary.json: no 'meta.nope'"):
        evaluate(_check(tmp_path, source=sources[0], field="meta.nope", target={"equals": True}), _ctx(tmp_path))
    with pytest.raises(ValueError, match="2 values match, expected one"):
        evaluate(_check(tmp_path, source=sources[0], field="rows[].ratio", target={"max": 1}), _ctx(tmp_path))


def test_test_outcomes_from_junit_and_pytest_logs(tmp_path: Path) -> None:
    (tmp_path / "results/artifact").mkdir(parents=True)
    (tmp_path / "results/artifact/pytest.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_one"/>'
        '<testcase classname="tests.test_a" name="test_two[x]"><failure message="boom"/></testcase>'
        '<testcase classname="tests.test_a" name="test_gpu"><skipped message="needs a GPU"/></testcase>'
        '<testcase classname="tests.test_b.TestThing" name="test_three"/>'
        "</testsuite></testsuites>")
    junit = dict(source="results/artifact/pytest.xml", field="outcome", reduce="each", target={"equals": "passed"})
    r = evaluate(_check(tmp_path, **junit, where={"test": "tests/test_a.py::*"}), _ctx(tmp_path))
    assert r.outcome == NOT_MET and r.measured == "1 passed, 1 failed"
    r = evaluate(_check(tmp_path, **junit, where={"test": ["tests/test_a.py::test_one", "tests/test_a.py::test_gpu",
                                                           "tests/test_b.py::TestThing::test_three"]}), _ctx(tmp_path))
    assert r.outcome == MET and r.measured == "2 passed"  # a skipped test is left out
    r = evaluate(_check(tmp_path, **junit, where={"test": "tests/test_a.py::test_gpu"}), _ctx(tmp_path))
    assert r.outcome == NOT_RUN
    (tmp_path / "data").mkdir()
    (tmp_path / "data/tests.txt").write_text("....F.\n=== short test summary info ===\n1 failed, 5 passed in 6.7s\n")
    r = evaluate(_check(tmp_path, source="data/tests.txt", field="outcome", reduce="each",
                        target={"equals": "passed"}), _ctx(tmp_path))
    assert r.outcome == NOT_MET and r.measured == "5 passed, 1 failed"


def test_a_claim_is_as_good_as_its_worst_check() -> None:
    assert combine([MET, NOT_RUN, NOT_APPLICABLE]) == NOT_RUN
    assert combine([MET, NOT_MET, NOT_RUN]) == NOT_MET
    assert combine([NOT_APPLICABLE, MET]) == MET and combine([NOT_APPLICABLE]) == NOT_APPLICABLE
    assert combine([]) == ""


def test_cli_writes_the_tables(tmp_path: Path) -> None:
    from ostinato.cli import main

    (tmp_path / "artifact").mkdir()
    shutil.copy(SCHEMA, tmp_path / "artifact" / "claims.schema.json")
    _load(tmp_path / "artifact", [{"metric": "m", "source": "tables/t.csv", "field": "v", "target": {"min": 0},
                                   "applies": ["gpu"]}])
    _csv(tmp_path, "tables/x.csv", "v\n-1\n")
    assert main(["artifact", "check", "--root", str(tmp_path), "--backend", "cpu", "--var", "machine=box",
                 "--csv", str(tmp_path / "claims.csv"), "--md", str(tmp_path / "claims.md"),
                 "--html", str(tmp_path / "claims.html")]) == 0
    md = (tmp_path / "claims.md").read_text()
    assert "machine `box`, a CPU-only run" in md and "| A1 | a hand-made claim | not applicable here | – |" in md
    assert "| C1 | another claim | not met | – |" in md
    html = (tmp_path / "claims.html").read_text()
    assert html.count('<tr class="claim">') == 2 and "ostinato-verdict" in html
    csv = (tmp_path / "claims.csv").read_text().splitlines()
    assert csv[0].split(",")[:3] == ["claim", "title", "check"] and len(csv) == 3


# --- the shipped data ----------------------------------------------------------------------------------------------

def _shipped_only(tmp_path: Path) -> Context:
    """A repository with the shipped data and no run: what a fresh clone's verdict reads."""
    (tmp_path / "data").symlink_to(REPO / "data")
    return Context("cpu", tmp_path, {"machine": "box", "model": "tiny-v4"})


def test_shipped_data_alone(tmp_path: Path) -> None:
    claims = load_claims(CLAIMS)
    results = evaluate_all(claims, _shipped_only(tmp_path))
    by_name = {r.check.name: r for r in results}
    for r in results:
        if not r.check.shipped:
            assert r.outcome in (NOT_RUN, NOT_APPLICABLE), r.check.name  # no run: never met
        elif r.check.sources[0].startswith("data/"):
            assert r.outcome in (MET, NOT_MET), (r.check.name, r.note)
    # the H200 reference: forced tokens, the sweep's goal, the memory model, the pools' tests on CUDA
    assert {by_name[n].outcome for n in ("A1.4", "A4.5", "A10.2", "A11.3", "A11.4", "A15.4", "A15.5")} == {MET}
    assert by_name["A11.3"].measured == "128 0.56×; 256 0.49×; 511 0.52×"
    assert by_name["C8.1"].outcome == MET and by_name["C8.1"].target == "2.250 ms (paper) ± 1%"
    # the paper's claim that Ostinato wins every session: 14 of 15 session runs on the H200 slice
    assert by_name["C1.4"].outcome == NOT_MET and "run2/tau2 2" in by_name["C1.4"].note


def test_the_default_configs_reference_run_as_this_run(tmp_path: Path) -> None:
    """data/reference/cpu-2c ships the default config's quoted results: read as this run, on a CPU-only machine,
    they meet every check they hold, and the speed checks are not applicable."""
    ctx = _shipped_only(tmp_path)
    for part in ("results", "tables"):
        shutil.copytree(REPO / "data/reference/cpu-2c" / part, tmp_path / part)
    claims = load_claims(CLAIMS)
    table = verdicts(claims, evaluate_all(claims, ctx))
    run = {v.claim.id: v.run for v in table}
    assert {run[i] for i in ("A4", "A6", "A7", "A8", "A12", "C7")} == {MET}
    assert {run[i] for i in ("A11", "A18", "C1", "C2", "C3")} == {NOT_APPLICABLE}
    df = verdict_table.frame(table)
    mine = df[df["on"] == "this run"]
    assert not (mine["outcome"] == NOT_MET).any(), mine[mine["outcome"] == NOT_MET]
    assert set(df["outcome"]) <= {MET, NOT_MET, NOT_APPLICABLE, NOT_RUN}
