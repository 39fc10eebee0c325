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
# # Figure 5: the distribution of TTFT after tool outputs
#
# Cumulative distribution of the time to first token of every turn after a tool output, per engine, for this
# run's replays and the simulator's policies; the paper's medians (Table 3, 880 SWE and 504 τ2 turns) are marked
# on the axis. Writes `tables/<stem>.{csv,md}` (quantiles per series, workload and engine, with the paper's
# medians as `p50_s`) and `figures/<stem>.{pdf,png}`.

# %% tags=["parameters"]
measured_sessions = ["results/replay/sessions.csv"]  # per-session CSVs of `ostinato replay summarize`; [] = none
measured_requests = ["results/replay/requests.csv"]  # their per-request CSVs
machine = ""  # label of the measured series; "" = the CSVs' `machine` column
sim_sessions = ["results/sim/synthetic-swe-heldout/sessions.csv"]  # `ostinato sim run` outputs; [] = none
sim_requests = ["results/sim/synthetic-swe-heldout/requests.csv"]
profile = "paper-4x4090d"  # machine profile of the simulated series
paper_dir = "data/paper"
target = "ostinato"
n_resamples = 9999  # bootstrap resamples of the saved share's 95% CI
ci_seed = 0
figures_dir = "figures"
tables_dir = "tables"
reference_runs = ["data/reference/h200/compare/run1", "data/reference/h200/compare/run2",
                  "data/reference/h200/compare/run3"]  # shipped replays of another machine (repeated runs); [] = none
reference_machine = "h200"
output_stem = "fig5"

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

# %%
t3 = pd.read_csv(paper / "table3_heldout.csv")
t3 = t3[t3["gpus"] == 4]
paper_rows = pd.DataFrame({"series": R.PAPER, "workload": t3["workload"], "engine": t3["engine"], "kind": "tool",
                           "turns": t3["workload"].map({"SWE": 880, "tau2": 504}), "p50_s": t3["ttft_tool_s"]})
table = pd.concat([paper_rows, R.ttft_quantiles(runs, "tool")], ignore_index=True)
print("wrote", *save_table(table, Path(tables_dir) / output_stem))
table

# %%
tool = runs.requests[(runs.requests["kind"] == "tool") & runs.requests["ttft_s"].notna()]
panels = [(s, w) for s in runs.series for w in dict.fromkeys(runs.requests["workload"])
          if len(tool[(tool["series"] == s) & (tool["workload"] == w)])]
fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.6 * max(1, len(panels)), 3.4), squeeze=False)
for ax, (s, w) in zip(axes[0], panels):
    d = tool[(tool["series"] == s) & (tool["workload"] == w)]
    engines = list(dict.fromkeys(d["engine"]))
    sns.ecdfplot(data=d, x="ttft_s", hue="engine", hue_order=engines, palette=engine_palette(engines), ax=ax)
    pm = paper_rows[(paper_rows["workload"] == w) & paper_rows["engine"].isin(engines)]
    for _, r in pm.iterrows():
        ax.plot([r["p50_s"]], [0.5], marker="s", ls="none", color=engine_palette(engines)[r["engine"]])
    ax.set_xscale("log")
    ax.set_xlabel("TTFT after a tool output (s)")
    ax.set_ylabel("share of turns")
    ax.set_title(f"{w}: {s}" + ("\nsquares: paper medians" if len(pm) else ""))
fig.tight_layout()
print("wrote", *save_figure(fig, Path(figures_dir) / output_stem))
