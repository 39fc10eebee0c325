# Helpers of stage artifact (its rules: workflow/rules/artifact.smk): the verdict's inputs, the local-agent check and
# the report's sections.
from ostinato.artifact.checks import load_claims
from ostinato.presets import preset

ARTIFACT_CLAIMS = "artifact/claims.yaml"
ARTIFACT_SCHEMA = "artifact/claims.schema.json"
# `make test` writes the test suite's outcome here; the verdict reads it when it exists (the tests of A2, A3, ...)
ARTIFACT_TESTS = "results/artifact/pytest.xml"
# The local-agent check needs the replayed model's plan (the `ostinato` engine serves with it).
AGENT_CHECK = bool(REPLAY_RESIDENCY) and "ostinato" in PIPELINE_VARIANTS

# The report (`snakemake --report report.html`): its categories sort by name, so the verdict comes first, then the
# paper's sections in order, then the artifact's own checks. result -> (category, subcategory) of its figure and
# tables; every caption is workflow/report/<result>.rst (render_result's: result.rst, by wildcard).
REPORT_VERDICT = "Claims: the verdict"
REPORT_SECTIONS = {
    "routing_stats": ("Section 2.3: routing of agent sessions", "Routing facts"),
    "calibrate": ("Section 3.2: cost model and calibration", "Calibration"),
    "predicted": ("Section 3.2: cost model and calibration", "Predicted against measured"),
    "table2": ("Section 4.1: workloads", "Table 2"),
    "table3": ("Section 4.2: main results", "Table 3"),
    "fig1": ("Section 4.2: main results", "Figure 1"),
    "fig4": ("Section 4.2: main results", "Figure 4"),
    "table7": ("Section 4.3: waiting after tool calls", "Table 7"),
    "fig5": ("Section 4.3: waiting after tool calls", "Figure 5"),
    "fig6": ("Section 4.3: waiting after tool calls", "Figure 6"),
    "fig7b": ("Section 4.4: input length", "Figure 7b"),
    "table8": ("Section 4.5: ablation", "Table 8 and Figure 8"),
    "table4": ("Section 4.6: Qwen3-235B-A22B", "Table 4"),
    "sim_validation": ("The artifact's own checks", "The simulator against the paper"),
    "replay_summary": ("The artifact's own checks", "The replay's summary"),
}


def reported(path, result):
    """`path` flagged for the report in `result`'s section, with its caption (workflow/report/<result>.rst)."""
    category, subcategory = REPORT_SECTIONS[result]
    return report(path, caption=f"../report/{result}.rst", category=category, subcategory=subcategory)


def reported_notebook_outputs(stem):
    """A notebook's outputs (`notebook_outputs`) with its figure (PNG) and table (CSV) flagged for the report."""
    out = notebook_outputs(stem)
    return {**out, "png": reported(out["png"], stem), "csv": reported(out["csv"], stem)}


def result_section(index):
    """The report's category (index 0) or subcategory (1) of render_result's `{result}`."""
    return lambda wildcards: REPORT_SECTIONS[wildcards.result][index]


def stage_targets():
    """Every other stage's targets of `rule all`, which the verdict is made after."""
    return (sessions_targets() + routing_targets() + residency_targets() + costmodel_targets() + sim_targets()
            + replay_targets() + calibrate_targets() + sweep_targets() + figures_targets())


def claims_inputs(wildcards):
    """What the verdict reads: the pipeline's outputs, the result files the claims' checks read that no target
    names, the local-agent check, and the test suite's outcome when `make test` has written it."""
    out = stage_targets() + ["results/replay/requests.csv"]
    out += ["results/sweep/summary.json"] if SWEEP else []
    out += ["results/calibrate/fit.json"] if CALIBRATE else []
    out += ["results/artifact/local_agent.json"] if AGENT_CHECK else []
    return out + ([ARTIFACT_TESTS] if Path(ARTIFACT_TESTS).is_file() else [])


def agent_server_args():
    """`ostinato artifact agent` options of the replay's `ostinato` engine: its preset's flags (every layer on the
    GPU, Np, its decode design) but the plan, which the check passes itself, and its own server arguments."""
    e = REPLAY["engines"].get("ostinato", {})
    args = list(preset(e.get("preset", "ostinato"), None, plan="-", upload_min=REPLAY_RESIDENCY["upload_min"]).server_args)
    if "--residency-plan" in args:
        i = args.index("--residency-plan")
        args = args[:i] + args[i + 2:]
    args += list(e.get("server_args", []))
    return " ".join(f"--server-arg={a}" for a in args)


def artifact_targets():
    """The verdict's tables (to add to `rule all`)."""
    return ["tables/claims.csv", "tables/claims.md", "results/artifact/claims.html"]


def check_artifact_config():
    """Fail early, naming the file and key, if the claims file breaks its schema."""
    load_claims(Path(ARTIFACT_CLAIMS), Path(ARTIFACT_SCHEMA))


check_artifact_config()
