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
# # Figure 6: prefill and decode time, TTFT and TPOT by context length
#
# (a, b) Each engine's prefill and decode time as the engine itself reports it (for this run, llama-server's
# `timings` summed over the sessions every engine completed; for the simulator, its two phases), and Ostinato's
# change against each other engine beside the paper's changes; (c) median TTFT after a tool output and after a
# user message; (d) median TPOT per context-length quartile (quartile edges over all engines of a series and
# workload). Writes `tables/<stem>.{csv,md}` (the changes, with the paper's), `tables/<stem>_tpot.{csv,md}`
# (panel d, with the paper's ranges) and `figures/<stem>.{pdf,png}`.

# %% tags=["parameters"]
output_stem = "fig6"
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
f6 = pd.read_csv(paper / "figure6.csv")
compared = R.compare(runs, nb.compare_options)
changes = R.phase_changes(compared, target)
pab = f6[f6["panel"].isin(["a", "b"])]
paper_changes = (pab.assign(phase=pab["metric"].str.replace("_change", ""))
                 .pivot_table(index=["workload", "engine", "reference_engine"], columns="phase",
                              values=["value", "value_low", "value_high"], aggfunc="first"))
paper_changes.columns = [f"{p}_change_{'pct' if v == 'value' else v.replace('value_', '') + '_pct'}"
                         for v, p in paper_changes.columns]
paper_changes = paper_changes.reset_index().assign(series=R.PAPER)
table = pd.concat([paper_changes, changes], ignore_index=True).reindex(columns=[
    "series", "workload", "engine", "reference_engine", "prefill_change_pct", "prefill_change_low_pct",
    "prefill_change_high_pct", "decode_change_pct", "decode_change_low_pct", "decode_change_high_pct",
    "total_change_pct"])
nb.save_table(table)
table

# %%
tpot = R.tpot_by_context(runs)
pd_ = f6[f6["panel"] == "d"]
paper_tpot = pd.DataFrame({"series": R.PAPER, "workload": pd_["workload"], "engine": pd_["engine"],
                           "quartile": "1-4", "tpot_low_ms": pd_["value_low"], "tpot_high_ms": pd_["value_high"]})
tpot_table = pd.concat([paper_tpot, tpot], ignore_index=True)
nb.save_table(tpot_table, "_tpot")
tpot_table

# %%
fig, axes = plt.subplots(len(runs.series) or 1, 4, figsize=(17, 3.3 * max(1, len(runs.series))), squeeze=False)
for row, s in zip(axes, runs.series):
    c = compared[compared["series"] == s]
    engines = list(dict.fromkeys(c["engine"]))
    pal = engine_palette(engines)
    for ax, (col, title) in zip(row[:2], [("prefill_s", "(a) prefill time (s)"), ("decode_s", "(b) decode time (s)")]):
        sns.barplot(data=c, x="workload", y=col, hue="engine", hue_order=engines, palette=pal, ax=ax)
        ax.set_title(f"{title}\n{s}")
        ax.set_ylabel("")
        if ax.get_legend() is not None and ax is not row[0]:
            ax.get_legend().remove()
    if row[0].get_legend() is not None:
        row[0].legend(fontsize="x-small", title=None)
    k = R.ttft_by_kind(c)
    k = k[k["kind"].isin(["tool", "user"])].assign(group=lambda d: d["workload"] + " " + d["kind"])
    sns.barplot(data=k, x="group", y="ttft_median_s", hue="engine", hue_order=engines, palette=pal, ax=row[2])
    row[2].set_title(f"(c) median TTFT after tool / user (s)\n{s}")
    row[2].set_xlabel("")
    row[2].set_ylabel("")
    if row[2].get_legend() is not None:
        row[2].get_legend().remove()
    t = tpot[tpot["series"] == s]
    for (w, e), g in t.groupby(["workload", "engine"], sort=False):
        row[3].plot(g["quartile"], g["tpot_median_ms"], marker="o", color=pal.get(e), ls="-" if w == "SWE" else "--",
                    label=f"{e}, {w}")
    row[3].set_xticks([1, 2, 3, 4])
    row[3].set_xlabel("context-length quartile")
    row[3].set_title(f"(d) median TPOT (ms)\n{s}")
    row[3].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="x-small")
fig.tight_layout()
nb.save_figure(fig)
