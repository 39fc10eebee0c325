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
output_stem = "table4"
params = {}  # overrides of ostinato.figures.notebook.ResultParams (inputs, series labels, target engine, folders)

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ostinato.figures import engine_palette, series_palette
from ostinato.figures import results as R
from ostinato.figures.notebook import setup_result

nb = setup_result(output_stem, params)
runs, paper, target = nb.runs, nb.paper, nb.params.target
workload = nb.params.workload
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
compared = R.compare(runs, nb.compare_options) if runs.series else None
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
nb.save_table(table)
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
nb.save_figure(fig)
