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
# # Figure 7b: TTFT by new tokens after a prefix
#
# Reads the sweep of this run (`ostinato sweep`, rule `sweep_prefill`: each engine prefills a prefix once,
# then each size of new tokens after it, routing forced from synthetic traces, every engine with the same GPU
# memory for experts), the shipped reference run of the same benchmark (`figures.reference_sweep`: by default the
# H200's, `data/reference/h200/residency/bench/`) and the paper's Figure 7b (`data/paper/figure7.csv`, panel b).
# Writes `tables/<stem>.{csv,md}` and `figures/<stem>.{pdf,png}`. Series are labelled `paper`,
# `measured (<machine>)` (this run) and `measured (<reference_machine>, reference)` (the shipped run), so a run on
# the reference machine itself stays a separate line.
#
# **What compares.** Each series compares engines within one run on one machine; across series only the ratios
# to the baseline mean anything. The paper's sweep compares Ostinato with buun after development prefixes of
# 7.4K–39.3K tokens on four RTX 4090D; the measured series compare it with stock llama.cpp's whole-layer
# placement (`llama.cpp-layers`) at equal expert memory. On a CPU-only machine both branches share the same cores,
# so this run's series shows the procedure, not a speed comparison.

# %% tags=["parameters"]
summary_json = "results/sweep/summary.json"
machine = "this-machine"
baseline = "llama.cpp-layers"
reference_json = "data/reference/h200/residency/bench/summary.json"  # "" = no reference series
reference_machine = "h200"
figure7_csv = "data/paper/figure7.csv"
figures_dir = "figures"
tables_dir = "tables"
output_stem = "fig7b"

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ostinato.figures import apply_style, save_figure, save_table
from ostinato.figures.style import SERIES_LINESTYLES, SERIES_MARKERS, engine_palette, series_label

apply_style()

for name, path in (("summary_json", summary_json), ("figure7_csv", figure7_csv)):
    if not Path(path).is_file():
        raise FileNotFoundError(f"{name}: {path} not found")


ALL_ON_GPU = "every expert on the GPU"  # the memory of an engine a sweep ran beyond its budget (the floor)


def measured(path: str, machine_name: str) -> pd.DataFrame:
    """Prefill rows of a benchmark summary: median TTFT and ratio to the baseline per engine and size."""
    doc = json.loads(Path(path).read_text())
    df = pd.DataFrame(doc["rows"])
    df = df[df["kind"] == "prefill"].copy()
    df["series"] = series_label("measured", machine_name)
    df["n_new"] = df["n_new"].astype(int)
    if "prefix" not in df:  # a sweep of one prefix (older summaries) names it only in its meta
        df["prefix"] = doc["meta"]["prefix"]
    df["prefix"] = df["prefix"].astype(int)
    # an engine run beyond the sweep's equal expert memory (every expert on the GPU: the floor of a step) says so
    beyond = set(doc["meta"].get("beyond_budget", []))
    df["memory"] = [ALL_ON_GPU if e in beyond else "equal" for e in df["engine"]]
    return df


runs = [measured(summary_json, machine)]
if reference_json and Path(reference_json).is_file():
    runs.append(measured(reference_json, f"{reference_machine or 'reference'}, reference"))
meas = pd.concat(runs, ignore_index=True)
f7 = pd.read_csv(figure7_csv)
pb = f7[(f7["panel"] == "b") & (f7["metric"] == "ttft")].copy()
paper = pd.DataFrame({"engine": pb["engine"], "n_new": pb["new_tokens"].astype(int), "median_s": pb["value"].astype(float),
                      "series": series_label("paper"), "prefix": np.nan, "memory": "the paper's"})
base_paper = "buun"
pp = paper.set_index(["engine", "n_new"])["median_s"]
paper["ratio_to"] = [base_paper if e != base_paper else None for e in paper["engine"]]
paper["ratio"] = [pp[(e, n)] / pp[(base_paper, n)] if e != base_paper and (base_paper, n) in pp.index else np.nan
                  for e, n in zip(paper["engine"], paper["n_new"])]
