# Helpers of stage replay (its rules: workflow/rules/replay.smk).
from ostinato.presets import BORROW_PRESETS, PLAN_PRESETS, PLAN_RULES

REPLAY = config["replay"]


def check_replay_config():
    """Fail early, naming the key, if replay refers to a model or session set that is not configured."""
    if REPLAY["model"] not in config["models"]:
        raise ValueError(f"config replay.model: {REPLAY['model']!r} is not a key of models ({', '.join(config['models'])})")
    for s in REPLAY["sets"]:
        if s not in config["sessions"]["sets"]:
            raise ValueError(f"config replay.sets: {s!r} is not a key of sessions.sets")
        if REPLAY["routing_force"] and s not in ROUTING["sets"]:
            raise ValueError(f"config replay.routing_force: the replayed set {s!r} has no traces; add it to routing.sets")
    for name, e in REPLAY["engines"].items():
        if e.get("url") and (e.get("preset") or e["server_args"] or e["env"]):
            raise ValueError(f"config replay.engines.{name}: an engine reached by url takes no preset, server_args or env")
        if e.get("url") and e["api"] != "llama" and REPLAY["routing_force"]:
            raise ValueError(f"config replay.engines.{name}: replay.routing_force needs llama-server, not api {e['api']}")
        if e["api"] != "llama" and not e.get("url"):
            raise ValueError(f"config replay.engines.{name}: api {e['api']} needs url (an engine running elsewhere)")
    uses_plan = any(e.get("preset") in PLAN_PRESETS for e in REPLAY["engines"].values())
    if REPLAY_RESIDENCY and REPLAY_RESIDENCY["budget"] == "capacity" and "memory" not in config:
        raise ValueError("config replay.residency.budget: 'capacity' needs the memory section (the capacity test)")
    if uses_plan and not REPLAY_RESIDENCY:
        raise ValueError(f"config replay.engines: the presets {', '.join(PLAN_PRESETS)} need replay.residency "
                         f"(the development set that plans their pool)")
    if REPLAY_RESIDENCY and REPLAY_RESIDENCY["dev_set"] not in config["sessions"]["sets"]:
        raise ValueError(f"config replay.residency.dev_set: {REPLAY_RESIDENCY['dev_set']!r} is not a key of sessions.sets")
    bw = REPLAY["bitwise"]
    if bw.get("engine"):
        if bw["engine"] not in REPLAY["engines"]:
            raise ValueError(f"config replay.bitwise.engine: {bw['engine']!r} is not a key of replay.engines")
        if REPLAY["engines"][bw["engine"]].get("url"):
            raise ValueError(f"config replay.bitwise.engine: {bw['engine']!r} is reached by url; the check starts its "
                             "engine with each variant's flags")
        if not bw.get("variants"):
            raise ValueError("config replay.bitwise.variants: the check needs at least one variant to compare")
        if "base" in bw["variants"]:
            raise ValueError("config replay.bitwise.variants: 'base' names the engine's own flags; pick another name")
        for s in bw.get("sets", []):
            if s not in config["sessions"]["sets"]:
                raise ValueError(f"config replay.bitwise.sets: {s!r} is not a key of sessions.sets")


check_replay_config()


def engine_url(engine):
    """The URL of an engine that runs elsewhere (`replay.engines.<engine>.url`), else ""."""
    return REPLAY["engines"][engine].get("url", "")


def server_opts(engine):
    """`ostinato replay run` server options of one configured engine (context, threads, its own flags, environment);
    none for an engine reached by URL (it was started with its own)."""
    if engine_url(engine):
        return ""
    e = REPLAY["engines"][engine]
    args = ["-c", str(REPLAY["ctx_size"]), "-t", str(REPLAY["threads"])] + list(e["server_args"])
    return " ".join([f"--server-arg={a}" for a in args] + [f"--env {k}={v}" for k, v in e["env"].items()])


def preset_opts(engine, input):
    """`ostinato replay run` preset options of one configured engine (its named configuration and the shared budget)."""
    name = REPLAY["engines"][engine].get("preset")
    if not name:
        return ""
    opts = f"--preset {name} --llama-tree {ENGINE_DIR}/tree"
    if REPLAY["expert_budget_gib"] is not None:
        opts += f" --expert-budget-gib {REPLAY['expert_budget_gib']}"
    elif replay_capacity():  # every preset gets the pool the capacity test found room for
        opts += f" --expert-capacity {replay_capacity()}"
    elif REPLAY_RESIDENCY:  # every preset gets the GPU memory of the ostinato engine's pool
        opts += f" --resident-share {REPLAY_RESIDENCY['resident_share']}"
    if name in PLAN_PRESETS:
        opts += f" --plan {input.plan} --upload-min {REPLAY_RESIDENCY['upload_min']}"
    if name in BORROW_PRESETS:
        opts += f" --borrow-params {input.borrow}"
    return opts


def replay_runs():
    """Path prefix of each repeated run of the replay: "" for the first (results/replay/<set>/), "run<r>/" after it."""
    return ["" if r == 1 else f"run{r}/" for r in range(1, REPLAY["repeats"] + 1)]


