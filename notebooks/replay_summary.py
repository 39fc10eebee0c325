# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Replay summary: engine variants per session
#
# Reads the per-session CSV of `ostinato replay summarize` (one row per engine and session),
# writes a per-session table (`tables/replay_summary.{csv,md}`), a figure
# (`figures/replay_summary.{pdf,png}`) comparing the engine variants (`stock`, `ostinato`, …) and the
# comparison of every engine with the target engine as in the paper's Table 3 (`tables/replay_compare.{csv,md}`) and,
# with the per-request CSV, each engine's median TTFT after tool outputs by new tokens as in the paper's Figure 7a
# (`tables/replay_by_new_tokens.{csv,md}`).
# Every series is measured on one machine and labelled `measured (<machine>)`.
#
# **Foreign load.** Each replay samples what else loaded the machine (`ostinato.replay.load`): a session whose other
# processes used more than the threshold's share of the machine's CPU time (config `replay.foreign_load_threshold`,
# default 10%) is flagged `foreign load`; its times include waiting for that work. Results made before the replay
# sampled the load are `unknown`. The table and the comparison count the flags; the figure marks flagged sessions
# `*` and unknown ones `?` on its axis.

# %% tags=["parameters"]
summary_csv = "results/replay/sessions.csv"  # one path, or a list of paths (concatenated)
figures_dir = "figures"
tables_dir = "tables"
machine = ""  # label of the machine; empty: taken from the CSV's `machine` column
engines = ["llama.cpp-layers", "ostinato"]  # order in table and plot; engines absent from the CSV are left out
output_stem = "replay_summary"
requests_csv = ""  # optional per-request CSV(s) of `replay summarize --requests-out`: medians over requests
target = "ostinato"  # engine whose savings the comparison reports
compare_stem = "replay_compare"
by_new_tokens_stem = "replay_by_new_tokens"  # written when requests_csv is given and the comparison is made
n_resamples = 9999  # bootstrap resamples of the saved share's CI
ci_seed = 0

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from ostinato.figures import apply_style, engine_label, engine_palette, save_figure, save_table

apply_style()

paths = [summary_csv] if isinstance(summary_csv, str) else list(summary_csv)
missing = [p for p in paths if not Path(p).is_file()]
if missing:
    raise FileNotFoundError(f"summary_csv: {missing} not found (expected `ostinato replay summarize --out` CSVs)")
df = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
required = {"engine", "session", "total_request_s", "ttft_median_s", "tpot_median_s"}
if not required <= set(df.columns):
    raise ValueError(f"summary_csv lacks columns {sorted(required - set(df.columns))}")
if not machine:
    labels = sorted(df["machine"].dropna().astype(str).unique()) if "machine" in df else []
    machine = ", ".join(labels) or "this machine"
order = [e for e in engines if e in set(df["engine"])] + sorted(set(df["engine"]) - set(engines))
df = df[df["engine"].isin(order)].copy()
df["engine"] = pd.Categorical(df["engine"], categories=order, ordered=True)
sessions = sorted(df["session"].unique())
short = {s: f"s{i}" for i, s in enumerate(sessions)}  # x-axis labels of the figure (`*` foreign load, `?` unknown)
print(f"{len(df)} rows, engines {order}, machine {machine!r}")

# %% [markdown]
# ## Per-session table
# One row per session (`label` as on the figure's axis); per engine the total request time (sum of client latencies), median TTFT
# and TPOT (over its successful requests) and the load flag of its replay (`<engine>_load`); `speedup_vs_<reference>` = the
# first other engine's total request time over the target's where both completed the session; `failed_engines`
# names those that did not; `load_flag` is `foreign load` when any engine's replay of the session was flagged,
# `unknown` when one was not sampled, else `clean`.

# %%
metrics = {"total_request_s": "total_s", "ttft_median_s": "ttft_med_s", "tpot_median_s": "tpot_med_s"}
wide = df.pivot_table(index="session", columns="engine", values=list(metrics), aggfunc="first", observed=True)
table = pd.DataFrame(index=wide.index)
for engine in order:
    for col, abbrev in metrics.items():
        if (col, engine) in wide.columns:
            table[f"{engine}_{abbrev}"] = wide[(col, engine)]
counts = df.groupby("session", observed=True)["n_requests"].max() if "n_requests" in df else None
if counts is not None:
    table.insert(0, "n_requests", counts)
failed_engines = pd.Series("", index=table.index)
if "session_ok" in df:
    failed = df.loc[~df["session_ok"].astype(bool), ["session", "engine"]].astype({"engine": str})
    failed_engines = failed.groupby("session", observed=True)["engine"].apply(
        lambda s: ",".join(map(str, s))).reindex(table.index).fillna("")
reference = next((e for e in order if e != target), None)
if reference is not None and target in order:  # only where both engines completed the session
    table[f"speedup_vs_{reference}"] = (table[f"{reference}_total_s"] / table[f"{target}_total_s"]).where(failed_engines == "")
table["failed_engines"] = failed_engines
flags = (df.assign(load_flag=df["load_flag"].fillna("unknown")) if "load_flag" in df else df.assign(load_flag="unknown"))
load = flags.pivot_table(index="session", columns="engine", values="load_flag", aggfunc="first", observed=True)
for engine in order:
    if engine in load.columns:
        table[f"{engine}_load"] = load[engine].reindex(table.index)
