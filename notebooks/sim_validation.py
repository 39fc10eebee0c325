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
# # Simulator validation: the engine policies' cost model beside the paper's Tables 3, 7 and 8
#
# Reads the simulator's per-request and per-session tables (`ostinato sim run`, rule `simulate`: each trace set
# replayed through the cost model of every engine policy on one machine profile) and puts them beside the
# paper's numbers (`data/paper/table3_heldout.csv`, `table7_ttft_by_kind.csv`, `table8_ablation.csv`), with the
# cost model's own checks of the paper's derivations (`ostinato costmodel check`). Writes
# `tables/<stem>.{csv,md}`, `tables/<stem>_ablation.{csv,md}`, `tables/<stem>_checks.{csv,md}`,
# `tables/<stem>_fig7a.{csv,md}` (Figure 7a: the change of median TTFT of tool turns by new tokens),
# `tables/<stem>_limit.{csv,md}` (each engine's decode time as a multiple of the computed limit of seed 004:
# Belady's MIN with bypass on the same routing, `ostinato limit`) and `figures/<stem>.{pdf,png}`. Series are
# labelled `paper` and `simulated (<profile>)`.
#
# **What is compared, and what is anchored on the paper.** Absolute session totals depend on how many sessions
# and turns are simulated, so the tables compare each engine's total *relative to Ostinato's* on the same sessions
# (the paper's saved share, Table 3), the median TTFT of tool-output turns (Table 7) and the median time per
# output token. The profile's constants (the paper's calibration, Section 3.2 and Appendix B) and the routing
# facts that calibrate the synthetic traces go in, and the remaining constants
# (`ostinato.sim.params.paper_illustrative`) are taken from two of the paper's own results: the non-expert decode
# time is Ostinato's Table 8c SWE step (25.63 ms) less Eq. (1), so Ostinato's simulated decode is anchored on
# the paper's; and the CPU and GPU costs per route come from Figure 7b's slopes (buun's all-CPU 6.0 and Ostinato's
# split path 3.2 ms per new token), so the Figure 7a comparison reuses Ostinato's own slope. What these tables
# test is the other engines and the ratios the constants do not fix directly, not Ostinato's absolute times.
#
# **Known differences.** The default pipeline simulates synthetic sessions (shapes drawn by the routing
# generator for the workload, `routing.synthetic`), not the paper's 13 SWE and 60 τ2 held-out sessions, and a
# single session per set: expect the engines' order and the rough size of the gaps, not the paper's totals.
# The simulator models KTransformers only by its static uniform per-layer placement (`ktransformers-placement`), not its
# kernels, and has no model of ik_llama.cpp or FreeToken. Ostinato's simulated decode is the overlapped
# two-branch step of Eq. (1) without the decode-graph, affinity and borrowed-memory steps of Table 8c.

# %% tags=["parameters"]
sim_sessions = ["results/sim/synthetic-swe-heldout/sessions.csv"]
sim_requests = ["results/sim/synthetic-swe-heldout/requests.csv"]
limit_json = ["results/limit/synthetic-swe-heldout.json"]  # [] = no limit table
sim_sets = ["synthetic-swe-heldout"]
workloads = ["SWE"]  # the paper's workload each simulated set stands for (SWE | tau2)
profile = "paper-4x4090d"
checks_json = "results/costmodel/checks-paper-4x4090d.json"  # "" = no checks table
table3_csv = "data/paper/table3_heldout.csv"
table7_csv = "data/paper/table7_ttft_by_kind.csv"
table8_csv = "data/paper/table8_ablation.csv"
figure7_csv = "data/paper/figure7.csv"
figures_dir = "figures"
tables_dir = "tables"
output_stem = "sim_validation"

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ostinato.figures import apply_style, save_figure, save_table
from ostinato.series import series_label
from ostinato.sim import validation as V

apply_style()
for name, path in (("table3_csv", table3_csv), ("table7_csv", table7_csv), ("table8_csv", table8_csv),
                   ("figure7_csv", figure7_csv)):
    if not Path(path).is_file():
        raise FileNotFoundError(f"{name}: {path} not found")
ses, req = V.load_simulated(sim_sessions, sim_requests, sim_sets, workloads)
SIM, PAPER = series_label("simulated", profile), V.PAPER
t3, t7, t8, f7 = (pd.read_csv(p) for p in (table3_csv, table7_csv, table8_csv, figure7_csv))
print(SIM, {s: int(ses[ses["set"] == s]["session"].nunique()) for s in sim_sets},
      "policies:", list(ses["engine"].unique()))

