"""Routing traces, the calibrated generator and the routing-fact statistics (small traces made here)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ostinato.cli import main
from ostinato.routing.generator import (RoutingProfile, SessionRouter, layer_rankings, session_trace,
                                        write_session_trace)
from ostinato.routing.hot_v4flash import V4FLASH_HOT
from ostinato.routing.layout import layout_from_counts, read_layouts, synthetic_layouts
from ostinato.routing.shapes import custom_shape, get_shape
from ostinato.routing.stats import (SessionTrace, decode_any_cold, distinct_cold_per_pass, expert_counts,
                                    open_session_trace, prefill_cold_per_token, resident_mask, route_coverage,
                                    routing_facts)
from ostinato.routing.trace import (FLAG_SYNTHETIC, HEADER_SIZE, RoutingTrace, TraceShape, check_rows,
                                    open_trace_stream, read_trace, write_trace)
from ostinato.sessions.model import TokenizedRequest, TokenizedSession, write_sessions_jsonl

REPO = Path(__file__).resolve().parents[1]
SMALL = custom_shape(4, 16, 2, [1, 2, 3])  # layer 0 dense


# --- trace format -------------------------------------------------------------------------------

def test_synthetic_flag_round_trip_and_unknown_bits_ignored(tmp_path) -> None:
    lay = layout_from_counts("s", [("first", 20, 5)])
    t = session_trace(SMALL, lay)
    p = tmp_path / "a.route"
    write_trace(p, t)
    r = read_trace(p)
    assert r.synthetic and np.array_equal(np.asarray(r.ids), t.ids)
    flags = struct.unpack_from("<I", p.read_bytes(), 28)[0]
    assert flags == FLAG_SYNTHETIC
    raw = bytearray(p.read_bytes())
    struct.pack_into("<I", raw, 28, FLAG_SYNTHETIC | 0x80)  # a future bit
    p.write_bytes(bytes(raw))
    assert read_trace(p).synthetic
    write_trace(p, RoutingTrace(t.shape, t.ids))
    assert not read_trace(p).synthetic


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:10], "shorter than"),
    (lambda b: b"NOTROUTE" + b[8:], "not a routing trace"),
    (lambda b: b[:HEADER_SIZE + 7], "the header says 10 positions"),
    (lambda b: b + b"\0" * 8, "the header says 10 positions"),  # longer than the header says: not read anyway
    (lambda b: b[:24] + struct.pack("<I", 2) + b[28:], "id_bytes"),
    (lambda b: b[:20] + struct.pack("<I", 99) + b[24:], "impossible shape"),
])
def test_malformed_traces_rejected_naming_the_file(tmp_path, damage, message) -> None:
    p = tmp_path / "bad.route"
    write_trace(p, session_trace(SMALL, layout_from_counts("s", [("first", 8, 2)])))
    p.write_bytes(damage(p.read_bytes()))
    with pytest.raises(ValueError, match=message) as e:
        read_trace(p)
    assert str(p) in str(e.value)


def test_bad_ids_and_partial_rows_rejected_naming_the_file(tmp_path) -> None:
    shape = TraceShape(2, 16, 2)
    ids = np.zeros((4, 2, 2), dtype=np.uint8)
    ids[:, :, 1] = 1
    ids[2, 1, 0] = 20  # >= n_expert, not the none id
    p = tmp_path / "ids.route"
    p.write_bytes(struct.pack("<8sIIIIIIQ24x", b"OSTROUTE", 1, 2, 16, 2, 1, 0, 4) + ids.tobytes())
    lay = layout_from_counts("s", [("first", 3, 1)])
    with pytest.raises(ValueError, match=r"position 2, layer 1: expert id 20 is out of range") as e:
        open_session_trace(p, lay)
    assert str(p) in str(e.value)
    ids[2, 1, 0] = 0xFF  # half a row
    with pytest.raises(ValueError, match='position 2, layer 1: 1 of 2 ids are "no expert"'):
        check_rows(ids, shape, "x.route")
    ids[2, 1, 0] = 1  # the same expert twice
    with pytest.raises(ValueError, match="position 2, layer 1: expert 1 appears twice"):
        check_rows(ids, shape, "x.route")
    ids[2, 1, 0] = 3
    write_trace(p, RoutingTrace(shape, ids))
    with pytest.raises(ValueError, match="4 positions, the 3 of session s expected at most"):  # another session's
        open_session_trace(p, layout_from_counts("s", [("first", 2, 1)]))
    short = open_session_trace(p, layout_from_counts("s", [("first", 3, 3)]))  # ends early: fine
    res = resident_mask(expert_counts([short.trace]), 2)
    assert decode_any_cold([short], res).shape == (2,) and route_coverage([short], res) > 0


def test_stream_must_write_every_promised_position(tmp_path) -> None:
    p = tmp_path / "s.route"
    with pytest.raises(ValueError, match="wrote 3 positions"):
        with open_trace_stream(p, SMALL.trace_shape, 5, synthetic=True) as out:
            out.write(np.tile(np.array([0, 1], dtype=np.uint8), (3, 4, 1)))
    assert not p.exists() and not list(tmp_path.iterdir())


# --- generator ----------------------------------------------------------------------------------

def test_generator_fills_every_moe_layer_with_distinct_experts_deterministically() -> None:
    lay = layout_from_counts("sess/1", [("first", 300, 40), ("tool", 50, 30)])
    a = session_trace(SMALL, lay, seed=3)
    b = session_trace(SMALL, lay, seed=3)
    c = session_trace(SMALL, lay, seed=4)
    assert a.ids.shape == (420, 4, 2) and a.synthetic
    assert np.array_equal(a.ids, b.ids) and not np.array_equal(a.ids, c.ids)
    assert (a.ids[:, 0] == 0xFF).all() and (a.ids[:, 1:] < 16).all()
    assert (a.ids[:, 1:, 0] != a.ids[:, 1:, 1]).all()
    q = get_shape("qwen3-235b-a22b")
    t = session_trace(q, layout_from_counts("q", [("first", 64, 8)]))
    s = np.sort(t.ids.astype(int), axis=2)
    assert t.ids.dtype == np.uint8 and t.ids.shape == (72, 94, 8) and (np.diff(s, axis=2) > 0).all()


def test_streamed_file_equals_in_memory_trace(tmp_path) -> None:
    lay = layout_from_counts("s", [("first", 5000, 10), ("tool", 300, 200)])  # crosses chunk boundaries
    p = tmp_path / "s.route"
    seen = []
    write_session_trace(p, SMALL, lay, seed=1, progress=seen.append)
    assert sum(seen) == lay.n_pos
    assert np.array_equal(np.asarray(read_trace(p).ids), session_trace(SMALL, lay, seed=1).ids)


def test_v4flash_rankings_seeded_from_moe_l2_lists() -> None:
    ranks = layer_rankings(get_shape("deepseek-v4-flash"), seed=0)
    assert ranks.shape == (43, 256)
    for il in (0, 14, 42):
        head = V4FLASH_HOT[il]
        assert list(ranks[il, :len(head)]) == list(head)
        assert sorted(ranks[il]) == list(range(256))


def test_draw_follows_the_distribution() -> None:
    """With k = 1 the draws are categorical with the table's probabilities."""
    shape = custom_shape(1, 8, 1)
    prof = RoutingProfile(n_topics=1, topic_sigma=0.0, session_sigma=0.0, workload_sigma=0.0)
    r = SessionRouter.build(shape, prof, "w", "s", 0)
    ids = r.draw(np.zeros(200_000, dtype=bool), np.zeros(200_000, dtype=np.int64))[:, 0, 0]
    p = np.diff(np.concatenate([[0.0], r.cdf[0, 0, 0]]))
    assert np.abs(np.bincount(ids, minlength=8) / ids.size - p).max() < 0.005


