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
output_stem = "fig5"
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

# %%
t3 = pd.read_csv(paper / "table3_heldout.csv")
t3 = t3[t3["gpus"] == 4]
paper_rows = pd.DataFrame({"series": R.PAPER, "workload": t3["workload"], "engine": t3["engine"], "kind": "tool",
                           "turns": t3["workload"].map({"SWE": 880, "tau2": 504}), "p50_s": t3["ttft_tool_s"]})
table = pd.concat([paper_rows, R.ttft_quantiles(runs, "tool")], ignore_index=True)
nb.save_table(table)
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
nb.save_figure(fig)
