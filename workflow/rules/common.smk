# Shared helpers: resolved engine backend, paths, config checks, and the targets of `rule all`.
import json
import re
import socket
from pathlib import Path

from ostinato.build.backend import resolve_backend
from ostinato.engines import PLAN_PRESETS

BACKEND = resolve_backend(config["engine"]["backend"], config["engine"]["cuda_arch"] or None)
ENGINE_DIR = f"build/engine/{BACKEND.name}"
MACHINE = config.get("machine", "auto")
if MACHINE == "auto":
    MACHINE = socket.gethostname()


def engine_bin(variant, tool="llama-server"):
    """Path of one tool of a built engine variant."""
    return f"{ENGINE_DIR}/{variant}/bin/{tool}"


def check_replay_config():
    """Fail early, naming the key, if replay refers to a model or session set that is not configured."""
    r = config["replay"]
    if r["model"] not in config["models"]:
        raise ValueError(f"config replay.model: {r['model']!r} is not a key of models ({', '.join(config['models'])})")
    for s in r["sets"]:
        if s not in config["sessions"]["sets"]:
            raise ValueError(f"config replay.sets: {s!r} is not a key of sessions.sets")
        if r.get("routing_force") and s not in config.get("routing", {}).get("sets", []):
            raise ValueError(f"config replay.routing_force: the replayed set {s!r} has no traces; add it to routing.sets")
    for name, e in r["engines"].items():
        if e.get("url") and (e.get("preset") or e.get("server_args") or e.get("env")):
            raise ValueError(f"config replay.engines.{name}: an engine reached by url takes no preset, server_args or env")
        if e.get("url") and e.get("api", "llama") == "openai" and r.get("routing_force"):
            raise ValueError(f"config replay.engines.{name}: replay.routing_force needs llama-server, not api openai")
        if e.get("api", "llama") == "openai" and not e.get("url"):
            raise ValueError(f"config replay.engines.{name}: api openai needs url (an engine running elsewhere)")
    uses_plan = any(e.get("preset") in PLAN_PRESETS for e in r["engines"].values())
    if r.get("residency", {}).get("budget") == "capacity" and "memory" not in config:
        raise ValueError("config replay.residency.budget: 'capacity' needs the memory section (the capacity test)")
    if uses_plan and "residency" not in r:
        raise ValueError(f"config replay.engines: the presets {', '.join(PLAN_PRESETS)} need replay.residency "
                         f"(the development set that plans their pool)")
    if "residency" in r and r["residency"]["dev_set"] not in config["sessions"]["sets"]:
        raise ValueError(f"config replay.residency.dev_set: {r['residency']['dev_set']!r} is not a key of sessions.sets")


check_replay_config()


def all_targets():
    """What `snakemake` builds by default: the notebooks' figures and tables, the residency plan, the cost-model checks."""
    return [
        "figures/replay_summary.pdf",
        "figures/replay_summary.png",
        "tables/replay_summary.csv",
        "tables/replay_summary.md",
    ] + table2_targets() + routing_targets() + plan_targets() + sim_targets() + calibrate_targets() + memory_targets() + sweep_targets() + result_targets()


SYNTH_MODELS = [m for m, c in config["models"].items() if "spec" in c]
DOWNLOAD_MODELS = [m for m, c in config["models"].items() if "url" in c]


