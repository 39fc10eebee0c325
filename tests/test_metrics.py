"""`ostinato replay compare` on hand-made CSVs: saved share, bootstrap CI, sessions won, medians, agreement."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import ostinato.cli
from ostinato.replay.metrics import CompareConfig, bootstrap_saved, compare_engines, save_comparison, saved_share

FAST = CompareConfig(n_resamples=999)


def session_rows(totals: dict[str, list[float]], failed: dict[str, set[int]] | None = None,
                 server_scale: float = 1.0) -> pd.DataFrame:
    """Per-session CSV rows like `replay summarize`: totals per engine and session index, some sessions failed."""
    failed = failed or {}
    rows = []
    for engine, values in totals.items():
        for i, total in enumerate(values):
            rows.append({
                "engine": engine, "machine": "cpu-2c", "session": f"s{i:02d}", "n_requests": 4, "n_ok": 4,
                "session_ok": i not in failed.get(engine, set()), "error": "", "total_request_s": total,
                "ttft_median_s": 0.1 * total, "ttft_median_first_s": 0.2 * total, "ttft_median_tool_s": 0.05 * total,
                "ttft_median_user_s": float("nan"), "tpot_median_s": 0.001 * total,
                "server_prefill_s": 0.4 * total * server_scale, "server_decode_s": 0.5 * total * server_scale,
                "client_server_ratio": 1 / (0.9 * server_scale),
            })
    return pd.DataFrame(rows)


def noisy(n: int, seed: int = 1) -> dict[str, list[float]]:
    """Target about 60% of stock per session, with per-session noise."""
    rng = np.random.default_rng(seed)
    stock = rng.uniform(50, 150, n)
    return {"stock": list(stock), "ostinato": list(stock * rng.normal(0.6, 0.05, n))}


def test_saved_share_is_one_minus_ratio_of_sums():
    assert saved_share(np.array([1.0, 3.0]), np.array([4.0, 4.0])) == pytest.approx(0.5)
    comp = compare_engines(session_rows({"stock": [10, 20, 30], "ostinato": [6, 10, 30]}), cfg=FAST)
    row = comp.table.set_index("engine").loc["stock"]
    assert row["saved_pct"] == pytest.approx(100 * (1 - 46 / 60))  # not the mean of per-session shares
    assert row["total_s"] == 60 and comp.table.set_index("engine").loc["ostinato", "total_s"] == 46
    assert row["won"] == 2  # the tie in s02 is not a win
    assert list(comp.table["engine"]) == ["ostinato", "stock"] and pd.isna(comp.table["saved_pct"].iloc[0])


def test_ci_contains_point_and_narrows_with_more_sessions():
    widths, pool = [], noisy(160)
    for n in (10, 160):  # the first n sessions of one sample: the CI should shrink about as 1/sqrt(n)
        comp = compare_engines(session_rows({e: v[:n] for e, v in pool.items()}), cfg=FAST)
        row = comp.table.set_index("engine").loc["stock"]
        assert row["saved_ci_low_pct"] < row["saved_pct"] < row["saved_ci_high_pct"]
        widths.append(row["saved_ci_high_pct"] - row["saved_ci_low_pct"])
    assert widths[1] < 0.5 * widths[0]


@pytest.mark.parametrize("method", ["BCa", "percentile"])
def test_ci_is_seeded(method: str):
    t, e = np.array(noisy(12)["ostinato"]), np.array(noisy(12)["stock"])
    cfg = CompareConfig(n_resamples=999, method=method, seed=3)
    assert bootstrap_saved(t, e, cfg) == bootstrap_saved(t, e, cfg)
    assert bootstrap_saved(t, e, cfg) != bootstrap_saved(t, e, CompareConfig(n_resamples=999, method=method, seed=4))


def test_ci_degenerate_cases():
    assert all(np.isnan(bootstrap_saved(np.array([1.0]), np.array([2.0]), FAST)))
    assert bootstrap_saved(np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 6.0]), FAST) == (0.5, 0.5)
    low, high = bootstrap_saved(np.array([1.0, 3.0]), np.array([2.0, 4.0]), FAST)  # BCa undefined: percentile
    assert low <= saved_share(np.array([1.0, 3.0]), np.array([2.0, 4.0])) <= high


def test_dropped_sessions_and_engine_choice():
    totals = {"stock": [10, 20, 30, 40], "ostinato": [5, 10, 15, 20], "buun": [8, 16, 24, 32]}
    df = session_rows(totals, failed={"buun": {3}})
    df = df[~((df["engine"] == "stock") & (df["session"] == "s00"))]  # stock never ran s00
    comp = compare_engines(df, cfg=FAST)
    assert comp.kept == ["s01", "s02"] and comp.dropped == ["s00", "s03"]
    assert (comp.table["sessions"] == 2).all() and (comp.table["dropped"] == 2).all()
    only_buun = compare_engines(df, cfg=CompareConfig(engines=("buun",), n_resamples=999))
    assert only_buun.kept == ["s00", "s01", "s02"] and list(only_buun.table["engine"]) == ["ostinato", "buun"]
    assert only_buun.table.set_index("engine").loc["buun", "saved_pct"] == pytest.approx(100 * (1 - 30 / 48))
    with pytest.raises(ValueError, match="target engine"):
        compare_engines(df, cfg=CompareConfig(target="nope"))
    with pytest.raises(ValueError, match="not in the CSV"):
        compare_engines(df, cfg=CompareConfig(engines=("ktransformers",)))
    with pytest.raises(ValueError, match="no session"):
        compare_engines(session_rows({"stock": [1.0], "ostinato": [1.0]}, failed={"stock": {0}}))
    with pytest.raises(ValueError, match="repeat"):
        compare_engines(pd.concat([df, df]))


def test_client_server_agreement():
    totals = {"stock": [10.0, 20.0], "ostinato": [5.0, 8.0]}
    comp = compare_engines(session_rows(totals, server_scale=1 / 0.9), cfg=FAST)  # server time = client time
    t = comp.table.set_index("engine")
    assert t["client_server_ratio"].to_numpy() == pytest.approx([1.0, 1.0])
    assert t.loc["stock", "server_saved_pct"] == pytest.approx(t.loc["stock", "saved_pct"])
    assert t.loc["stock", "saved_gap_pp"] == pytest.approx(0.0, abs=1e-9)
    df = session_rows(totals)
    df.loc[df["engine"] == "ostinato", "server_decode_s"] += 1.0  # the target's server reports 2 s more
    t = compare_engines(df, cfg=FAST).table.set_index("engine")
    assert t.loc["stock", "server_saved_pct"] == pytest.approx(100 * (1 - (0.9 * 13 + 2) / (0.9 * 30)))
    assert t.loc["stock", "saved_gap_pp"] == pytest.approx(t.loc["stock", "saved_pct"] - t.loc["stock", "server_saved_pct"])
    assert t.loc["stock", "client_server_ratio"] == pytest.approx(1 / 0.9)


def test_medians_over_requests_or_session_medians():
    sessions = session_rows({"stock": [10.0, 20.0], "ostinato": [5.0, 8.0]})
    comp = compare_engines(sessions, cfg=FAST)
    t = comp.table.set_index("engine")
    assert t.loc["stock", "ttft_tool_s"] == pytest.approx(0.05 * 15) and t.loc["stock", "tpot_ms"] == pytest.approx(15)
    assert t.loc["stock", "n_tool"] == 2 and t.loc["stock", "n_user"] == 0 and (t["medians_over"] == "session medians").all()
    requests = pd.DataFrame([
        {"engine": e, "session": s, "kind": k, "ok": ok, "ttft_s": v, "tpot_s": v / 100}
        for e in ("stock", "ostinato") for s in ("s00", "s01")
        for k, ok, v in (("first", True, 3.0), ("tool", True, 1.0), ("tool", True, 2.0), ("user", True, 0.5),
                         ("tool", False, 99.0))
    ] + [{"engine": "stock", "session": "s99", "kind": "tool", "ok": True, "ttft_s": 50.0, "tpot_s": 1.0}])
    t = compare_engines(sessions, requests, FAST).table.set_index("engine")
    assert t.loc["stock", "ttft_tool_s"] == 1.5 and t.loc["stock", "n_tool"] == 4  # failed and other sessions left out
    assert t.loc["stock", "ttft_first_s"] == 3.0 and t.loc["stock", "ttft_user_s"] == 0.5
    assert t.loc["stock", "tpot_ms"] == pytest.approx(15.0) and (t["medians_over"] == "requests").all()


def test_compare_cli_writes_csv_and_markdown(tmp_path: Path, capsys):
    totals = {"stock": [10.0, 20.0, 30.0], "ostinato": [6.0, 11.0, 19.0]}
    session_rows(totals, failed={"ostinato": {2}}).to_csv(tmp_path / "s.csv", index=False)
    rc = ostinato.cli.main(["replay", "compare", "--sessions", str(tmp_path / "s.csv"), "--n-resamples", "499",
                            "--ci-method", "percentile", "--out", str(tmp_path / "tables" / "replay_compare")])
    assert rc == 0 and "1 dropped: s02" in capsys.readouterr().err
    csv = pd.read_csv(tmp_path / "tables" / "replay_compare.csv")
    assert list(csv["engine"]) == ["ostinato", "stock"] and csv["saved_pct"].iloc[1] == pytest.approx(100 * (1 - 17 / 30))
    assert (csv["ci_method"] == "percentile").all() and csv["won"].iloc[1] == 2
    md = (tmp_path / "tables" / "replay_compare.md").read_text()
    assert "measured (cpu-2c)" in md and "2/2" in md and "43.3% [" in md and "1 dropped" in md
    assert not list((tmp_path / "tables").glob(".*tmp"))
    assert ostinato.cli.main(["replay", "compare", "--sessions", str(tmp_path / "none.csv"), "--out", str(tmp_path / "x")]) == 2


def test_save_comparison_accepts_csv_suffix(tmp_path: Path):
    comp = compare_engines(session_rows({"stock": [2.0, 4.0], "ostinato": [1.0, 3.0]}), cfg=FAST)
    paths = save_comparison(comp, tmp_path / "c.csv")
    assert [p.name for p in paths] == ["c.csv", "c.md"]


def test_compare_reads_what_summarize_writes(tmp_path: Path):
    """Request lines → `summarize_sessions` → CSVs → compare: the columns line up and medians use requests."""
    from ostinato.replay.results import REQUEST_COLUMNS, summarize_sessions

    rows = []
    for engine, scale in (("stock", 1.0), ("ostinato", 0.5)):
        for s in ("a", "b"):
            for turn, kind in enumerate(("first", "tool", "user")):
                rows.append({**dict.fromkeys(REQUEST_COLUMNS), "engine": engine, "machine": "m", "session": s,
                             "turn": turn, "kind": kind, "ok": True, "error": None, "n_new": 5, "n_output": 3,
                             "ttft_s": scale * (turn + 1), "latency_s": scale * 4.0, "tpot_s": scale * 0.01,
                             "server_prompt_ms": scale * 1000.0, "server_predicted_ms": scale * 3000.0,
                             "server_prompt_n": 5})
    requests = pd.DataFrame(rows)
    summarize_sessions(requests).to_csv(tmp_path / "s.csv", index=False)
    requests.to_csv(tmp_path / "r.csv", index=False)
    rc = ostinato.cli.main(["replay", "compare", "--sessions", str(tmp_path / "s.csv"), "--requests", str(tmp_path / "r.csv"),
                            "--n-resamples", "99", "--out", str(tmp_path / "c")])
    t = pd.read_csv(tmp_path / "c.csv").set_index("engine")
    assert rc == 0 and t.loc["stock", "saved_pct"] == pytest.approx(50.0) and t.loc["stock", "won"] == 2
    assert t.loc["stock", "ttft_user_s"] == 3.0 and t.loc["stock", "n_user"] == 2 and t.loc["ostinato", "tpot_ms"] == 5.0
    assert t["client_server_ratio"].to_numpy() == pytest.approx([1.0, 1.0]) and t.loc["stock", "saved_gap_pp"] == 0
    (tmp_path / "empty.csv").write_text("")
    assert ostinato.cli.main(["replay", "compare", "--sessions", str(tmp_path / "empty.csv"), "--out", str(tmp_path / "x")]) == 2


def test_rows_per_workload_and_all():
    df = session_rows({"stock": [10.0, 20.0, 30.0, 40.0], "ostinato": [5.0, 10.0, 15.0, 30.0]}, failed={"ostinato": {3}})
    df["session"] = df["session"].map({"s00": "tau2/a/0", "s01": "tau2/a/1", "s02": "swe-mini/x", "s03": "swe-mini/y"})
    t = compare_engines(df, cfg=FAST).table.set_index(["workload", "engine"])
    assert list(t.index.get_level_values(0).unique()) == ["swe-mini", "tau2", "all"]
    assert t.loc[("tau2", "stock"), "saved_pct"] == pytest.approx(50.0) and t.loc[("tau2", "stock"), "sessions"] == 2
    assert t.loc[("swe-mini", "stock"), "sessions"] == 1 and t.loc[("swe-mini", "stock"), "dropped"] == 1
    assert t.loc[("all", "stock"), "total_s"] == 60 and t.loc[("all", "stock"), "dropped"] == 1
    df = df[df["session"] != "swe-mini/x"]  # no swe-mini session left that both engines completed
    t = compare_engines(df, cfg=FAST).table.set_index(["workload", "engine"])
    assert t.loc[("swe-mini", "stock"), "sessions"] == 0 and pd.isna(t.loc[("swe-mini", "stock"), "saved_pct"])
    assert t.loc[("all", "stock"), "saved_pct"] == pytest.approx(50.0)


def test_compare_counts_sessions_under_foreign_load(tmp_path: Path):
    """The load flag of `replay summarize` reaches the comparison: per engine how many kept sessions were flagged,
    and summaries without the flag (made before the replay sampled the load) count as unknown, not clean."""
    df = session_rows({"stock": [10.0, 20.0, 30.0], "ostinato": [5.0, 10.0, 15.0]})
    df["load_flag"] = ["foreign load", "clean", "clean", "clean", "clean", "foreign load"]
    df["load_threshold"] = 0.1
    comp = compare_engines(df, cfg=FAST)
    t = comp.table.set_index("engine")
    assert t.loc["stock", "foreign_load_sessions"] == 1 and t.loc["ostinato", "foreign_load_sessions"] == 1
    assert (t["load_unknown_sessions"] == 0).all() and (t["load_threshold"] == 0.1).all()
    save_comparison(comp, tmp_path / "c")
    md = (tmp_path / "c.md").read_text()
    assert "| 1/3" in md and "2 of 6 engine sessions flagged" in md and "above 10% of the machine's CPU time" in md
    old = compare_engines(session_rows({"stock": [10.0, 20.0], "ostinato": [5.0, 10.0]}), cfg=FAST)
    assert (old.table["load_unknown_sessions"] == 2).all() and (old.table["foreign_load_sessions"] == 0).all()
    save_comparison(old, tmp_path / "old")
    assert "| unknown" in (tmp_path / "old.md").read_text() and "4 unknown" in (tmp_path / "old.md").read_text()


def test_compare_clean_only_leaves_out_sessions_under_foreign_load(tmp_path: Path, capsys):
    """`--clean-only`: a session that any compared engine replayed under foreign load leaves the paired comparison
    for every engine; the note says why sessions were dropped; nothing clean left is an error, not an empty table."""
    df = session_rows({"stock": [10.0, 20.0, 30.0], "ostinato": [5.0, 10.0, 15.0]})
    df.loc[0, "total_request_s"] = 100.0  # stock's s00 slowed by other work: the saving it shows is not the engine's
    df["load_flag"] = ["foreign load", "clean", "clean", "clean", "clean", "clean"]
    df["load_threshold"] = 0.1
    every = compare_engines(df, cfg=FAST)
    clean = compare_engines(df, cfg=CompareConfig(n_resamples=999, clean_only=True))
    assert every.kept == ["s00", "s01", "s02"] and clean.kept == ["s01", "s02"] and clean.dropped == ["s00"]
    t = clean.table.set_index("engine")
    assert t.loc["stock", "saved_pct"] == pytest.approx(50.0) and t.loc["stock", "foreign_load_sessions"] == 0
    assert every.table.set_index("engine").loc["stock", "saved_pct"] == pytest.approx(80.0)
    df.to_csv(tmp_path / "s.csv", index=False)
    assert ostinato.cli.main(["replay", "compare", "--sessions", str(tmp_path / "s.csv"), "--clean-only",
                              "--n-resamples", "999", "--out", str(tmp_path / "c")]) == 0
    assert "2 sessions completed by every engine and under no foreign load in any (1 dropped)" in (
        tmp_path / "c.md").read_text()
    assert "s00" in capsys.readouterr().err
    df["load_flag"] = "foreign load"
    with pytest.raises(ValueError, match="without foreign load"):
        compare_engines(df, cfg=CompareConfig(n_resamples=999, clean_only=True))


def size_requests() -> pd.DataFrame:
    """Per-request rows of two engines over two sessions: tool-output turns of 100, 300 and 2,000 new tokens
    (a failed one among them), a user turn, and a third session only the target finished."""
    rows = []
    for engine, scale in (("ostinato", 1.0), ("stock", 2.0)):
        for s in ("s00", "s01"):
            for turn, (kind, n_new, ttft, ok) in enumerate([("first", 3000, 5.0, True), ("tool", 100, 0.1, True),
                                                             ("tool", 300, 0.4, True), ("tool", 2000, 2.0, True),
                                                             ("tool", 300, 9.0, False), ("user", 50, 0.05, True)]):
                slower = scale if n_new < 512 else (1.25 if engine == "stock" else 1.0)
                rows.append({"engine": engine, "session": s, "turn": turn, "kind": kind, "n_new": n_new,
                             "ttft_s": ttft * slower, "tpot_s": 0.01, "ok": ok})
    rows.append({"engine": "ostinato", "session": "s02", "turn": 0, "kind": "tool", "n_new": 300, "ttft_s": 50.0,
                 "tpot_s": 0.01, "ok": True})
    return pd.DataFrame(rows)


def test_ttft_by_new_tokens_bins_tool_turns_of_the_kept_sessions():
    from ostinato.replay.sizes import ttft_by_new_tokens

    t = ttft_by_new_tokens(size_requests(), ["s00", "s01"]).set_index(["new_tokens", "engine"])
    # only answered tool-output turns of the kept sessions: the failed turn and s02 are left out
    assert t.loc[("256-511", "ostinato"), "turns"] == 2 and t.loc[("256-511", "ostinato"), "ttft_median_s"] == pytest.approx(0.4)
    assert t.loc[("<128", "stock"), "ttft_median_s"] == pytest.approx(0.2)
    # the target's change against an engine: half the time below 512 new tokens, 1/1.25 above
    assert t.loc[("<512", "stock"), "change_pct"] == pytest.approx(-50.0)
    assert t.loc[("<512", "stock"), "turns"] == 4
    assert t.loc[(">=1024", "stock"), "change_pct"] == pytest.approx(100 * (1 / 1.25 - 1))
    assert pd.isna(t.loc[("<512", "ostinato"), "change_pct"])
    # an empty bin has no median and no change
    assert t.loc[("128-255", "stock"), "turns"] == 0 and pd.isna(t.loc[("128-255", "stock"), "change_pct"])


def test_ttft_by_new_tokens_errors_name_what_is_missing():
    from ostinato.replay.sizes import ttft_by_new_tokens

    with pytest.raises(ValueError, match="lacks columns \\['n_new'\\]"):
        ttft_by_new_tokens(size_requests().drop(columns="n_new"), ["s00"])
    with pytest.raises(ValueError, match="target engine 'fast' not in the per-request CSV"):
        ttft_by_new_tokens(size_requests(), ["s00"], target="fast")
    # a target without tool-output turns in the kept sessions: bins without medians, not an error
    t = ttft_by_new_tokens(size_requests()[lambda r: r["kind"] != "tool"], ["s00"])
    assert set(t["turns"]) == {0} and t["ttft_median_s"].isna().all() and t["change_pct"].isna().all()


def test_compare_cli_writes_ttft_by_new_tokens(tmp_path: Path, capsys):
    session_rows({"stock": [10, 20, 30], "ostinato": [6, 10, 30]}).to_csv(tmp_path / "s.csv", index=False)
    size_requests().to_csv(tmp_path / "r.csv", index=False)
    args = ["replay", "compare", "--sessions", str(tmp_path / "s.csv"), "--n-resamples", "499", "--out",
            str(tmp_path / "cmp"), "--by-new-tokens", str(tmp_path / "sizes")]
    assert ostinato.cli.main(args) == 2  # needs the per-request CSV
    assert "--by-new-tokens needs --requests" in capsys.readouterr().err
    assert ostinato.cli.main(args + ["--requests", str(tmp_path / "r.csv")]) == 0
    table = pd.read_csv(tmp_path / "sizes.csv")
    # the sessions every engine completed (s00-s02 here): s02's target-only turn counts, as compare keeps s02
    assert set(table["sessions"]) == {3} and set(table["engine"]) == {"ostinato", "stock"}
    md = (tmp_path / "sizes.md").read_text()
    # below 512: the target's 0.1, 0.1, 0.4, 0.4 and s02's 50 s (median 0.4) against 0.2, 0.2, 0.8, 0.8 (0.5)
    assert "| <512 | 5 | 0.400 | 0.500 | -20.0% |" in md and "ostinato vs stock" in md