# %% [markdown]
# ## Table 3 and Table 7: engines relative to Ostinato
# `total_rel` = the engine's summed request time over Ostinato's on the same sessions (paper: held-out sessions,
# four GPUs); `ttft_tool_s` = median TTFT of tool-output turns; `tpot_ms` = median time per output token.

# %%
table = V.relative_to_ostinato(ses, req, t3, t7, profile)
saved = save_table(table, Path(tables_dir) / output_stem, floatfmt=".3g")
print("wrote", *saved)
order = lambda df: df.sort_values("total_rel")["engine"].tolist()  # noqa: E731
for w in workloads:
    tw = table[table["workload"] == w]
    print(f"{w}: order by total, paper: {order(tw[tw['series'] == PAPER])}")
    print(f"{w}: order by total, {SIM}: {order(tw[tw['series'] == SIM])}")
table

# %% [markdown]
# ## Why the simulated tool-turn TTFTs are about 0.6× of the paper's
# The synthetic tool outputs are not the cause: their median is close to the paper's. The simulator's prefill
# model is Figure 7b's *slopes*; Figure 7b's lines also have an intercept, TTFT(128) − 128 × slope, a fixed part of
# every request after a long prefix (0.5 s for Ostinato, 0.9 s for buun), which the simulator leaves out. Adding
# each engine's intercept to its simulated median brings it to the paper's within a few percent; Figure 7b gives
# no line for the other engines.

# %%
intercepts = V.fig7b_intercepts(f7)
tool_turns = req[(req["kind"] == "tool") & (req["engine"] == "ostinato")]
print(f"median new tokens of simulated tool turns: {tool_turns['n_new'].median():.0f}")
sim_tool = table[table["series"] == SIM].set_index(["workload", "engine"])["ttft_tool_s"]
pap_tool = table[table["series"] == PAPER].set_index(["workload", "engine"])["ttft_tool_s"]
intercepts["simulated_ttft_tool_s"] = [sim_tool.get(("SWE", e), np.nan) for e in intercepts["engine"]]
intercepts["paper_ttft_tool_s"] = [pap_tool.get(("SWE", e), np.nan) for e in intercepts["engine"]]
intercepts["simulated_vs_paper"] = intercepts["simulated_ttft_tool_s"] / intercepts["paper_ttft_tool_s"]
intercepts["with_intercept_vs_paper"] = ((intercepts["simulated_ttft_tool_s"] + intercepts["intercept_s"])
                                         / intercepts["paper_ttft_tool_s"])
print("wrote", *save_table(intercepts, Path(tables_dir) / f"{output_stem}_tool_ttft", floatfmt=".3g"))
intercepts

# %% [markdown]
# ## Table 8b: the ablation steps
# The paper's SWE held-out ablation (total relative to step 1, layer placement) beside the simulator's policies
# that model each step: 1 `llama.cpp-layers`, 2 `llama.cpp-expert-cache`, 3 `ostinato-native-prefill` (resident experts,
# native prefill, branches in turn), 4 `ostinato-native-prefill-overlap` (+ overlapped branches), 5 `ostinato` (+ prefill paths).
# The paper's steps 3 and 4 hold 4,864 experts and step 5 holds 5,702; the simulator uses the plan's pool for all.

# %%
ablation = V.ablation_steps(ses, t8)
print("wrote", *save_table(ablation, Path(tables_dir) / f"{output_stem}_ablation", floatfmt=".3g"))
ablation

# %% [markdown]
# ## Figure 7a: median TTFT of tool turns by new tokens
# Ostinato's median TTFT change against layer placement and against the expert caches (the paper's "expert
# caches": llama.cpp's expert cache and buun), per bin of new tokens, beside the paper's ranges (Figure 7a;
# below 512 tokens it gives one range over the bins <128, 128–255 and 256–511). Figure 7b (a sweep after fixed
# prefixes) and 7c (cold routes per token, `tables/routing_stats.md`) are not simulated here.

# %%
fig7a = V.fig7a_changes(req, f7)
print("wrote", *save_table(fig7a, Path(tables_dir) / f"{output_stem}_fig7a", floatfmt=".3g"))
fig7a

# %% [markdown]
# ## The paper's own model checks
# Recomputed from the profile's constants by `ostinato costmodel check` (among them: the pool growth from
# 4,864 to 5,702 experts predicted at 2.24 ms per step against 2.25 measured, and the overlap hiding 86.9% of U).

# %%
if checks_json and Path(checks_json).is_file():
    checks = pd.DataFrame(json.loads(Path(checks_json).read_text())["checks"])
    print("wrote", *save_table(checks, Path(tables_dir) / f"{output_stem}_checks", floatfmt=".4g"))
    print(f"{int(checks['ok'].sum())}/{len(checks)} checks within tolerance")
