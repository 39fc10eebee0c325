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
# path) beside every series that has engines standing for its steps: the simulator's policies (`llama.cpp-layers` 1,
# `llama.cpp-expert-cache` 2, `ostinato-native-prefill` 3, `ostinato-native-prefill-overlap` 4, `ostinato` 5) and this run's replayed
# engines where their names are those steps (`llama.cpp-layers` 1, `llama.cpp-expert-cache` 2: the expert cache's
# policy on this engine's pools, `ostinato-native-prefill` 3: resident experts with llama.cpp's native prefill, its
# two branches in turn, `ostinato-native-prefill-overlap` 4: the same with the branches overlapped through llama.cpp's
# scheduler, `ostinato` 5). Each step's total, prefill and decode time relative to step 1 of its own series. Then
# what the size-dependent prefill paths change on their own (the paper's screening panel, steps 3 → 4: prefill −47%
# with decode unchanged) for every series that has both configurations, and the decode steps of panel (c): the
# paper's beside the decode TPOT of the engine presets that stand for them in the shipped H200 sweeps (branches in
# turn, overlapped, and borrowed memory with the routes it computed per step; one graph per GPU, `ostinato-graph` and
# `ostinato-graph-borrow`, in the graph sweep) and in the H100's sweep of the borrowed experts inside the pool's own
# expert computation, each series labelled with its machine. The paper's screening panel (a) and
# panel (c) are also listed as the paper gives them. Writes `tables/<stem>.{csv,md}` (panel b),
# `tables/<stem>_prefill_paths.{csv,md}`, `tables/<stem>_decode_steps.{csv,md}`, `tables/<stem>_paper_ac.{csv,md}`
# and `figures/<stem>.{pdf,png}`.

# %% tags=["parameters"]
output_stem = "table8"
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
table = pd.concat([R.paper_ablation(paper / "table8_ablation.csv", "b"), R.ablation(compared)], ignore_index=True)
nb.save_table(table)
t8 = pd.read_csv(paper / "table8_ablation.csv")
nb.save_table(t8[t8["panel"].isin(["a", "c"])], "_paper_ac")
table

# %% [markdown]
# ## The prefill paths on their own (Table 8a, steps 3 → 4)
# The same resident experts with llama.cpp's native prefill against the split and upload paths: the change of
# prefill, decode and total time, and the share of total time the paths save with its 95% CI over sessions.

# %%
paths = R.prefill_paths(compared, paper / "table8_ablation.csv")
nb.save_table(paths, "_prefill_paths")
paths

# %% [markdown]
# ## Figure 8c: decode steps
# The paper's decode step per configuration (relative to its buun baseline) and, per sweep of `decode_sweeps`, the
# decode TPOT of the presets standing for a step after each prefix (relative to whole-layer placement, 95% interval
# over the sweep's rounds). Step 0 is this engine's in-turn order, a step before the paper's first.

# %%
import json

sweeps = {label: json.loads(Path(path).read_text()) for label, path in nb.params.decode_sweeps.items()}
steps8c = R.decode_steps(sweeps, paper / "table8_ablation.csv")
nb.save_table(steps8c, "_decode_steps")
steps8c

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
nb.save_figure(fig)
