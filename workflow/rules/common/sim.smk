# Helpers of stage sim (its rules: workflow/rules/sim.smk).
SIM = config["sim"]


def sim_workload(name):
    """The paper workload (SWE | tau2) a simulated trace set stands for."""
    return "SWE" if routing_workload(name) == "swe" else "tau2"


def sim_opts(input):
    """`ostinato sim run` options: profile, model, policies, ktransformers-placement experts per layer, simulator constants."""
    opts = [f"--profile {SIM['profile']}", f"--model {SIM['model']}", f"--policies {','.join(SIM['policies'])}",
            f"--per-layer {SIM['per_layer']}"]
    if SIM["params"]:
        opts.append(f"--sim-params {input.sim_params}")
    return " ".join(opts)


def sim_targets():
    """Outputs of the simulator validation notebook (to add to `rule all`); none without `sim.sets`."""
    if not SIM["sets"]:
        return []
    return list(notebook_outputs("sim_validation").values())


def check_sim_config():
    """Fail early, naming the key, if sim refers to unknown trace sets or a profile without its checks."""
    if not SIM["sets"]:
        return
    for s in SIM["sets"]:
        if s not in routing_sets():
            raise ValueError(f"config sim.sets: {s!r} is not in routing.sets or routing.synthetic")
        if routing_workload(s) not in ("swe", "tau2"):
            raise ValueError(f"config sim.sets: {s!r} has workload {routing_workload(s)!r}; the paper's are swe and tau2")
    if SIM["profile"] not in COSTMODEL_PROFILES:
        raise ValueError(f"config sim.profile: {SIM['profile']!r} must also be in costmodel.profiles (its checks go "
                         f"in the notebook)")
    if not RESIDENCY:
        raise ValueError("config sim.sets: the simulator needs the residency section (its residency plan)")


check_sim_config()