print(sorted(meas["series"].unique()), "paper sizes:", sorted(paper["n_new"].unique()))

# %% [markdown]
# ## Table
# Median TTFT per engine and size, and the ratio to the series' baseline (measured: `baseline`, with its 95%
# bootstrap interval over repetitions; paper: buun).

# %%
cols = ["series", "engine", "memory", "n_new", "prefix", "median_s", "ratio_to", "ratio", "ratio_ci_low", "ratio_ci_high"]
table = pd.concat([meas.reindex(columns=cols), paper.reindex(columns=cols)], ignore_index=True)
table = table.sort_values(["series", "prefix", "n_new", "engine"]).reset_index(drop=True)
print("wrote", *save_table(table, Path(tables_dir) / output_stem, floatfmt=".3g"))
for (s, p), g in table[table["ratio"].notna()].groupby(["series", table["prefix"].fillna(-1)]):
    small = g[g["n_new"] < 512]
    after = f" after {int(p)} tokens" if p >= 0 else ""
    for e, ge in small.groupby("engine"):
        print(f"{s}{after}: {e} below 512 new tokens at "
              f"{ge['ratio'].min():.2f}-{ge['ratio'].max():.2f}x of {ge['ratio_to'].iloc[0]}")
table

# %% [markdown]
# ## Figure
# (a) median TTFT by new tokens, one line per engine, series and prefix (a sweep may measure several prefixes);
# (b) the ratio to each series' baseline, with the measured 95% intervals. The dotted line marks Np = 512.

# %%
fig, axes = plt.subplots(1, 2, figsize=(12.0, 4.0))
pal = engine_palette(sorted(table["engine"].unique()))
n_prefixes = table.groupby("series")["prefix"].nunique()
for (s, e, p), g in table.groupby(["series", "engine", table["prefix"].fillna(-1)]):
    kind = s.split(" ")[0]
    g = g.sort_values("n_new")
    after = f", after {int(p)}" if n_prefixes.get(s, 0) > 1 else ""
    after += f" ({ALL_ON_GPU})" if (g["memory"] == ALL_ON_GPU).any() else ""
    alpha = 1.0 if p < 0 or p == table.loc[table["series"] == s, "prefix"].min() else 0.55
    axes[0].plot(g["n_new"], g["median_s"], marker=SERIES_MARKERS[kind], linestyle=SERIES_LINESTYLES[kind],
                 color=pal[e], alpha=alpha, label=f"{e}, {s}{after}")
    r = g[g["ratio"].notna()]
    if len(r):
        axes[1].plot(r["n_new"], r["ratio"], marker=SERIES_MARKERS[kind], linestyle=SERIES_LINESTYLES[kind],
                     color=pal[e], alpha=alpha, label=f"{e} / {r['ratio_to'].iloc[0]}, {s}{after}")
        if r["ratio_ci_low"].notna().any():
            axes[1].fill_between(r["n_new"], r["ratio_ci_low"], r["ratio_ci_high"], color=pal[e], alpha=0.15)
for ax in axes:
    ax.set_xscale("log", base=2)
    ax.axvline(512, color="k", linewidth=0.6, linestyle=":")
    ax.set_xlabel("new tokens after the prefix")
axes[0].set_yscale("log")
axes[0].set_ylabel("median TTFT (s)")
axes[0].set_title("(a) TTFT")
axes[1].axhline(1.0, color="k", linewidth=0.6)
axes[1].set_ylabel("ratio to the series' baseline")
axes[1].set_title("(b) TTFT ratio")
axes[1].legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
axes[0].legend(fontsize="xx-small")
fig.suptitle("Figure 7b: TTFT by new tokens")
fig.tight_layout()
print("wrote", *save_figure(fig, Path(figures_dir) / output_stem))
