# Helpers of stage routing (its rules: workflow/rules/routing.smk).
ROUTING = config["routing"]


def routing_sets():
    """Trace sets: session sets listed in routing.sets plus the synthetic sets of routing.synthetic."""
    return list(ROUTING["sets"]) + list(ROUTING["synthetic"])


def routing_inputs(wildcards):
    """Inputs of `make_routing`: the sessions JSONL of a session set; nothing for a synthetic set."""
    if wildcards.set in ROUTING["synthetic"]:
        return {}
    return {"sessions": f"results/sessions/{wildcards.set}.jsonl"}


def routing_workload(name):
    """Workload of a trace set (routing drifts by workload): a synthetic set's own, else its session source's."""
    if name in ROUTING["synthetic"]:
        return ROUTING["synthetic"][name]["workload"]
    source = config["sessions"]["sets"][name]["source"]
    return "swe" if source.startswith("swe") else source


def routing_generate_opts(name):
    """`ostinato routing generate` options of one trace set (shape, profile, seed, sessions)."""
    shape = ROUTING["model"]
    if isinstance(shape, dict):
        opts = [f"--model custom --n-layer {shape['n_layer']} --n-expert {shape['n_expert']} "
                f"--n-expert-used {shape['n_expert_used']}"]
    else:
        opts = [f"--model {shape}"]
    opts.append(f"--profile {ROUTING['profile']} --seed {ROUTING['seed']} --workload {routing_workload(name)}")
    opts += [f"--set {k}={v}" for k, v in ROUTING["profile_overrides"].items()]
    syn = ROUTING["synthetic"].get(name)
    if syn is not None:
        opts.append(f"--synthetic-sessions {syn['sessions']} --session-seed {syn['seed']}")
    else:
        opts.append(f"--sessions results/sessions/{name}.jsonl")
    return " ".join(opts)


def routing_stats_dirs(kind):
    """Trace directories of the development (`dev`) or held-out (`heldout`) sets of routing.stats."""
    return [f"results/routing/{s}" for s in ROUTING["stats"][kind]]


def recorded_routing_sets():
    """Held-out session sets whose routing the stock engine records on the replayed model (routing.recorded)."""
    return list(ROUTING["recorded"]["heldout"])


def recorded_routing_inputs(wildcards):
    """Inputs of `compute_recorded_routing_stats`: the recorded routing and the sessions of the development set
    (replay.residency.dev_set, the set the replay's plans rank experts by) and of the held-out sets."""
    dev = config["replay"]["residency"]["dev_set"]
    return {"dev": f"results/residency/recorded/{dev}", "dev_sessions": f"results/sessions/{dev}.jsonl",
            "heldout": [f"results/residency/recorded/{s}" for s in recorded_routing_sets()],
            "heldout_sessions": [f"results/sessions/{s}.jsonl" for s in recorded_routing_sets()]}


def recorded_routing_label(model):
    """Series label of a model's recorded routing: a synthesized model's routing is an input, never evidence."""
    c = config["models"].get(model, {})
    if "spec" in c:
        return (f"recorded ({MACHINE}), synthetic model {model}, router {c.get('router', 'random')}: "
                "an input, not evidence")
    return f"measured ({MACHINE}), {model}"


def routing_targets():
    """Outputs of the routing-statistics notebooks (to add to `rule all`), the recorded one's with routing.recorded."""
    out = list(notebook_outputs("routing_stats").values())
    if recorded_routing_sets():
        out += list(notebook_outputs("routing_stats_recorded").values())
    return out


def check_routing_config():
    """Fail early, naming the key, if routing refers to unknown session sets or trace sets."""
    for s in ROUTING["sets"]:
        if s not in config["sessions"]["sets"]:
            raise ValueError(f"config routing.sets: {s!r} is not a key of sessions.sets")
    for s in ROUTING["synthetic"]:
        if s in config["sessions"]["sets"]:
            raise ValueError(f"config routing.synthetic: {s!r} is also a session set; pick another name")
    for s in recorded_routing_sets():
        if s not in config["sessions"]["sets"]:
            raise ValueError(f"config routing.recorded.heldout: {s!r} is not a key of sessions.sets")
        if not config["replay"].get("residency"):
            raise ValueError("config routing.recorded.heldout: needs replay.residency.dev_set, the development set "
                             "the held-out sets are measured against")
        if s == config["replay"]["residency"]["dev_set"]:
            raise ValueError(f"config routing.recorded.heldout: {s!r} is replay.residency.dev_set; held-out sets "
                             "must be sessions never used to rank the experts")
    for kind in ("dev", "heldout"):
        for s in ROUTING["stats"][kind]:
            if s not in routing_sets():
                raise ValueError(f"config routing.stats.{kind}: {s!r} is not in routing.sets or routing.synthetic")


check_routing_config()
