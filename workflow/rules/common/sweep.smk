# Helpers of stage sweep (its rules: workflow/rules/sweep.smk).
SWEEP = config.get("sweep")
REFERENCE_SWEEP = f"{FIGURES['reference_sweep']}/summary.json" if FIGURES["reference_sweep"] else ""


def sweep_opts():
    """`ostinato sweep` options from the `sweep` config section."""
    s = SWEEP
    prefixes = s["prefix"] if isinstance(s["prefix"], list) else [s["prefix"]]
    return (f"--engines {','.join(s['engines'])} --baseline {s['engines'][0]} --resident-share {s['resident_share']} "
            f"--upload-min {s['upload_min']} --prefix {','.join(str(p) for p in prefixes)} --sizes {','.join(str(n) for n in s['sizes'])} "
            f"--decode {s['decode']} --reps {s['reps']} --ctx {s['ctx']}"
            + "".join(f" --server-arg={shlex.quote(a)}" for a in s["server_args"])
            + "".join(f" --borrow-params {b}" for b in sweep_borrow()))


def sweep_borrow():
    """The borrowed memory's parameters that `tune_borrow` chose on the development sessions, for the sweep's presets with
    borrowed memory, as the replay's take them; none without such a preset or without `replay.residency` (then they
    run the engine's defaults)."""
    if not SWEEP or not REPLAY_RESIDENCY or not set(SWEEP["engines"]) & set(BORROW_PRESETS):
        return []
    return [f"results/residency/replay/{REPLAY_MODEL}.borrow.json"]


def sweep_targets():
    """Outputs of the Figure 7b notebook (to add to `rule all`); none without the `sweep` section."""
    return list(notebook_outputs("fig7b").values()) if SWEEP else []
