# Ostinato artifact pipeline: see README.md and ARTIFACT.md. Rules live in workflow/rules/<stage>.smk.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/engine.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/sessions.smk"
include: "workflow/rules/routing.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/sim.smk"
include: "workflow/rules/replay.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/figures.smk"


rule all:
    input:
        all_targets(),
    default_target: True