def name_pattern(names):
    """A wildcard constraint matching exactly these names (nothing if empty)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def synth_opts(model):
    """`ostinato models synth` options of one configured model."""
    c = config["models"][model]
    flags = [("vocab", "--vocab"), ("expert_type", "--expert-type"), ("dense_type", "--dense-type"), ("seed", "--seed")]
    return " ".join(f"{f} {c[k]}" for k, f in flags if c.get(k) not in (None, ""))


def session_opts(name):
    """`ostinato sessions build` options of one configured session set."""
    s = config["sessions"]["sets"][name]
    flags = [("select", "--select"), ("tokenizer", "--tokenizer"), ("max_requests", "--max-requests"),
             ("max_new_tokens", "--max-new-tokens"), ("max_output_tokens", "--max-output-tokens"),
             ("max_context_tokens", "--max-context-tokens")]
    return " ".join(f"{f} {s[k]}" for k, f in flags if k in s)


def server_args(engine):
    """`ostinato replay run` server options of one configured engine (context, threads, its own flags); none for
    an engine reached by URL (it was started with its own)."""
    r = config["replay"]
    if engine_url(engine):
        return ""
    args = ["-c", str(r["ctx_size"]), "-t", str(r["threads"])] + list(r["engines"][engine].get("server_args", []))
    return " ".join(f"--server-arg={a}" for a in args)


def replay_capacity():
    """The capacity test's result that sizes the pool and every preset's budget (`replay.residency.budget:
    capacity`), else ""."""
    rsd = config["replay"].get("residency", {})
    if rsd.get("budget", "share") != "capacity":
        return ""
    return f"results/plan/memory/{config['replay']['model']}.capacity.json"


def preset_opts(engine, input=None):
    """`ostinato replay run` preset options of one configured engine (its named configuration and the shared budget)."""
    name = config["replay"]["engines"][engine].get("preset")
    if not name:
        return ""
    budget = config["replay"].get("expert_budget_gib")
    share = config["replay"].get("residency", {}).get("resident_share")
    opts = f"--preset {name} --llama-tree {ENGINE_DIR}/tree"
    if budget is not None:
        opts += f" --expert-budget-gib {budget}"
    elif replay_capacity():  # every preset gets the pool the capacity test found room for
        opts += f" --expert-capacity {replay_capacity()}"
    elif share is not None:  # every preset gets the GPU memory of the ostinato engine's pool
        opts += f" --expert-fraction {share}"
    if name in PLAN_PRESETS:
        rsd = config["replay"]["residency"]
        opts += f" --residency-plan {input.plan} --residency-upload-min {rsd.get('upload_min', 512)}"
    return opts


def replay_runs():
    """Path prefix of each repeated run of the replay: "" for the first (results/replay/<set>/), "run<r>/" after it."""
    return ["" if r == 1 else f"run{r}/" for r in range(1, config["replay"].get("repeats", 1) + 1)]


def replay_order():
    """(run, set, engine) of every replay in the order they run: the engines in config order on the first set,
    reversed on the next, and so on; each repeated run reverses the previous one (engine-order bias cancels)."""
    engines = list(config["replay"]["engines"])
    out = []
    for r, run in enumerate(replay_runs()):
        for i, s in enumerate(config["replay"]["sets"]):
            out += [(run, s, e) for e in (engines if (i + r) % 2 == 0 else engines[::-1])]
    return out


def replay_after(wildcards):
    """The per-session CSV of the replay that runs just before this one ([] for the first): it orders the jobs."""
    order = replay_order()
    i = order.index((wildcards.run, wildcards.set, wildcards.engine))
    return [] if i == 0 else "results/replay/{}{}/{}.sessions.csv".format(*order[i - 1])


def run_pattern():
    """Wildcard constraint of the run prefix: "" or one of the repeated runs' "run<r>/"."""
    return "(" + "|".join(re.escape(r) for r in replay_runs() if r) + ")?"


def engine_url(engine):
    """The URL of an engine that runs elsewhere (`replay.engines.<engine>.url`), else ""."""
    return config["replay"]["engines"][engine].get("url", "")


def replay_server_inputs(engine):
    """The llama-server binary the replay starts for an engine; nothing for an engine reached by URL."""
    return [] if engine_url(engine) else engine_bin(config["replay"]["engines"][engine]["variant"])


def replay_reach(engine, input):
    """`ostinato replay run` options that say how to reach the engine: binary and model, or URL and API."""
    e = config["replay"]["engines"][engine]
    if e.get("url"):
        name = f" --model-name {e['model_name']}" if e.get("model_name") else ""
        return f"--server-url {e['url']} --api {e.get('api', 'llama')}{name}"
    return f"--server-bin {input.server} --model {input.model}"


