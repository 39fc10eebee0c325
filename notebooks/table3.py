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
# # Table 3: held-out sessions, every engine against Ostinato
#
# The paper's Table 3 (DeepSeek-V4-Flash, four GPUs: total request time, the share Ostinato saves with its 95%
# bootstrap interval, sessions won, median TTFT after a tool output, median TPOT) beside this run's replays
# (`measured (<machine>)`: `ostinato replay run`, client-side request times, sessions every engine completed) and
# the simulator's policies on the configured trace sets (`simulated (<profile>)`). Writes
# `tables/<stem>.{csv,md}` and `figures/<stem>.{pdf,png}` (the saved share per engine with its interval).
#
# **Reading it.** The paper's totals are sums over 13 SWE sessions and 60 τ2 tasks; this run's are sums over the
# configured session sets, so compare the saved shares and their order, not the totals. The simulator stands for
# KTransformers by its placement (`ktransformers-placement`) only.
#
# **CPU-only replays are a correctness run.** A replay whose summary records a `cpu` engine build, or a machine
# without a GPU (the default config: a tiny synthetic model on the CPU, where `llama.cpp-layers` has no GPU to place
# layers on and Ostinato's pool is a host buffer), measures no engine's speed. It gets no speed bars: its rows in the
# table carry `role` = `correctness` with completed sessions, forced-token matches and the sessions measured under
# foreign load (other processes above `replay.foreign_load_threshold` of the machine's CPU time), and the figure shows
# them in a panel of their own. Measured rows of every series count their sessions under foreign load
# (`foreign_load_sessions`; `load_unknown_sessions` where the replay took no load samples, as in the shipped runs).

# %% tags=["parameters"]
output_stem = "table3"
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
speed = pd.concat([R.paper_table3(paper / "table3_heldout.csv", paper / "table7_ttft_by_kind.csv"),
                   R.compare(runs, nb.compare_options)], ignore_index=True).assign(role="speed")
checks = R.correctness(nb.correctness).assign(role="correctness")
table = pd.concat([speed, checks], ignore_index=True) if len(checks) else speed
nb.save_table(table)
speed[["series", "workload", "engine", "sessions", "total_s", "saved_pct", "saved_ci_low_pct", "saved_ci_high_pct",
       "won", "ttft_tool_s", "tpot_ms", "foreign_load_sessions", "load_unknown_sessions"]]

# %% [markdown]
# ## Correctness runs (CPU-only replays)
# Per series, workload and engine: sessions completed, requests that returned exactly their recorded tokens, and the
# sessions measured under foreign load (empty when this run's replays had a GPU).

# %%
checks

# %% [markdown]
# ## The share Ostinato saves, per engine
# Bars: the saved share (1 − ΣOstinato / Σengine over sessions); whiskers: its 95% interval where it has one.

# %%
saved = speed[speed["saved_pct"].notna()]
workloads = list(dict.fromkeys(saved["workload"]))
labels = list(dict.fromkeys(saved["series"]))
n_rows = 2 if len(checks) else 1
# each workload's panel as wide as its engines need (the measured series add engines to some workloads only)
n_engines = [saved.loc[saved["workload"] == w, "engine"].nunique() for w in workloads]
fig, axes = plt.subplots(n_rows, len(workloads), figsize=(max(5.2 * len(workloads), 2 + 0.9 * sum(n_engines)), 3.6 * n_rows),
                         squeeze=False, gridspec_kw={"width_ratios": n_engines})
for ax, w in zip(axes[0], workloads):
    d = saved[saved["workload"] == w]
    engines = list(dict.fromkeys(d["engine"]))
    width = 0.8 / len(labels)
    for i, lab in enumerate(labels):
        s = d[d["series"] == lab].set_index("engine").reindex(engines)
        x = np.arange(len(engines)) + (i - (len(labels) - 1) / 2) * width
        ax.bar(x, s["saved_pct"], width, label=lab, color=series_palette(labels)[lab])
        err = np.array([s["saved_pct"] - s["saved_ci_low_pct"], s["saved_ci_high_pct"] - s["saved_pct"]])
        ax.errorbar(x, s["saved_pct"], yerr=np.nan_to_num(err), fmt="none", ecolor="black", lw=0.8)
    ax.set_xticks(np.arange(len(engines)), engines, rotation=30, ha="right")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_title(w)
    ax.set_ylabel(f"share {target} saves (%)")
axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
if len(checks):  # the correctness runs as a table panel: no times, so no bars beside the GPU results
    for ax in axes[1]:
        ax.axis("off")
    cells = [[r["series"], r["workload"], r["engine"], f"{r['completed']}/{r['sessions']}",
              "–" if pd.isna(r["forced_checked"]) else f"{r['forced_match']:.0f}/{r['forced_checked']:.0f}",
              "–" if pd.isna(r["foreign_load_sessions"]) else
              ("unknown" if r["load_unknown_sessions"] == r["sessions"] else f"{r['foreign_load_sessions']:.0f}/{r['sessions']}")]
             for _, r in checks.iterrows()]
    panel = fig.add_subplot(n_rows, 1, n_rows)
    panel.axis("off")
    grid = panel.table(cellText=cells, colLabels=["correctness run (CPU-only)", "workload", "engine",
                                                  "sessions completed", "forced tokens matched",
                                                  "sessions under foreign load"], loc="upper center", cellLoc="left")
    grid.auto_set_font_size(False)
    grid.set_fontsize(7)
    grid.auto_set_column_width(list(range(6)))
    panel.set_title("CPU-only replays: a correctness run, not a speed measurement (no bars beside GPU results)",
                    fontsize=9)
fig.tight_layout()
nb.save_figure(fig)