def _top_sets(trace, n) -> set:
    c = expert_counts([trace])
    return set(np.argsort(-c.ravel(), kind="stable")[:n].tolist())


def test_rankings_stable_across_sessions_drift_across_workloads_local_in_time() -> None:
    shape = get_shape("deepseek-v4-flash")
    lay1, lay2 = (layout_from_counts(f"s{i}", [("first", 6000, 2000)]) for i in (1, 2))
    a = session_trace(shape, lay1, workload="swe")
    b = session_trace(shape, lay2, workload="swe")
    c = session_trace(shape, lay2, workload="tau2")
    n = 4864
    same = len(_top_sets(a, n) & _top_sets(b, n)) / n
    other = len(_top_sets(a, n) & _top_sets(c, n)) / n
    assert same > 0.8 and other < same - 0.03, (same, other)
    ids = a.ids[:6000, 5].astype(int)
    def overlap(x, y):
        return (x[:, :, None] == y[:, None, :]).any(axis=2).sum(axis=1).mean()
    assert overlap(ids[1:], ids[:-1]) > 1.2 * overlap(ids[3000:], ids[:3000])


# --- layouts ------------------------------------------------------------------------------------

def test_layouts_from_sessions_jsonl(tmp_path) -> None:
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps({"session": "swe-mini/x", "requests": [
        {"turn": 0, "kind": "first", "n_new": 5, "n_output": 2},
        {"turn": 1, "kind": "tool", "n_new": 3, "n_output": 1}]}) + "\n")
    (lay,) = read_layouts(p)
    assert lay.n_pos == 11 and lay.requests[1].start == 7
    assert lay.decode_mask().tolist() == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1]
    p.write_text('{"session": "x"}\n')
    with pytest.raises(ValueError, match=f"{p}:1"):
        read_layouts(p)