def replay_plan(engine):
    """The residency plan an engine loads (the presets of PLAN_PRESETS), else nothing."""
    if config["replay"]["engines"][engine].get("preset") not in PLAN_PRESETS:
        return []
    return f"results/plan/replay/{config['replay']['model']}.plan.json"


def server_env(engine):
    """`ostinato replay run` environment options of one configured engine."""
    env = config["replay"]["engines"][engine].get("env", {})
    return " ".join(f"--env {k}={v}" for k, v in env.items())


# --- sessions (issue 3): trace sources, splits, Table 2 ---------------------------------------------
SESSION_SOURCES = ("swe-mini", "tau2", "swe-rebench")
SPLIT_SOURCES = ("swe-mini", "tau2")  # the tables the Table 2 splits are drawn from


def sessions_cfg(key, default):
    """A `sessions.<key>` setting, with its default when the config does not set it."""
    return config["sessions"].get(key, default)


def sessions_tables_dir():
    """Folder of the per-turn tables the splits and Table 2 read: derived here, or the committed ones."""
    return "results/sessions/tables" if sessions_cfg("derive_tables", False) else sessions_cfg("tables", "data/sessions")


def session_table(source):
    """Per-turn table of one source as the splits and Table 2 read it."""
    return f"{sessions_tables_dir()}/{source}.turns.csv"


def committed_table(source):
    """The committed per-turn table of one source (the fallback of `get_traces`)."""
    return f"{sessions_cfg('tables', 'data/sessions')}/{source}.turns.csv"


def mirror_opt():
    """`--mirror` of `ostinato sessions get` (nothing when `sessions.mirror` is empty)."""
    mirror = config["sessions"].get("mirror", "")
    return f"--mirror {mirror}" if mirror else ""


def source_url_opt(source):
    """`--url` of `ostinato sessions get` when the config overrides a source's canonical URL."""
    url = sessions_cfg("urls", {}).get(source, "")
    return f"--url {url}" if url else ""


def session_set_inputs(name):
    """Inputs of `build_sessions` for one set: its source's manifest, and the split file if the set uses one."""
    s = config["sessions"]["sets"][name]
    inputs = {"traces": f"results/sessions/traces/{s['source']}.json"}
    if s.get("split"):
        inputs["split"] = "results/sessions/splits.json"
    return inputs


def session_build_opts(name):
    """`ostinato sessions build` options of one set beyond `session_opts`: split set, output count, seed."""
    s = config["sessions"]["sets"][name]
    opts = [session_opts(name)]
    if s.get("split"):
        opts.append(f"--split results/sessions/splits.json --split-set {s['split']}")
    opts.append(f"--output-count {s.get('output_count', 'recorded')} --seed {s.get('seed', 0)}")
    return " ".join(o for o in opts if o)


def table2_targets():
    """Outputs of the Table 2 notebook (to add to `rule all`)."""
    return ["figures/table2.pdf", "figures/table2.png", "tables/table2.csv", "tables/table2.md"]


# --- routing (issue 3): synthetic routing traces and their statistics --------------------------------
def routing_cfg():
    """The `routing` config section (defaults: V4-Flash shape, calibrated profile, no sets)."""
    return config.get("routing", {})


def routing_sets():
    """Trace sets: session sets listed in routing.sets plus the synthetic sets of routing.synthetic."""
    r = routing_cfg()
    return list(r.get("sets", [])) + list(r.get("synthetic", {}))


def routing_inputs(wildcards):
    """Inputs of `make_routing`: the sessions JSONL of a session set; nothing for a synthetic set."""
    if wildcards.set in routing_cfg().get("synthetic", {}):
        return {}
    return {"sessions": f"results/sessions/{wildcards.set}.jsonl"}


def routing_workload(name):
    """Workload of a trace set (routing drifts by workload): a synthetic set's own, else its session source's."""
    r = routing_cfg()
    if name in r.get("synthetic", {}):
        return r["synthetic"][name].get("workload", "swe")
    source = config["sessions"]["sets"][name]["source"]
    return "swe" if source.startswith("swe") else source


