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
# # Routing facts (Section 2.3): paper vs this artifact's traces
#
# Reads the JSON files of `ostinato routing stats` (one per trace set: synthetic traces from
# `ostinato routing generate`, or traces the engine recorded from a real model) and prints, per routing
# fact of REFERENCE.md, the paper's value, the accepted range and each trace set's value. With real
# weights and recorded traces this gives the paper's Section 2.3 numbers for your model.
# Series: `paper`, `simulated (generator/<profile>)` for synthetic traces, `measured (<machine>)` for
# recorded ones. Writes `tables/routing_stats.{csv,md}` and `figures/routing_stats.{pdf,png}`.
# With no stats file at hand it generates a small V4-Flash-shaped set itself (so it runs alone).

# %% tags=["parameters"]
stats_json = []  # paths of `ostinato routing stats --out` files; empty: compute a small synthetic demo here
figures_dir = "figures"
tables_dir = "tables"
output_stem = "routing_stats"
demo_model = "deepseek-v4-flash"  # shape of the in-notebook demo (only when stats_json is empty)
demo_sessions = 1  # synthetic SWE-like sessions per split in the demo (~50K positions each)
demo_seed = 0

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ostinato.figures import apply_style, save_figure, save_table
from ostinato.figures.style import SERIES_MARKERS, series_label
from ostinato.routing.generator import session_trace
from ostinato.routing.layout import synthetic_layouts
from ostinato.routing.shapes import get_shape
from ostinato.routing.stats import SessionTrace, routing_facts

apply_style()

paths = [stats_json] if isinstance(stats_json, str) else list(stats_json)
results = []
for p in paths:
    if not Path(p).is_file():
        raise FileNotFoundError(f"stats_json: {p} not found (expected `ostinato routing stats --out` JSON)")
    results.append(json.loads(Path(p).read_text()))
if not results:
    shape = get_shape(demo_model)
    def _traces(seed):
        return [SessionTrace(lay.session, session_trace(shape, lay, seed=demo_seed), lay)
                for lay in synthetic_layouts("swe", demo_sessions, seed=seed)]
    facts = routing_facts(_traces(1), _traces(2))
    results.append(dict(facts.to_json(), label=series_label("simulated", "generator/calibrated")))
print(f"{len(results)} trace set(s):", *[r["label"] for r in results], sep="\n  ")

# %% [markdown]
# ## Target vs achieved
# One row per routing fact and trace set: the paper's value, the range the generator is held to, and the
# value of the traces (`ok` when inside the range).

# %%
rows = []
for r in results:
    for t in r["targets"]:
        rows.append({"target": t["name"], "series": r["label"], "paper": t["paper"], "lo": t["lo"], "hi": t["hi"],
                     "value": t["value"], "ok": t["ok"], "description": t["description"]})
table = pd.DataFrame(rows)
saved = save_table(table, Path(tables_dir) / output_stem, floatfmt=".4g")
print("wrote", *saved)
for _, row in table.iterrows():
    print(f"{row.target:26s} paper {row.paper:8.3f}  [{row.lo:.3f}, {row.hi:.3f}]  {row.series}: "
          f"{row.value:8.3f}  {'ok' if row.ok else 'OUTSIDE'}")
table

# %% [markdown]
# ## Figure
# (a) held-out routes on the top 44% of experts; (b) cold routes per token and layer in prefills of
# 128–511 new tokens by prefill size; (c) distinct cold experts a 2,048-token pass touches; (d) per layer,
# the probability that a decode step has a cold route. Dotted: the paper; shaded: the accepted range.

# %%
fig, axes = plt.subplots(1, 4, figsize=(14.0, 3.4))
colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
targets = {t["name"]: t for t in results[0]["targets"]}


def _paper(ax, name):
    t = targets[name]
    ax.axhspan(t["lo"], t["hi"], color="0.85", zorder=0)
    ax.axhline(t["paper"], color="k", linestyle=":", label=series_label("paper"))


ax = axes[0]
_paper(ax, "coverage_top44")
for i, r in enumerate(results):
    ax.plot([i], [r["coverage_top44"]], SERIES_MARKERS["simulated" if r["label"].startswith("simulated") else
                                                      "measured"], color=colors[i % len(colors)], label=r["label"])
ax.set_xticks([])
ax.set_ylabel("share of held-out routes")
ax.set_title(f"(a) top {results[0]['n_resident_decode']} experts")

ax = axes[1]
_paper(ax, "prefill_cold_per_token")
for i, r in enumerate(results):
    if r["prefill_cold"]:
        n, v = np.array(r["prefill_cold"]).T
        ax.scatter(n, v, s=10, color=colors[i % len(colors)], label=r["label"])
ax.set_xlabel("new tokens of the prefill")
ax.set_ylabel("cold routes per token and layer")
ax.set_title(f"(b) short prefills, {results[0]['n_resident_prefill']} resident")

ax = axes[2]
_paper(ax, "pass2048_distinct_cold")
for i, r in enumerate(results):
    vals = r["pass_distinct_cold"]
    if vals:
        ax.plot(np.full(len(vals), i), vals, "o", color=colors[i % len(colors)], alpha=0.6, label=r["label"])
ax.set_xticks([])
ax.set_ylabel("distinct cold experts per layer")
ax.set_title(f"(c) 2,048-token passes (of {results[0]['cold_per_layer']:.0f} cold)")

ax = axes[3]
_paper(ax, "decode_any_cold")
for i, r in enumerate(results):
    ax.plot(np.arange(len(r["decode_q"])), r["decode_q"], "-", color=colors[i % len(colors)], label=r["label"])
ax.set_xlabel("MoE layer")
ax.set_ylabel("P(decode step has a cold route)")
ax.set_title(f"(d) decode, {results[0]['n_resident_decode']} resident")
handles, labels = axes[3].get_legend_handles_labels()
fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1.08), ncol=len(labels), frameon=False)
fig.tight_layout()
figs = save_figure(fig, Path(figures_dir) / output_stem)
print("wrote", *figs)