# --- statistics ---------------------------------------------------------------------------------

def test_stats_on_a_hand_made_trace_skip_none_rows() -> None:
    """Two MoE layers of 4 experts, k = 2; experts 0 and 1 of each layer resident (N = 4)."""
    shape = TraceShape(3, 4, 2)
    N = 0xFF
    lay = layout_from_counts("s", [("first", 4, 2)])
    ids = np.full((6, 3, 2), N, dtype=np.uint8)
    ids[:, 1] = [[0, 1], [0, 2], [1, 3], [1, 3], [0, 1], [0, 2]]
    ids[:, 2] = [[0, 1], [0, 1], [N, N], [N, N], [1, 0], [3, 2]]  # last layer: prefill rows missing
    st = SessionTrace("t", RoutingTrace(shape, ids), lay)
    counts = expert_counts([st.trace])
    assert counts.sum() == 2 * (6 + 4) and counts[0].sum() == 0
    res = resident_mask(counts, 4)
    assert res[1, :2].all() and res[2, :2].all() and res.sum() == 4
    # layer 1: 12 routes, 4 cold; layer 2: 8 routes, 2 cold
    assert route_coverage([st], res) == pytest.approx(14 / 20)
    # prefill: 3 cold routes over 4 + 2 computed (position, layer) rows
    assert prefill_cold_per_token([st], res, 1, 10) == [(4, pytest.approx(3 / 6))]
    assert decode_any_cold([st], res)[1:].tolist() == [0.5, 0.5]
    assert distinct_cold_per_pass([st], res, n_pass=2) == [0.5, 1.0]  # layer 2 not computed in pass 2


def test_calibration_targets_met_on_v4flash_shaped_traces() -> None:
    """One development and one held-out SWE-like session (~100K positions): every routing fact in range."""
    shape = get_shape("deepseek-v4-flash")
    (dev,) = synthetic_layouts("swe", 1, seed=1)
    (held,) = synthetic_layouts("swe", 1, seed=2)
    facts = routing_facts([SessionTrace("dev", session_trace(shape, dev), dev)],
                          [SessionTrace("held", session_trace(shape, held), held)])
    bad = [(t.name, t.value, (t.lo, t.hi)) for t in facts.targets() if not t.ok]
    assert not bad, bad
    assert len(facts.prefill_cold) >= 10 and facts.pass_distinct_cold