def routing_generate_opts(name):
    """`ostinato routing generate` options of one trace set (shape, profile, seed, sessions)."""
    r = routing_cfg()
    shape = r.get("model", "deepseek-v4-flash")
    if isinstance(shape, dict):
        opts = [f"--model custom --n-layer {shape['n_layer']} --n-expert {shape['n_expert']} "
                f"--n-expert-used {shape['n_expert_used']}"]
    else:
        opts = [f"--model {shape}"]
    opts.append(f"--profile {r.get('profile', 'calibrated')} --seed {r.get('seed', 0)} "
                f"--workload {routing_workload(name)}")
    opts += [f"--set {k}={v}" for k, v in r.get("profile_overrides", {}).items()]
    syn = r.get("synthetic", {}).get(name)
    if syn is not None:
        opts.append(f"--synthetic-sessions {syn.get('sessions', 1)} --session-seed {syn.get('seed', 0)}")
    else:
        opts.append(f"--sessions results/sessions/{name}.jsonl")
    return " ".join(opts)


def routing_stats_dirs(kind):
    """Trace directories of the development (`dev`) or held-out (`heldout`) sets of routing.stats."""
    return [f"results/routing/{s}" for s in routing_cfg().get("stats", {}).get(kind, [])]


def routing_stats_opts():
    """`ostinato routing stats` residency sizes from routing.stats."""
    s = routing_cfg().get("stats", {})
    return (f"--n-resident-decode {s.get('n_resident_decode', 4864)} "
            f"--n-resident-prefill {s.get('n_resident_prefill', 5702)}")


def routing_targets():
    """Outputs of the routing-statistics notebook (to add to `rule all`)."""
    return ["figures/routing_stats.pdf", "figures/routing_stats.png", "tables/routing_stats.csv",
            "tables/routing_stats.md"]


def check_routing_config():
    """Fail early, naming the key, if routing refers to unknown session sets or trace sets."""
    r = routing_cfg()
    for s in r.get("sets", []):
        if s not in config["sessions"]["sets"]:
            raise ValueError(f"config routing.sets: {s!r} is not a key of sessions.sets")
    for s in r.get("synthetic", {}):
        if s in config["sessions"]["sets"]:
            raise ValueError(f"config routing.synthetic: {s!r} is also a session set; pick another name")
    for kind in ("dev", "heldout"):
        for s in r.get("stats", {}).get(kind, []):
            if s not in routing_sets():
                raise ValueError(f"config routing.stats.{kind}: {s!r} is not in routing.sets or routing.synthetic")


# --- plan (issue 4): routing profile, residency plan, cost-model checks ----------------------------
def plan_inputs(wildcards):
    """Inputs of `plan_residency`: the development profile, the held-out one if set, the capacity test if a memory model is set."""
    p = config["plan"]
    inputs = {"profile": f"results/profile/{p['dev_set']}.profile.json"}
    if p.get("heldout_set"):
        inputs["heldout"] = f"results/profile/{p['heldout_set']}.profile.json"
    if p.get("memory"):
        inputs["capacity"] = "results/plan/capacity.json"
    return inputs


def plan_opts(input):
    """`ostinato residency plan` options: capacity file, or the configured slots per GPU; held-out profile."""
    p = config["plan"]
    opts = [f"--capacity {input.capacity}" if p.get("memory") else
            f"--slots {','.join(str(n) for n in p['slots'])} --expert-bytes {p['expert_bytes']}"]
    if p.get("heldout_set"):
        opts.append(f"--heldout {input.heldout}")
    return " ".join(opts)


def plan_targets():
    """Outputs of the plan stage : the plan, its summary, the cost-model checks."""
    if "plan" not in config:
        return []
    return ["results/plan/plan.json", "results/plan/summary.json"] + [
        f"results/costmodel/checks-{p}.json" for p in config.get("costmodel", {}).get("profiles", [])]


