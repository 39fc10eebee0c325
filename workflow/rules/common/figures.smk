# Helpers of stage figures (its rules: workflow/rules/figures.smk).
RESULT_NOTEBOOKS = ["table3", "fig1", "table7", "fig4", "fig5", "fig6", "table8", "table4"]
REFERENCE_RUNS = {"table8": "reference_ablation_runs", "table4": "reference_qwen_runs"}  # else reference_runs


def result_sources(result):
    """The measured, simulated and reference inputs of one result notebook (Table 4: Qwen3-MoE series only, with the
    shipped Qwen3 replays; Table 8: the shipped ablation runs, which add the native-prefill engine)."""
    qwen = result == "table4"
    measured = [] if qwen and replay_arch() != "qwen3moe" else ["results/replay/sessions.csv"]
    sims = [] if qwen and not SIM["model"].startswith("qwen") else SIM["sets"]
    return {"measured_sessions": measured, "measured_requests": [p.replace("sessions.csv", "requests.csv") for p in measured],
            "sim_sessions": [f"results/sim/{s}/sessions.csv" for s in sims],
            "sim_requests": [f"results/sim/{s}/requests.csv" for s in sims],
            "reference_runs": FIGURES[REFERENCE_RUNS.get(result, "reference_runs")],
            "heldout_runs": [] if qwen else FIGURES["reference_heldout_runs"]}


def result_inputs(result):
    """Files a result notebook reads (its sources' CSVs)."""
    src = result_sources(result)
    refs = [f"{d}/{f}" for d in src["reference_runs"] + src["heldout_runs"] for f in ("sessions.csv", "requests.csv")]
    return src["measured_sessions"] + src["measured_requests"] + src["sim_sessions"] + src["sim_requests"] + refs


def result_params(result):
    """`ostinato figures params` options of one result notebook: its stem, and its `params` mapping
    (`ostinato.figures.notebook.ResultParams`)."""
    src = result_sources(result)
    params = [f"--param '{k}={yaml_list(v)}'" for k, v in src.items()]
    return " ".join([f"--set output_stem={result}"] + params + [
        f"--param profile={SIM['profile']}", f"--param 'reference_machine={FIGURES['reference_machine']}'",
        f"--param target={FIGURES['target']}", "--param figures_dir=figures --param tables_dir=tables"])


def predicted_sources():
    """(fit, sweep directory, machine label) of each machine the predicted-against-measured notebook shows."""
    out = [("results/calibrate/fit.json", "results/sweep", "")] if CALIBRATE and SWEEP else []
    if FIGURES["reference_fit"] and FIGURES["reference_sweep"]:
        out.append((FIGURES["reference_fit"], FIGURES["reference_sweep"],
                    f"{FIGURES['reference_machine'] or 'reference'}, reference"))
    return out


def figures_targets():
    """The result notebooks' figures and tables, and predicted against measured (to add to `rule all`)."""
    out = [f for r in RESULT_NOTEBOOKS for f in notebook_outputs(r).values()]
    return out + (list(notebook_outputs("predicted").values()) if predicted_sources() else [])
