# Ostinato artifact pipeline: see README.md and ARTIFACT.md. Each stage's rules live in workflow/rules/<stage>.smk,
# named as its `ostinato <stage>` command group, its module `ostinato.<stage>` and its outputs `results/<stage>/`.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"  # snakemake --report report.html: the verdict first, then every result


# a config file leaves out an engine or a bitwise variant of the embedded default by setting it to null (config/README.md)
for mapping in (config["replay"]["engines"], config["replay"].get("bitwise", {}).get("variants") or {}):
    for key in [k for k, v in mapping.items() if v is None]:
        del mapping[key]
validate(config, "workflow/schemas/config.schema.yaml")  # also fills in every default the schema holds


include: "workflow/rules/common.smk"
include: "workflow/rules/engine.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/sessions.smk"
include: "workflow/rules/routing.smk"
include: "workflow/rules/residency.smk"
include: "workflow/rules/costmodel.smk"
include: "workflow/rules/sim.smk"
include: "workflow/rules/limit.smk"
include: "workflow/rules/replay.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/artifact.smk"


rule all:
    input:
        sessions_targets(),
        routing_targets(),
        residency_targets(),
        costmodel_targets(),
        sim_targets(),
        replay_targets(),
        calibrate_targets(),
        sweep_targets(),
        figures_targets(),
        artifact_targets(),
    default_target: True