def test_cli_generate_and_stats(tmp_path, capsys) -> None:
    sessions = tmp_path / "s.jsonl"
    write_sessions_jsonl([TokenizedSession(f"tau2/x/{i}", "tau2", "byte", "chatml", (
        TokenizedRequest(0, "first", (1,) * 2100, (2,) * 30), TokenizedRequest(1, "user", (3,) * 200, (4,) * 20)))
        for i in range(2)], sessions)
    common = ["--model", "custom", "--n-layer", "3", "--n-expert", "32", "--n-expert-used", "4", "--no-progress"]
    assert main(["routing", "generate", "--sessions", str(sessions), "--select", "1", "--out",
                 str(tmp_path / "dev"), *common]) == 0
    assert main(["routing", "generate", "--synthetic-sessions", "1", "--workload", "tau2", "--out",
                 str(tmp_path / "held"), "--set", "decode_temp=1.3", *common]) == 0
    man = json.loads((tmp_path / "dev" / "manifest.json").read_text())
    assert man["synthetic"] and [s["file"] for s in man["sessions"]] == ["tau2__x__0.route"]
    assert read_trace(tmp_path / "dev" / "tau2__x__0.route").n_pos == 2350
    out = tmp_path / "stats.json"
    assert main(["routing", "stats", "--dev", str(tmp_path / "dev"), "--heldout", str(tmp_path / "held"),
                 "--n-resident-decode", "40", "--n-resident-prefill", "48", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["synthetic"] and res["label"].startswith("simulated (generator/calibrated")
    assert {t["name"] for t in res["targets"]} >= {"coverage_top44", "decode_any_cold"}
    assert "coverage_top44" in capsys.readouterr().out
    assert main(["routing", "stats", "--dev", str(tmp_path), "--heldout", str(tmp_path / "held"), "--out", str(out)]) == 2
    assert f"{tmp_path}/manifest.json: no manifest" in capsys.readouterr().err


def test_cli_stats_paper_shares_and_sessions_per_directory(tmp_path, capsys) -> None:
    """--paper-shares keeps the paper's resident shares (4,864 and 5,702 of 11,008) of the traces' own experts, and
    --heldout-sessions pairs one sessions file with each held-out directory (recorded traces have no manifest)."""
    import shutil

    def sessions(name, n_first):
        path = tmp_path / f"{name}.jsonl"
        write_sessions_jsonl([TokenizedSession(f"tau2/{name}/0", "tau2", "byte", "chatml", (
            TokenizedRequest(0, "first", (1,) * n_first, (2,) * 30),
            TokenizedRequest(1, "user", (3,) * 200, (4,) * 20)))], path)
        return path

    common = ["--model", "custom", "--n-layer", "2", "--n-expert", "256", "--n-expert-used", "6", "--no-progress"]
    files = {name: sessions(name, n) for name, n in (("dev", 300), ("a", 2100), ("b", 400))}
    for name, path in files.items():
        assert main(["routing", "generate", "--sessions", str(path), "--out", str(tmp_path / name), *common]) == 0
        (tmp_path / name / "manifest.json").unlink()  # as recorded: the sessions file says where requests sit
    out = tmp_path / "stats.json"
    assert main(["routing", "stats", "--dev", str(tmp_path / "dev"), "--dev-sessions", str(files["dev"]),
                 "--heldout", str(tmp_path / "a"), str(tmp_path / "b"), "--heldout-sessions", str(files["a"]),
                 str(files["b"]), "--paper-shares", "--label", "recorded (test)", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["n_resident_decode"] == round(4864 * 512 / 11008) and res["n_resident_prefill"] == round(5702 * 512 / 11008)
    assert res["cold_per_layer"] == pytest.approx((512 - res["n_resident_decode"]) / 2)
    assert res["label"] == "recorded (test)" and len(res["heldout"]) == 2 and res["pass_distinct_cold"]
    assert main(["routing", "stats", "--dev", str(tmp_path / "dev"), "--dev-sessions", str(files["dev"]), "--heldout",
                 str(tmp_path / "a"), str(tmp_path / "b"), "--heldout-sessions", str(files["a"]), str(files["b"]),
                 str(files["dev"]), "--out", str(out)]) == 2
    assert "--heldout-sessions names 3 files for the 2 directories of --heldout" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "b")
    assert main(["routing", "stats", "--dev", str(tmp_path / "dev"), "--dev-sessions", str(files["dev"]), "--heldout",
                 str(tmp_path / "b"), "--heldout-sessions", str(files["b"]), "--out", str(out)]) != 0
    assert "no routing trace for session tau2/b/0" in capsys.readouterr().err


# --- notebook -----------------------------------------------------------------------------------

NOTEBOOK = REPO / "notebooks" / "routing_stats.ipynb"


def test_notebook_twin_in_sync() -> None:
    nb = json.loads(NOTEBOOK.read_text())
    assert nb["metadata"]["jupytext"]["formats"] == "ipynb,py:percent"
    assert len([c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]) == 1
    text = NOTEBOOK.with_suffix(".py").read_text()
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(src in text for src in code), "run `jupytext --sync notebooks/routing_stats.ipynb`"


@pytest.mark.slow  # papermill starts a kernel
def test_notebook_runs_on_stats_files(tmp_path) -> None:
    pytest.importorskip("papermill")
    common = ["--model", "custom", "--n-layer", "2", "--n-expert", "32", "--n-expert-used", "4", "--no-progress"]
    for name, seed in (("dev", 1), ("held", 2)):
        assert main(["routing", "generate", "--synthetic-sessions", "1", "--session-seed", str(seed),
                     "--out", str(tmp_path / name), *common]) == 0
    stats = []
    for label in ("", "measured (cpu-2c)"):
        out = tmp_path / f"stats{len(stats)}.json"
        assert main(["routing", "stats", "--dev", str(tmp_path / "dev"), "--heldout", str(tmp_path / "held"),
                     "--n-resident-decode", "28", "--n-resident-prefill", "33", "--out", str(out),
                     *(["--label", label] if label else [])]) == 0
        stats.append(str(out))
    params = tmp_path / "params.yaml"
    params.write_text(json.dumps({"stats_json": stats, "figures_dir": str(tmp_path / "figures"),
                                  "tables_dir": str(tmp_path / "tables")}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "papermill", str(NOTEBOOK), str(tmp_path / "out.ipynb"), "-f",
                          str(params), "--cwd", str(tmp_path), "-k", "python3"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("figures/routing_stats.pdf", "figures/routing_stats.png", "tables/routing_stats.csv",
                 "tables/routing_stats.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    md = (tmp_path / "tables" / "routing_stats.md").read_text()
    assert "simulated (generator/calibrated)" in md and "measured (cpu-2c)" in md
