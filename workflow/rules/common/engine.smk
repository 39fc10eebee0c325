# Helpers of stage engine (its rules: workflow/rules/engine.smk).
from ostinato.engine.patches import STAGES, stage_inputs

PIPELINE_VARIANTS = [v for v in STAGES if v in {"stock", "ostinato"} | {
    e["variant"] for e in config["replay"]["engines"].values() if e.get("variant")}]