# --- calibrate (issue 4): the cost model's constants measured on this machine ------------------------------
def calibrate_cfg(key, default=None):
    """A key of the `calibrate` config section."""
    return config.get("calibrate", {}).get(key, default)


def calibrate_opts():
    """`ostinato bench calibrate` options from the `calibrate` config section."""
    return " ".join([
        f"--reps {calibrate_cfg('reps', 3)}", f"--decode {calibrate_cfg('decode', 32)}",
        f"--decode-prompt {calibrate_cfg('decode_prompt', 32)}",
        f"--split-sizes {','.join(str(n) for n in calibrate_cfg('split_sizes', [32, 128]))}",
        f"--upload-size {calibrate_cfg('upload_size', 1024)}", f"--np-min {calibrate_cfg('np_min', 512)}",
        f"--expert-fraction {calibrate_cfg('expert_fraction', 0.5)}",
        f"--base-profile {calibrate_cfg('base_profile', 'paper-4x4090d')}",
        f"--base-model {calibrate_cfg('base_model', 'deepseek-v4-flash')}", f"--ctx {calibrate_cfg('ctx', 4096)}",
    ])


def calibrate_targets():
    """Outputs of the calibration (to add to `rule all`); none without the `calibrate` section."""
    return ["results/calibrate/profile.yaml", "results/calibrate/sim-params.yaml"] if "calibrate" in config else []


# --- sweep (issue 5): the input-length sweep of Figure 7b --------------------------------------------------
def sweep_cfg(key, default=None):
    """A key of the `sweep` config section."""
    return config.get("sweep", {}).get(key, default)


def sweep_opts():
    """`ostinato bench prefill` options from the `sweep` config section."""
    return " ".join([
        f"--engines {','.join(sweep_cfg('engines', ['llama.cpp-layers', 'ostinato']))}",
        f"--baseline {sweep_cfg('engines', ['llama.cpp-layers'])[0]}",
        f"--expert-fraction {sweep_cfg('expert_fraction', 0.5)}", f"--np-min {sweep_cfg('np_min', 512)}",
        f"--prefix {sweep_cfg('prefix', 3072)}", f"--sizes {','.join(str(n) for n in sweep_cfg('sizes', [128, 343, 511, 512, 1024]))}",
        f"--decode {sweep_cfg('decode', 128)}", f"--reps {sweep_cfg('reps', 3)}", f"--ctx {sweep_cfg('ctx', 8192)}",
    ])


def sweep_targets():
    """Outputs of the Figure 7b notebook (to add to `rule all`); none without the `sweep` section."""
    if "sweep" not in config:
        return []
    return ["figures/fig7b.pdf", "figures/fig7b.png", "tables/fig7b.csv", "tables/fig7b.md"]


# --- sim (issue 4): the trace-driven simulator and its validation against the paper ---------------------
def sim_cfg(key, default=None):
    """A key of the `sim` config section."""
    return config.get("sim", {}).get(key, default)


def yaml_list(items):
    """A YAML flow list of plain names, for `ostinato figures params --set key=[...]`."""
    return "[" + ", ".join(str(i) for i in items) + "]"


def sim_workload(name):
    """The paper workload (SWE | tau2) a simulated trace set stands for."""
    return "SWE" if routing_workload(name) == "swe" else "tau2"


def plan_total_slots(plan_path):
    """Resident experts of a plan file over all its GPUs (the cache size of the MIN limit)."""
    with open(plan_path, encoding="utf-8") as f:
        return sum(len(g["slots"]) for g in json.load(f)["gpus"])


def sim_opts(input):
    """`ostinato sim run` options: profile, model, policies, static-uniform experts per layer, simulator constants."""
    opts = [f"--profile {sim_cfg('profile', 'paper-4x4090d')}", f"--model {sim_cfg('model', 'deepseek-v4-flash')}",
            f"--policies {','.join(sim_cfg('policies', []))}", f"--per-layer {sim_cfg('per_layer', 58)}"]
    if sim_cfg("params"):
        opts.append(f"--sim-params {input.sim_params}")
    return " ".join(opts)


