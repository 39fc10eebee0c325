# Helpers of stage engine (its rules: workflow/rules/engine.smk).
from ostinato.engine.patches import STAGES, stage_inputs

PIPELINE_VARIANTS = [v for v in STAGES if v in {"stock", "ostinato"} | {
    e["variant"] for e in config["replay"]["engines"].values() if e.get("variant")}]

# The GPU a job of the CUDA build runs on (the rules that build the engine or start its servers): a cluster executor
# asks the scheduler for it (workflow/profiles/slurm: `--gpus=1`); a local run has no `gpu` limit and ignores it. The
# CPU build asks for none, so the default config runs on CPU-only nodes.
ENGINE_GPU = {"gpu": 1} if BACKEND.name == "cuda" else {}
