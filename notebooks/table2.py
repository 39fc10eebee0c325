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
# # Table 2: workloads (sessions, turns, output tokens, median new tokens)
#
# Reads the per-turn tables (`data/sessions/<source>.turns.csv`: numbers derived from public traces by
# `ostinato sessions tables`) and the split file (`ostinato sessions split`), and puts each set's
# statistics beside the paper's (`data/paper/table2.csv`, from REFERENCE.md Table 2). Writes
# `tables/table2.{csv,md}` and `figures/table2.{pdf,png}`; series are labelled `paper` and
# `derived (<sources>; <tokenizer>)`.
#
# **Known difference.** The paper's SWE sessions are OpenHands on SWE-rebench
# (`nebius/SWE-rebench-openhands-trajectories`); the SWE traces here are mini-swe-agent (bash only) on
# SWE-bench Verified, whose observations are shorter, so the median new tokens per SWE turn is about a
# third of the paper's while turns per session and output tokens are close. The τ2 traces come from
# tau2-bench leaderboard submissions by other agents than the paper's, so their lengths differ too.
# Output tokens prefer the traces' recorded completion counts (the agent model's tokenizer, reasoning
# included) and fall back to the text's tokens in the chosen tokenizer; new tokens are the tokens of the
# messages since the previous reply in that tokenizer's chat template (the paper's "after KV reuse").

# %% tags=["parameters"]
swe_table = "data/sessions/swe-mini.turns.csv"
tau2_table = "data/sessions/tau2.turns.csv"
splits = "data/sessions/splits.json"
paper_csv = "data/paper/table2.csv"
tokenizer = "deepseek"  # deepseek | qwen: which counts of the tables
output_count = "recorded"  # recorded (trace's completion tokens where present) | text
figures_dir = "figures"
tables_dir = "tables"
output_stem = "table2"

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ostinato.figures import apply_style, save_figure, save_table
from ostinato.figures.style import SERIES_MARKERS
from ostinato.sessions.splits import read_splits
from ostinato.sessions.stats import set_stats, set_turns
from ostinato.sessions.tables import read_table

apply_style()

for name, path in (("swe_table", swe_table), ("tau2_table", tau2_table), ("splits", splits), ("paper_csv", paper_csv)):
    if not Path(path).is_file():
        raise FileNotFoundError(f"{name}: {path} not found")
sets = read_splits(splits)
tables = {sets["swe-dev"].source: read_table(swe_table), "tau2": read_table(tau2_table)}
paper = pd.read_csv(paper_csv)
sources = ", ".join(sorted(tables))
derived = f"derived ({sources}; {tokenizer})"
prefer = output_count == "recorded"
turns = {name: set_turns(tables[s.source], s, tokenizer, prefer) for name, s in sets.items()}
print(derived, {n: len(t) for n, t in turns.items()})

# %% [markdown]
# ## Table
# Per set, the paper's row and the derived row; `ratio` = derived / paper for each number.

# %%
rows = []
for _, p in paper.iterrows():
    name = p["set"]
    st = set_stats(name, turns[name]) if name in turns else None
    rows.append({"set": name, "series": "paper", "sessions": int(p["sessions"]), "turns": int(p["turns"]),
                 "output_tokens": int(p["output_tokens"]), "median_new_tokens": float(p["median_new_tokens"])})
    if st is not None:
        rows.append({"set": name, "series": derived, "sessions": st.sessions, "turns": st.turns,
                     "output_tokens": st.output_tokens, "median_new_tokens": st.median_new})
table = pd.DataFrame(rows)
table["ratio_turns"] = np.nan
table["ratio_output"] = np.nan
table["ratio_median_new"] = np.nan
for name in table["set"].unique():
    sel = table["set"] == name
    if sel.sum() == 2:
        pp, dd = table[sel].iloc[0], table[sel].iloc[1]
        idx = table[sel].index[1]
        table.loc[idx, "ratio_turns"] = dd["turns"] / pp["turns"]
        table.loc[idx, "ratio_output"] = dd["output_tokens"] / pp["output_tokens"]
        table.loc[idx, "ratio_median_new"] = dd["median_new_tokens"] / pp["median_new_tokens"]
saved = save_table(table, Path(tables_dir) / output_stem, floatfmt=".4g")
print("wrote", *saved)
swe = pd.concat([turns[n] for n in ("swe-dev", "swe-heldout") if n in turns])
print(f"SWE turns prefilling < 512 new tokens: {(swe['new'] < 512).mean():.1%} (paper: three quarters)")
held = turns.get("swe-heldout")
if held is not None:
    per = held.groupby("session").size()
    print(f"held-out SWE requests per session: {per.min()}–{per.max()} (paper: 42–100)")
table

# %% [markdown]
# ## Figure
# (a) median new tokens per turn, paper vs derived; (b, c) distributions (ECDF) of new and output tokens
# per turn of the derived sets, the paper's medians marked on (b).

# %%
order = [n for n in paper["set"] if n in turns]
colors = dict(zip(order, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
fig, axes = plt.subplots(1, 3, figsize=(13.0, 3.6))
ax = axes[0]
x = np.arange(len(order))
pap = paper.set_index("set").loc[order, "median_new_tokens"].to_numpy()
der = [set_stats(n, turns[n]).median_new for n in order]
ax.bar(x - 0.2, pap, 0.4, label="paper", color="#bbbbbb", edgecolor="k", hatch="//")
ax.bar(x + 0.2, der, 0.4, label=derived, color=[colors[n] for n in order])
ax.set_xticks(x, order, rotation=30, ha="right")
ax.set_ylabel("median new tokens per turn")
ax.set_title("(a) median new tokens")
ax.set_ylim(0, 1.35 * max(max(pap), max(der)))
ax.legend(loc="upper right", fontsize="small")
for ax, col, title in ((axes[1], "new", "(b) new tokens per turn"), (axes[2], "output", "(c) output tokens per turn")):
    for n in order:
        v = np.sort(turns[n][col].to_numpy())
        if len(v):
            ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", color=colors[n], label=f"{n}, {derived}")
        if col == "new":
            med = float(paper.set_index("set").loc[n, "median_new_tokens"])
            ax.plot([med], [0.5], marker=SERIES_MARKERS["paper"], color=colors[n], linestyle="none",
                    label=f"{n}, paper median")
    ax.set_xscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("share of turns")
    ax.set_title(title)
axes[1].axvline(512, color="k", linewidth=0.6, linestyle=":")
handles, labels = axes[1].get_legend_handles_labels()
axes[2].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="x-small")
fig.suptitle(f"Table 2 workloads: paper vs {derived}")
fig.tight_layout()
figs = save_figure(fig, Path(figures_dir) / output_stem)
print("wrote", *figs)
print(json.dumps({n: {"sessions": len(s.sessions), "max_requests": s.max_requests, **s.domains} for n, s in sets.items()}))
