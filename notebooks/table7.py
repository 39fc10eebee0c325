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
# # Table 7: median TTFT by turn type
#
# Median time to first token of the first turn, of turns after a tool output and of turns after a user message,
# per engine: the paper's Table 7 (held-out, DeepSeek-V4-Flash, four GPUs), this run's replays (client-side
# TTFT at the first streamed token) and the simulator's policies. `turns` counts the requests behind each median
# (sessions every engine of the series completed). Writes `tables/<stem>.{csv,md}` and `figures/<stem>.{pdf,png}`.
#
# The default config's τ2 sessions have user turns and its SWE sessions have none, as in the paper; the
# simulator's default trace set is SWE only.

# %% tags=["parameters"]
output_stem = "table7"
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
table = pd.concat([R.paper_table7(paper / "table7_ttft_by_kind.csv"), R.ttft_by_kind(compared)], ignore_index=True)
nb.save_table(table)
table.pivot_table(index=["workload", "kind", "engine"], columns="series", values="ttft_median_s", sort=False)

# %% [markdown]
# ## Each engine's median TTFT relative to Ostinato's, per turn type
# Absolute TTFTs differ by orders of magnitude between the paper's machine, this run and the simulated profile,
# so the figure shows each median over the target's median of the same series, workload and turn type.

# %%
rel = table.merge(table[table["engine"] == target][["series", "workload", "kind", "ttft_median_s"]],
                  on=["series", "workload", "kind"], suffixes=("", "_target"))
rel["ttft_rel_target"] = rel["ttft_median_s"] / rel["ttft_median_s_target"]
labels = list(dict.fromkeys(rel["series"]))
grid = sns.catplot(data=rel, x="engine", y="ttft_rel_target", hue="series", hue_order=labels, col="kind",
                   row="workload", kind="bar", palette=series_palette(labels), height=2.8, aspect=1.3, sharey=False)
for ax in grid.axes.flat:
    ax.axhline(1.0, color="black", lw=0.6)
    ax.tick_params(axis="x", rotation=30)
grid.set_axis_labels("", f"median TTFT / {target}'s")
nb.save_figure(grid.figure)