def sim_targets():
    """Outputs of the simulator validation notebook (to add to `rule all`); none without `sim.sets`."""
    if not sim_cfg("sets") or "plan" not in config:
        return []
    return ["figures/sim_validation.pdf", "figures/sim_validation.png", "tables/sim_validation.csv",
            "tables/sim_validation.md"]


def check_sim_config():
    """Fail early, naming the key, if sim refers to unknown trace sets or a profile without its checks."""
    for s in sim_cfg("sets", []):
        if s not in routing_sets():
            raise ValueError(f"config sim.sets: {s!r} is not in routing.sets or routing.synthetic")
        if routing_workload(s) not in ("swe", "tau2"):
            raise ValueError(f"config sim.sets: {s!r} has workload {routing_workload(s)!r}; the paper's are swe and tau2")
    prof = sim_cfg("profile", "paper-4x4090d")
    if sim_cfg("sets") and prof not in config.get("costmodel", {}).get("profiles", []):
        raise ValueError(f"config sim.profile: {prof!r} must also be in costmodel.profiles (its checks go in the notebook)")
    if sim_cfg("sets") and "plan" not in config:
        raise ValueError("config sim.sets: the simulator needs the plan section (its residency plan)")


def memory_opts():
    """`ostinato residency memory` options from the `memory` config section."""
    m = config.get("memory", {})
    return (f"--ctx-sizes {','.join(str(c) for c in m.get('ctx_sizes', [2048, 4096, 8192]))} "
            f"--ubatch {m.get('ubatch', 512)} "
            f"--gpu-total-bytes {','.join(str(b) for b in m.get('gpu_total_bytes', [1073741824]))} "
            f"--margin-bytes {m.get('margin_bytes', 0)} --device {m.get('device', 'CPU')}")


def memory_targets():
    """The replayed model's memory model, its check against the engine and its capacity test (to add to `rule all`)."""
    if "memory" not in config or "residency" not in config["replay"]:
        return []
    m = config["replay"]["model"]
    return [f"results/plan/memory/{m}.check.json", f"results/plan/memory/{m}.capacity.json"]


def download_opts(source):
    """Download options of `ostinato sessions get` for one source: cache, off switch, URL override, checksum."""
    opts = [f"--cache {sessions_cfg('cache', 'results/sessions/mirror')}", "--no-progress"]
    if not sessions_cfg("download", True):
        opts.append("--no-download")
    url = sessions_cfg("download_urls", {}).get(source, "")
    sha = sessions_cfg("sha256", {}).get(source, "")
    opts += ([f"--download-url {url}"] if url else []) + ([f"--sha256 {sha}"] if sha else [])
    return " ".join(opts)


def traces_path(input):
    """The folder a `get_traces` manifest points at (mirror or download cache)."""
    with open(input.traces, encoding="utf-8") as fh:
        return json.load(fh)["path"]


# --- figures (issue 5): one notebook per paper result --------------------------------------------------------
# each renders the paper's numbers, this run's replays, shipped reference replays and the simulator side by side
RESULT_NOTEBOOKS = ["table3", "fig1", "table7", "fig4", "fig5", "fig6", "table8", "table4"]


def figures_cfg(key, default=None):
    """A key of the `figures` config section."""
    return config.get("figures", {}).get(key, default)


def replay_arch():
    """The llama.cpp architecture of the replayed model when its spec names it (a synthesized model), else ""."""
    from ostinato.models.spec import get_spec

    spec = config["models"][config["replay"]["model"]].get("spec")
    return get_spec(spec).arch if spec else ""


