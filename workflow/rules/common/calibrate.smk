# Helpers of stage calibrate (its rules: workflow/rules/calibrate.smk).
CALIBRATE = config.get("calibrate")


def calibrate_opts():
    """`ostinato calibrate` options from the `calibrate` config section."""
    c = CALIBRATE
    return (f"--reps {c['reps']} --decode {c['decode']} --decode-prompt {c['decode_prompt']} "
            f"--split-sizes {','.join(str(n) for n in c['split_sizes'])} --upload-size {c['upload_size']} "
            f"--upload-min {c['upload_min']} --resident-share {c['resident_share']} "
            f"--base-profile {c['base_profile']} --base-model {c['base_model']} --ctx {c['ctx']}"
            + "".join(f" --server-arg={shlex.quote(a)}" for a in c["server_args"]))


def calibrate_sources():
    """(fit, machine label) of each calibration the calibrate notebook shows: this run's, then the reference."""
    out = [("results/calibrate/fit.json", "")] if CALIBRATE else []
    if FIGURES["reference_fit"]:
        out.append((FIGURES["reference_fit"], f"{FIGURES['reference_machine'] or 'reference'}, reference"))
    return out


def calibrate_targets():
    """This run's calibration and the calibrate notebook's outputs (to add to `rule all`)."""
    out = ["results/calibrate/profile.yaml", "results/calibrate/sim-params.yaml"] if CALIBRATE else []
    return out + (list(notebook_outputs("calibrate").values()) if calibrate_sources() else [])
