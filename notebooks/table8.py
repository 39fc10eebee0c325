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
# # Table 8 and Figure 8: the ablation
#
# The paper's ablation on its held-out SWE sessions (Table 8b: layer placement, the expert cache, resident
# experts with native prefill, + overlapped branches, + 5,702 experts and the prefill paths, and the full decode
# path) beside every series that has engines standing for its steps: the simulator's policies (`llama-layers` 1,
# `llama-expert-cache` 2, `resident-native-inturn` 3, `resident-native` 4, `ostinato` 5) and this run's replayed
# engines where their names are those steps (`llama.cpp-layers` 1, `ostinato-native-prefill` 3: resident experts
# with llama.cpp's native prefill, its two branches in turn; `ostinato` 5; the engine has no expert cache and no
# overlapped branches, steps 2 and 4). Each step's total, prefill and decode time relative to step 1 of its own
# series. Then what the size-dependent prefill paths change on their own (the paper's screening panel, steps 3 → 4:
# prefill −47% with decode unchanged) for every series that has both configurations. The paper's screening panel
# (a) and decode-step panel (c) are listed as the paper gives them. Writes `tables/<stem>.{csv,md}` (panel b),
# `tables/<stem>_prefill_paths.{csv,md}`, `tables/<stem>_paper_ac.{csv,md}` and `figures/<stem>.{pdf,png}`.

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
reference_runs = ["data/reference/h200/ablation/run1", "data/reference/h200/ablation/run2",
                  "data/reference/h200/ablation/run3"]  # shipped ablation replays of another machine; [] = none
reference_machine = "h200"
output_stem = "table8"

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
compared = R.compare(runs, R.CompareOptions(target=target, n_resamples=n_resamples, seed=ci_seed))
table = pd.concat([R.paper_ablation(paper / "table8_ablation.csv", "b"), R.ablation(compared)], ignore_index=True)
print("wrote", *save_table(table, Path(tables_dir) / output_stem))
t8 = pd.read_csv(paper / "table8_ablation.csv")
print("wrote", *save_table(t8[t8["panel"].isin(["a", "c"])], Path(tables_dir) / f"{output_stem}_paper_ac"))
table

# %% [markdown]
# ## The prefill paths on their own (Table 8a, steps 3 → 4)
# The same resident experts with llama.cpp's native prefill against the split and upload paths: the change of
# prefill, decode and total time, and the share of total time the paths save with its 95% CI over sessions.

# %%
paths = R.prefill_paths(compared, paper / "table8_ablation.csv")
print("wrote", *save_table(paths, Path(tables_dir) / f"{output_stem}_prefill_paths"))
paths

# %% [markdown]
# ## Figure 8: prefill and decode per step, relative to layer placement
# Stacked bars: prefill (hatched) and decode time of each step over step 1's total, per series (SWE).

# %%
swe = table[(table["workload"] == "SWE") & table["prefill_s"].notna()]
labels = list(dict.fromkeys(swe["series"]))
fig, axes = plt.subplots(1, max(1, len(labels)), figsize=(4.4 * max(1, len(labels)), 3.6), squeeze=False, sharey=True)
for ax, lab in zip(axes[0], labels):
    d = swe[swe["series"] == lab].sort_values("step")
    base = d[d["step"] == 1]["total_s"]
    if base.empty:
        ax.set_title(f"{lab}\n(no step 1 in this series)")
        continue
    pre, dec = d["prefill_s"] / base.iloc[0], d["decode_s"] / base.iloc[0]
    col = series_palette(labels)[lab]
    ax.bar(d["step"].astype(str), pre, color=col, hatch="//", edgecolor="white", label="prefill")
    ax.bar(d["step"].astype(str), dec, bottom=pre, color=col, alpha=0.55, label="decode")
    ax.set_xlabel("ablation step")
    ax.set_title(lab)
axes[0][0].set_ylabel("time / step 1's total")
axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
fig.tight_layout()
print("wrote", *save_figure(fig, Path(figures_dir) / output_stem))
