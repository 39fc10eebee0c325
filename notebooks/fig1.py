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
# # Figure 1: speedups over the slowest engine
#
# (a) Median TTFT after a tool output and (b) total request time, each engine's speedup over the slowest engine
# of its series and workload (the paper's Figure 1, derived from its Table 3: slowest in TTFT is llama.cpp's
# expert cache, in total time KTransformers). This run's replays and the simulator's policies are ranked the same
# way among the engines they have, so the reference engine can differ between series (`reference_engine`).
# Writes `tables/<stem>.{csv,md}` and `figures/<stem>.{pdf,png}`.

# %% tags=["parameters"]
output_stem = "fig1"
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
compared = R.compare(runs, nb.compare_options)
table = pd.concat([R.paper_figure1(paper / "figure1.csv"),
                   R.speedups(compared, "ttft_tool_s"), R.speedups(compared, "total_s")], ignore_index=True)
nb.save_table(table)
table

# %%
panels = [("ttft_tool_s", "(a) TTFT after a tool output"), ("total_s", "(b) total request time")]
workloads = list(dict.fromkeys(table["workload"]))
labels = list(dict.fromkeys(table["series"]))
fig, axes = plt.subplots(len(panels), len(workloads), figsize=(5.0 * len(workloads), 3.2 * len(panels)),
                         squeeze=False)
for (metric, title), row in zip(panels, axes):
    for ax, w in zip(row, workloads):
        d = table[(table["metric"] == metric) & (table["workload"] == w)]
        if d.empty:
            ax.set_visible(False)
            continue
        sns.barplot(data=d, x="engine", y="speedup", hue="series", hue_order=[s for s in labels if s in set(d["series"])],
                    palette=series_palette(labels), ax=ax)
        ax.axhline(1.0, color="black", lw=0.6)
        ax.tick_params(axis="x", rotation=30)
        ax.set_xlabel("")
        ax.set_ylabel("speedup over the slowest")
        ax.set_title(f"{title}, {w}")
        if ax.get_legend() is not None:
            ax.get_legend().remove()
# one legend for every series of every panel (a series may be in one workload's panels only)
handles = {lab: h for ax in axes.flat for h, lab in zip(*ax.get_legend_handles_labels())}
fig.legend([handles[s] for s in labels if s in handles], [s for s in labels if s in handles], loc="upper left",
           bbox_to_anchor=(1.0, 0.98))
fig.tight_layout()
nb.save_figure(fig)
