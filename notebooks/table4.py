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
# # Table 4: Qwen3-235B-A22B, buun → Ostinato
#
# The paper's Table 4 (60 held-out τ2 tasks on Qwen3-235B-A22B: median TTFT after a tool output and after a user
# message, total request time, tasks won, prefill and decode time, first-turn TTFT) beside every series given to
# this notebook, each as Ostinato's change against its reference engine (`buun` where the series has it, else the
# first other engine, named in `reference_engine`), on one workload (`workload`, τ² as in the paper). The pipeline
# gives it only series of a Qwen3-MoE model: the replay when `replay.model` is a `qwen3moe` model, the simulator
# when `sim.model` is `qwen3-235b-a22b`, and the shipped replays of `figures.reference_qwen_runs` (the default
# config: three H200 runs of `llama.cpp-layers` and `ostinato` on `qwen3-235b-slice-8`, 8 of the model's 94 MoE
# layers with random weights and MXFP4 experts, `data/reference/h200/qwen/`). Their reference engine is
# `llama.cpp-layers`, not the paper's buun. Writes `tables/<stem>.{csv,md}` and `figures/<stem>.{pdf,png}`.

# %% tags=["parameters"]
measured_sessions = []  # per-session CSVs of `ostinato replay summarize`; [] = none
measured_requests = []  # their per-request CSVs
machine = ""  # label of the measured series; "" = the CSVs' `machine` column
sim_sessions = []  # `ostinato sim run` outputs; [] = none
sim_requests = []
profile = "paper-4x4090d"  # machine profile of the simulated series
paper_dir = "data/paper"
target = "ostinato"
n_resamples = 9999  # bootstrap resamples of the saved share's 95% CI
ci_seed = 0
figures_dir = "figures"
tables_dir = "tables"
reference_runs = ["data/reference/h200/qwen/run1", "data/reference/h200/qwen/run2",
                  "data/reference/h200/qwen/run3"]  # shipped Qwen3 replays of another machine (repeated runs); [] = none
reference_machine = "h200"
workload = "tau2"  # the paper's workloads: "tau2" (Table 4's) or "SWE"
output_stem = "table4"

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ostinato.figures import apply_style, engine_palette, save_figure, save_table, series_palette
from ostinato.figures import results as R
from ostinato.figures.runs import load_series

apply_style()
runs = load_series(measured_sessions, measured_requests, machine, sim_sessions, sim_requests, profile,
                   reference_runs, reference_machine)
paper = Path(paper_dir)
print("series:", *runs.series, sep="\n  ")
reference_preference = ["buun", "llama.cpp-layers"]  # Ostinato's reference engine in a series, first present

# %%
t4 = pd.read_csv(paper / "table4_qwen.csv").set_index("metric")
METRICS = [("ttft_tool_s", "median TTFT after a tool output"), ("ttft_user_s", "median TTFT after a user message"),
           ("total_s", "total request time"), ("prefill_s", "prefill time"), ("decode_s", "decode time"),
           ("ttft_first_s", "median TTFT of first turns")]
PAPER_METRIC = {"ttft_tool_s": "ttft_tool_s", "ttft_user_s": "ttft_user_s", "total_s": "total_request_time",
                "prefill_s": "prefill_time", "decode_s": "decode_time", "ttft_first_s": "ttft_first_s"}
rows = []
for m, desc in METRICS:
    pm = PAPER_METRIC.get(m)
    if pm in t4.index:
        r = t4.loc[pm]
        rows.append({"series": R.PAPER, "workload": "tau2", "metric": m, "description": desc,
                     "reference_engine": "buun", "reference": r.get("buun"), "ostinato": r.get("ostinato"),
                     "change_pct": r.get("change_pct") if pd.notna(r.get("change_pct")) or pd.isna(r.get("buun"))
                     else 100 * (r.get("ostinato") / r.get("buun") - 1), "note": r.get("note")})
won = t4.loc["sessions_won"] if "sessions_won" in t4.index else None
if won is not None:
    rows.append({"series": R.PAPER, "workload": "tau2", "metric": "won", "description": "tasks Ostinato finishes sooner",
                 "reference_engine": "buun", "reference": np.nan, "ostinato": won.get("ostinato"),
                 "change_pct": np.nan, "note": won.get("note")})
compared = R.compare(runs, R.CompareOptions(target=target, n_resamples=n_resamples, seed=ci_seed)) if runs.series else None
for (series, wl), g in ([] if compared is None else compared.groupby(["series", "workload"], sort=False)):
    if wl != workload:
        continue
    g = g.set_index("engine")
    refs = [e for e in reference_preference if e in g.index] + [e for e in g.index if e != target]
    if target not in g.index or not refs:
        continue
    ref = refs[0]
    for m, desc in METRICS:
        a, b = g.loc[target, m], g.loc[ref, m]
        note = (f"saved {g.loc[ref, 'saved_pct']:.1f}% [{g.loc[ref, 'saved_ci_low_pct']:.1f}–"
                f"{g.loc[ref, 'saved_ci_high_pct']:.1f}] (95% CI over sessions)"
                if m == "total_s" and pd.notna(g.loc[ref, "saved_pct"]) else "")
        rows.append({"series": series, "workload": wl, "metric": m, "description": desc, "reference_engine": ref,
                     "reference": b, "ostinato": a, "change_pct": 100 * (a / b - 1) if pd.notna(a) and b else np.nan,
                     "note": note})
    rows.append({"series": series, "workload": wl, "metric": "won", "description": "sessions Ostinato finishes sooner",
                 "reference_engine": ref, "reference": g.loc[ref, "sessions"], "ostinato": g.loc[ref, "won"],
                 "change_pct": np.nan, "note": f"{int(g.loc[ref, 'won'])} of {int(g.loc[ref, 'sessions'])}"})
table = pd.DataFrame(rows)
print("wrote", *save_table(table, Path(tables_dir) / output_stem))
print("series:", *dict.fromkeys(table["series"]))
table

# %%
ch = table[table["change_pct"].notna()]
labels = list(dict.fromkeys(ch["series"]))
fig, ax = plt.subplots(figsize=(7.5, 3.6))
sns.barplot(data=ch, x="metric", y="change_pct", hue="series", hue_order=labels, palette=series_palette(labels), ax=ax)
ax.axhline(0, color="black", lw=0.6)
ax.set_xlabel("")
ax.set_ylabel(f"{target} against the reference (%)")
ax.tick_params(axis="x", rotation=25)
ax.set_title("Table 4: Qwen3-235B-A22B (paper: 60 τ2 tasks, buun → Ostinato)")
sns.move_legend(ax, "upper left", bbox_to_anchor=(1.0, 1.0), title=None)
fig.tight_layout()
print("wrote", *save_figure(fig, Path(figures_dir) / output_stem))