def replay_order():
    """(run, set, engine) of every replay in the order they run: the engines in config order on the first set,
    reversed on the next, and so on; each repeated run reverses the previous one (engine-order bias cancels)."""
    engines = list(REPLAY["engines"])
    out = []
    for r, run in enumerate(replay_runs()):
        for i, s in enumerate(REPLAY["sets"]):
            out += [(run, s, e) for e in (engines if (i + r) % 2 == 0 else engines[::-1])]
    return out


def replay_after(wildcards):
    """The per-session CSV of the replay that runs just before this one ([] for the first): it orders the jobs."""
    order = replay_order()
    i = order.index((wildcards.run, wildcards.set, wildcards.engine))
    return [] if i == 0 else "results/replay/{}{}/{}.sessions.csv".format(*order[i - 1])


def deadline_rates_opts(wildcards):
    """`replay run`'s sources of rates for its deadline: this run's and run 1's directories of the set
    (`--deadline-rates-from`: other engines' replays of these sessions) and of the config's other sets
    (`--deadline-rates-elsewhere`, before any engine has replayed a session of this set), each directory once."""
    def dirs(sets):
        return " ".join(dict.fromkeys(f"results/replay/{r}{s}" for s in sets for r in (wildcards.run, "")))

    others = dirs(s for s in REPLAY["sets"] if s != wildcards.set)
    return f"--deadline-rates-from {dirs([wildcards.set])}" + (f" --deadline-rates-elsewhere {others}" if others else "")


def run_pattern():
    """Wildcard constraint of the run prefix: "" or one of the repeated runs' "run<r>/"."""
    return "(" + "|".join(re.escape(r) for r in replay_runs() if r) + ")?"


def replay_reach(engine, input):
    """`ostinato replay run` options that say how to reach the engine: binary and model, or URL and API."""
    e = REPLAY["engines"][engine]
    if e.get("url"):
        name = f" --model-name {e['model_name']}" if e["model_name"] else ""
        return f"--server-url {e['url']} --api {e['api']}{name}"
    return f"--server-bin {input.server} --model {input.model}"


def replay_inputs(wildcards):
    """What one replay reads: the server and model (none for an engine reached by URL), the sessions, the forced
    routing, the plan and capacity test of its preset, and the replay that runs before it."""
    return {"after": replay_after(wildcards), **engine_inputs(wildcards.engine, wildcards.set)}


def engine_inputs(engine, set_):
    """What a replay of one configured engine on one set reads besides its order: the server and model (none for an
    engine reached by URL), the sessions, the forced routing, the plan and capacity test of its preset."""
    e = REPLAY["engines"][engine]
    inputs = {"sessions": f"results/sessions/{set_}.jsonl"}
    if not e.get("url"):
        inputs.update(server=engine_bin(e["variant"]), model=f"models/{REPLAY['model']}.gguf")
    if REPLAY["routing_force"]:
        inputs["routing"] = f"results/routing/{set_}"
    if e.get("preset") in PLAN_PRESETS:
        inputs["plan"] = f"results/residency/replay/{REPLAY['model']}.{PLAN_RULES[e['preset']]}.plan.json"
    if e.get("preset") in BORROW_PRESETS:
        inputs["borrow"] = f"results/residency/replay/{REPLAY['model']}.borrow.json"
    if e.get("preset") and replay_capacity():
        inputs["capacity"] = replay_capacity()
    return inputs


def routing_opts(wildcards, input, partial):
    """Forced routing: the engine follows the set's traces and records what it computed."""
    if not REPLAY["routing_force"]:
        return ""
    return f"--routing-force-dir {input.routing} --routing-record-dir {partial}/{wildcards.engine}/routing"


BITWISE = REPLAY["bitwise"]


def bitwise_sets():
    """The session sets of the bitwise check (replay.bitwise.sets, default replay.sets); none when it is off."""
    return (BITWISE.get("sets") or REPLAY["sets"]) if BITWISE.get("engine") else []


def bitwise_args(variant):
    """The server flags the bitwise check adds to the engine's own in one replay: the check's (replay.bitwise.flags,
    every replay), then the variant's."""
    extra = list(BITWISE.get("flags", [])) + ([] if variant == "base" else list(BITWISE["variants"][variant]))
    return " ".join(f"--server-arg={a}" for a in extra)


def bitwise_targets():
    """The bitwise check's reports, one per set and variant (to add to `rule all`)."""
    return [f"results/replay/bitwise/{s}/{v}.json" for s in bitwise_sets() for v in BITWISE.get("variants", {})]


def replay_targets():
    """The replay summary's figure and tables and the bitwise check's reports (to add to `rule all`)."""
    return list(notebook_outputs("replay_summary").values()) + bitwise_targets()


def bitwise_inputs(wildcards):
    """What one replay of the bitwise check reads: its engine's server, model, plan and capacity test, the sessions,
    the forced routing, and the timed replays' summary (the check runs after them, so it never delays them), unless
    replay.bitwise.after_replays is false (the check alone, e.g. on a GPU session that has time for it only)."""
    after = {"after": "results/replay/sessions.csv"} if BITWISE.get("after_replays", True) else {}
    return {**after, **engine_inputs(BITWISE["engine"], wildcards.set)}
