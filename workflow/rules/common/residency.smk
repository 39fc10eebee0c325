# Helpers of stage residency (its rules: workflow/rules/residency.smk).
RESIDENCY = config.get("residency")
REPLAY_RESIDENCY = config["replay"].get("residency")
REPLAY_MODEL = config["replay"]["model"]


def residency_inputs(wildcards):
    """Inputs of `plan_residency`: the development profile, the held-out one if set, the capacity test if a memory
    model is set."""
    inputs = {"profile": f"results/residency/profile/{RESIDENCY['dev_set']}.json"}
    if RESIDENCY["heldout_set"]:
        inputs["heldout"] = f"results/residency/profile/{RESIDENCY['heldout_set']}.json"
    if RESIDENCY["memory_model"]:
        inputs["capacity"] = "results/residency/capacity.json"
    return inputs


def residency_plan_opts(input):
    """`ostinato residency plan` options: capacity file, or the configured slots per GPU; held-out profile."""
    opts = [f"--capacity {input.capacity}" if RESIDENCY["memory_model"] else
            f"--slots {','.join(str(n) for n in RESIDENCY['slots'])} --expert-bytes {RESIDENCY['expert_bytes']}"]
    if RESIDENCY["heldout_set"]:
        opts.append(f"--heldout {input.heldout}")
    return " ".join(opts)


def replay_capacity():
    """The capacity test's result that sizes the pool and every preset's budget (`replay.residency.budget:
    capacity`), else ""."""
    if not REPLAY_RESIDENCY or REPLAY_RESIDENCY["budget"] != "capacity":
        return ""
    return f"results/residency/memory/{REPLAY_MODEL}.capacity.json"


def memory_opts():
    """`ostinato residency memory` options from the `memory` config section."""
    m = config["memory"]
    return (f"--ctx-sizes {','.join(str(c) for c in m['ctx_sizes'])} --ubatch {m['ubatch']} "
            f"--gpu-total-bytes {','.join(str(b) for b in m['gpu_total_bytes'])} "
            f"--margin-bytes {m['margin_bytes']} --device {m['device']}")


def residency_targets():
    """The synthetic plan and its summary; the replayed model's memory model, its check and capacity test."""
    out = ["results/residency/plan.json", "results/residency/summary.json"] if RESIDENCY else []
    if "memory" in config and REPLAY_RESIDENCY:
        out += [f"results/residency/memory/{REPLAY_MODEL}.check.json",
                f"results/residency/memory/{REPLAY_MODEL}.capacity.json"]
    return out


def borrow_admits():
    """`replay.residency.borrow.admit` as the comma list `ostinato residency borrow-tune --admit` takes (one number or
    a list)."""
    a = REPLAY_RESIDENCY["borrow"]["admit"]
    return ",".join(str(x) for x in (a if isinstance(a, list) else [a]))