def result_sources(result):
    """The measured, simulated and reference inputs of one result notebook (Table 4: Qwen3-MoE series only, with the
    shipped Qwen3 replays; Table 8: the shipped ablation runs, which add the native-prefill engine)."""
    qwen = result == "table4"
    measured = [] if qwen and replay_arch() != "qwen3moe" else ["results/replay/sessions.csv"]
    sims = [] if qwen and not sim_cfg("model", "").startswith("qwen") else [
        s for s in sim_cfg("sets", []) if "plan" in config]
    refs = figures_cfg({"table8": "reference_ablation_runs", "table4": "reference_qwen_runs"}.get(result, "reference_runs"), [])
    return {"measured_sessions": measured, "measured_requests": [p.replace("sessions.csv", "requests.csv") for p in measured],
            "sim_sessions": [f"results/sim/{s}/sessions.csv" for s in sims],
            "sim_requests": [f"results/sim/{s}/requests.csv" for s in sims], "reference_runs": refs}


def result_inputs(result):
    """Files a result notebook reads (its sources' CSVs)."""
    src = result_sources(result)
    refs = [f"{d}/{f}" for d in src["reference_runs"] for f in ("sessions.csv", "requests.csv")]
    return src["measured_sessions"] + src["measured_requests"] + src["sim_sessions"] + src["sim_requests"] + refs


def result_params(result):
    """`ostinato figures params` options of one result notebook."""
    src = result_sources(result)
    sets = [f"--set '{k}={yaml_list(v)}'" for k, v in src.items()]
    return " ".join(sets + [f"--set profile={sim_cfg('profile', 'paper-4x4090d')}",
                            f"--set 'reference_machine={figures_cfg('reference_machine', '')}'",
                            f"--set target={figures_cfg('target', 'ostinato')}",
                            "--set figures_dir=figures --set tables_dir=tables", f"--set output_stem={result}"])


def calibration_sources():
    """(fit, machine label) of each calibration the calibration notebook shows: this run's, then the reference."""
    out = [("results/calibrate/fit.json", "")] if "calibrate" in config else []
    if figures_cfg("reference_fit"):
        out.append((figures_cfg("reference_fit"), f"{figures_cfg('reference_machine', 'reference')}, reference"))
    return out


def calibration_params():
    """`ostinato figures params` options of the calibration notebook."""
    src = calibration_sources()
    return (f"--set 'fits={yaml_list(f for f, _ in src)}' --set 'series={json.dumps([m for _, m in src])}' "
            f"--set 'machine={MACHINE}' --set figures_dir=figures --set tables_dir=tables --set output_stem=calibration")


def calibration_inputs():
    return [f for f, _ in calibration_sources()]


def predicted_sources():
    """(fit, sweep directory, machine label) of each machine the predicted-against-measured notebook shows."""
    out = [("results/calibrate/fit.json", "results/sweep", "")] if "calibrate" in config and "sweep" in config else []
    if figures_cfg("reference_fit") and figures_cfg("reference_sweep"):
        out.append((figures_cfg("reference_fit"), figures_cfg("reference_sweep"),
                    f"{figures_cfg('reference_machine', 'reference')}, reference"))
    return out


def predicted_params():
    """`ostinato figures params` options of the predicted-against-measured notebook."""
    src = predicted_sources()
    return (f"--set 'fits={yaml_list(f for f, _, _ in src)}' --set 'sweeps={yaml_list(d for _, d, _ in src)}' "
            f"--set 'machines={json.dumps([m for _, _, m in src])}' --set 'machine={MACHINE}' "
            "--set figures_dir=figures --set tables_dir=tables --set output_stem=predicted")


def predicted_inputs():
    return [p for f, d, _ in predicted_sources() for p in (f, f"{d}/summary.json", f"{d}/cold.json")]


def result_targets():
    """The result notebooks' figures and tables (to add to `rule all`)."""
    out = [f"{d}/{r}.{x}" for r in RESULT_NOTEBOOKS for d, x in (("figures", "pdf"), ("figures", "png"),
                                                                   ("tables", "csv"), ("tables", "md"))]
    for name, needed in (("calibration", calibration_inputs()), ("predicted", predicted_sources())):
        if needed:
            out += [f"figures/{name}.pdf", f"figures/{name}.png", f"tables/{name}.csv", f"tables/{name}.md"]
    return out