else:
    checks = pd.DataFrame()
    print(f"checks_json: {checks_json!r} not given or missing; no checks table")
checks

# %% [markdown]
# ## Decode against the computed limit (seed 004)
# Per session: the fewest host expert reads any cache of the plan's size could make on the decode positions
# (Belady's MIN with bypass, starting from the plan's experts; `reads_once`: MIN's set read once) at the host
# read rate, plus the simulator's non-expert step time: a lower bound on time per output token. Each simulated
# engine's decode time per output token over that session is reported as a multiple of it; `min_read_twice` is
# the oracle variant whose admitted misses are read twice (by the CPU and by the copy).

# %%
limits = V.decode_against_limit({s: json.loads(Path(p).read_text()) for p, s in zip(limit_json, sim_sets)}, req)
if len(limits):
    print("wrote", *save_table(limits, Path(tables_dir) / f"{output_stem}_limit", floatfmt=".3g"))
limits

# %% [markdown]
# ## Figure
# (a) total request time relative to Ostinato; (b) median TTFT of tool-output turns; (c) the ablation steps
# relative to layer placement (paper bars hatched, simulated bars solid); (d) Figure 7a: Ostinato's median
# TTFT change by new tokens (the paper's ranges as bands, simulated as markers).

# %%
fig, axes = plt.subplots(1, 4, figsize=(18.0, 3.8))
engines = [e for e in V.PAPER_ENGINE.values() if e in set(table["engine"])]
for ax, col, title in ((axes[0], "total_rel", "(a) total time / Ostinato"),
                       (axes[1], "ttft_tool_s", "(b) median TTFT, tool turns (s)")):
    x = np.arange(len(engines))
    width = 0.8 / (2 * len(workloads))
    for i, w in enumerate(workloads):
        for j, (series, hatch) in enumerate(((PAPER, "//"), (SIM, None))):
            sub = table[(table["workload"] == w) & (table["series"] == series)].set_index("engine")
            vals = [sub[col].get(e, np.nan) for e in engines]
            ax.bar(x + (2 * i + j - len(workloads) + 0.5) * width, vals, width, hatch=hatch, edgecolor="k",
                   label=f"{w}, {series}")
    ax.set_xticks(x, engines, rotation=30, ha="right")
    ax.set_title(title)
axes[0].axhline(1.0, color="k", linewidth=0.6)
axes[0].legend(fontsize="x-small")
ax = axes[2]
x = np.arange(len(ablation))
ax.bar(x - 0.2, ablation["paper_rel_step1"], 0.4, hatch="//", edgecolor="k", label=f"SWE, {PAPER}")
ax.bar(x + 0.2, ablation["simulated_rel_step1"], 0.4, edgecolor="k", label=f"SWE, {SIM}")
ax.set_xticks(x, [f"{s}: {p}" for s, p in zip(ablation["step"], ablation["policy"])], rotation=30, ha="right")
ax.set_title("(c) Table 8b steps, total / step 1")
ax.legend(fontsize="x-small")
ax = axes[3]
labels = [b[2] for b in V.NEW_TOKEN_BINS]
x = np.arange(len(labels))
for i, (sim_ref, marker) in enumerate((("llama.cpp-layers", "o"), ("llama.cpp-expert-cache", "^"), ("buun", "v"))):
    sub = fig7a[fig7a["simulated_reference"] == sim_ref].set_index("new_tokens").reindex(labels)
    off = (i - 1) * 0.2
    lo, hi = sub["paper_change_low_pct"].to_numpy(), sub["paper_change_high_pct"].to_numpy()
    ax.vlines(x + off, lo, hi, color=f"C{i}", linewidth=5, alpha=0.35,
              label=f"vs {sub['reference'].iloc[0]}, {PAPER}" if sim_ref != "buun" else None)
    ax.plot(x + off, lo, marker="_", markersize=12, linestyle="none", color=f"C{i}", alpha=0.6)  # single values
    ax.plot(x + off, sub["simulated_change_pct"], marker=marker, linestyle="none", color=f"C{i}",
            label=f"vs {sim_ref}, {SIM}")
ax.axhline(0, color="k", linewidth=0.6)
ax.set_xticks(x, labels, rotation=30, ha="right")
ax.set_xlabel("new tokens")
ax.set_title("(d) Figure 7a: Ostinato's median TTFT change (%)")
ax.legend(fontsize="xx-small")
fig.suptitle(f"Simulator ({SIM}) vs paper")
fig.tight_layout()
print("wrote", *save_figure(fig, Path(figures_dir) / output_stem))