session_flag = load.apply(lambda r: "foreign load" if (r == "foreign load").any()
                          else "unknown" if (r == "unknown").any() else "clean", axis=1)
table["load_flag"] = session_flag.reindex(table.index)
mark = {"foreign load": "*", "unknown": "?", "clean": ""}
short = {s: f"{short[s]}{mark[session_flag.get(s, 'unknown')]}" for s in sessions}
table = table.reset_index()
table.insert(1, "label", table["session"].map(short))
saved = save_table(table, Path(tables_dir) / output_stem)
print("wrote", *saved)
table

# %% [markdown]
# ## Figure
# Per session and engine: total request time, median TTFT and median TPOT.

# %%
df["series"] = [engine_label(str(e), "measured", machine) for e in df["engine"]]
hue_order = [engine_label(e, "measured", machine) for e in order]
palette = {engine_label(e, "measured", machine): c for e, c in engine_palette(order).items()}
df["session_short"] = df["session"].map(short)
print("series:", *hue_order, sep="\n  ")
print("sessions:", *(f"{v} = {k}" for k, v in short.items()), sep="\n  ")

panels = [("total_request_s", "total request time (s)"), ("ttft_median_s", "median TTFT (s)"),
          ("tpot_median_s", "median TPOT (s)")]
fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.4), squeeze=False)
for ax, (col, title) in zip(axes[0], panels):
    sns.barplot(data=df, x="session_short", y=col, hue="series", hue_order=hue_order, palette=palette,
                order=[short[s] for s in sessions], ax=ax)
    ax.set_xlabel("session")
    ax.set_ylabel(title)
    if ax is not axes[0][-1] and ax.get_legend() is not None:
        ax.get_legend().remove()
if axes[0][-1].get_legend() is not None:
    sns.move_legend(axes[0][-1], "upper left", bbox_to_anchor=(1.0, 1.0), title=None)
n_flag, n_unknown = int((session_flag == "foreign load").sum()), int((session_flag == "unknown").sum())
fig.suptitle(f"Replay per session, {machine}: {n_flag} of {len(sessions)} sessions under foreign load (*)"
             + (f", {n_unknown} unknown (?)" if n_unknown else ""))
fig.tight_layout()
figs = save_figure(fig, Path(figures_dir) / output_stem)
print("wrote", *figs)

# %% [markdown]
# ## Comparison with the target engine (Table 3's columns)
# `ostinato.replay.metrics` compares each engine with the target (`ostinato`) on the sessions that
# every engine completed (the others are dropped and counted), per workload (the session id's source
# prefix, `swe-mini` or `tau2`, like Table 3's two halves) and over all sessions: total request time, share saved =
# 1 − Σtarget / Σengine over sessions with a 95% BCa bootstrap CI (paired resampling of sessions, seeded),
# sessions won, median TTFT by request kind and median TPOT, and the client/server agreement
# (client total / server prefill + decode, and the gap in percentage points between the share saved at
# the client and at the server; the paper's Appendix C finds the two within 0.5 points).
#
# **What the default config compares**: `llama.cpp-layers` (the pinned llama.cpp with the replay patches, whole MoE
# layers on the GPU while the expert budget lasts) and `ostinato` (the same plus the resident expert pools with
# the split and upload prefill paths, loading the plan made from the development sessions' recorded routing), at
# the same GPU memory for experts. On a CPU-only machine there is no GPU: the layers preset runs everything on
# the CPU, the pool is a host buffer and both branches share the same cores, so the share saved there is no speed
# comparison; on a GPU it is. Rows are labelled `measured (<machine>)`. The `foreign load` column counts each engine's
# sessions measured under foreign load (`k/n`; `unknown` without load samples).

# %%
from ostinato.replay.metrics import CompareConfig, compare_engines, display_table, save_comparison

req_paths = [] if not requests_csv else [requests_csv] if isinstance(requests_csv, str) else list(requests_csv)
requests = pd.concat([pd.read_csv(p) for p in req_paths], ignore_index=True) if req_paths else None
if target in order and len(order) > 1:
    others = tuple(e for e in order if e != target)
    comparison = compare_engines(df.assign(engine=df["engine"].astype(str)), requests,
                                 CompareConfig(target=target, engines=others, n_resamples=n_resamples,
                                               seed=ci_seed, machine=machine))
    written = save_comparison(comparison, Path(tables_dir) / compare_stem)
    print(f"{len(comparison.kept)} sessions completed by every engine, {len(comparison.dropped)} dropped"
          + (f": {', '.join(comparison.dropped)}" if comparison.dropped else ""))
    print("wrote", *written)
    compare_view = display_table(comparison.table)
    if requests is not None:
        from ostinato.replay.sizes import save_by_new_tokens, ttft_by_new_tokens

        sizes = ttft_by_new_tokens(requests, comparison.kept, target, [target, *others])
        print("wrote", *save_by_new_tokens(sizes, Path(tables_dir) / by_new_tokens_stem))
else:
    compare_view = None
    print(f"no comparison: target {target!r} and at least one other engine needed (engines {order})")
compare_view
