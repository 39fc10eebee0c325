"""Named engine configurations: how each compared engine is started (variant, llama-server flags, environment).

Every engine of one comparison gets the same threads, context and GPU memory for routed experts; a preset
turns that budget into its own placement flags, so configurations differ only in what the paper compares.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ostinato.residency.budget import ExpertBudget

# Passes of at least this many tokens upload host experts to the GPU (llama.cpp's op offload), as in the
# paper's whole-layer baseline (Table 6); llama.cpp's own default is 32.
OP_OFFLOAD_MIN_BATCH = 512
# Np: passes of at least this many tokens take the Ostinato engine's upload path, shorter ones the split path
# (the paper's Table 6; engine flag --residency-upload-min, config key replay.residency.upload_min).
UPLOAD_MIN = 512
# The share of routed experts (of their bytes) on the GPU in the default comparisons: half, as in the paper's
# routing facts (config key replay.residency.resident_share; --resident-share of the CLIs).
RESIDENT_SHARE = 0.5


@dataclass(frozen=True)
class EngineConfig:
    """One engine of a comparison: which build, which server flags, which environment."""

    name: str
    variant: str
    server_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""


def _layers(budget: ExpertBudget) -> EngineConfig:
    n_gpu = budget.layers_on_gpu()
    n_cpu = budget.n_moe_layers - n_gpu
    return EngineConfig(
        "llama.cpp-layers", "stock", ("-ngl", "99", "--n-cpu-moe", str(n_cpu)),
        {"GGML_OP_OFFLOAD_MIN_BATCH": str(OP_OFFLOAD_MIN_BATCH)},
        f"whole MoE layers on the GPU while the expert budget lasts ({n_gpu} of {budget.n_moe_layers}), the "
        f"experts of the other {n_cpu} in host memory; passes of >= {OP_OFFLOAD_MIN_BATCH} tokens upload the "
        f"host experts they use")


def _cpu_experts(budget: ExpertBudget) -> EngineConfig:
    return EngineConfig(
        "llama.cpp-cpu-experts", "stock", ("-ngl", "99", "--cpu-moe"),
        {"GGML_OP_OFFLOAD_MIN_BATCH": str(OP_OFFLOAD_MIN_BATCH)},
        "every routed expert in host memory, everything else on the GPU")


# Every routed expert on the GPU: no equal-memory comparison, but the floor of a step when the experts fit (a sweep runs
# it with a budget of all expert bytes, whatever its share: `ostinato sweep`).
FLOOR_PRESET = "llama.cpp-gpu-experts"


def _gpu_experts(budget: ExpertBudget) -> EngineConfig:
    if budget.layers_on_gpu() < budget.n_moe_layers:
        raise ValueError(f"llama.cpp-gpu-experts needs every expert on the GPU, but the budget holds "
                         f"{budget.layers_on_gpu()} of {budget.n_moe_layers} layers")
    return EngineConfig("llama.cpp-gpu-experts", "stock", ("-ngl", "99"), {},
                        "every routed expert on the GPU (the upper bound when they fit)")


def _plan_args(name: str, plan: str | None) -> tuple[str, ...]:
    """The flags every preset with resident pools starts with: all layers on the GPU and the plan."""
    if not plan:
        raise ValueError(f"engine preset {name!r} needs a residency plan file (plan=...)")
    return ("-ngl", "99", "--residency-plan", str(plan))


def _ostinato(budget: ExpertBudget, plan: str | None, upload_min: int) -> EngineConfig:
    return EngineConfig(
        "ostinato", "ostinato", _plan_args("ostinato", plan) + ("--residency-upload-min", str(upload_min)),
        {}, f"the plan's experts resident on the GPU (pool of at most the expert budget); passes of fewer than "
            f"{upload_min} tokens compute cold routes on the CPU, longer ones upload each cold expert once")


def _ostinato_native_prefill(budget: ExpertBudget, plan: str | None, upload_min: int) -> EngineConfig:
    """Table 8's ablation step "resident experts, native prefill": the pools serve decode only."""
    return EngineConfig(
        "ostinato-native-prefill", "ostinato",
        _plan_args("ostinato-native-prefill", plan) + ("--residency-prefill", "native"),
        {"GGML_OP_OFFLOAD_MIN_BATCH": str(OP_OFFLOAD_MIN_BATCH)},
        f"the plan's experts resident on the GPU for single-token passes (cold routes on the CPU); prefill passes "
        f"compute every route from host memory as llama.cpp does (on the CPU, or uploaded from "
        f"{OP_OFFLOAD_MIN_BATCH} tokens)")


# the engine flag that overlaps a split-path pass's branches (engine/README.md, "Overlapped branches")
OVERLAP_ARGS = ("--residency-branches", "overlap")


def _ostinato_overlap(budget: ExpertBudget, plan: str | None, upload_min: int) -> EngineConfig:
    """`ostinato` with the split path's branches set to overlap (the CPU's cold routes while the GPU's resident ones;
    with one GPU llama.cpp's scheduler still runs them in turn: engine/README.md, "Overlapped branches")."""
    base = _ostinato(budget, plan, upload_min)
    return EngineConfig("ostinato-overlap", "ostinato", base.server_args + OVERLAP_ARGS, {},
                        base.description + "; a split-path pass does not wait for its GPU branch before its CPU branch "
                                           "(with one GPU llama.cpp's scheduler still does)")


# the engine flag that makes a decode step one graph per GPU, its cold routes on a resident CPU worker
# (engine/README.md, "One graph per decode step")
GRAPH_ARGS = ("--residency-graph", "step")


def _ostinato_graph(budget: ExpertBudget, plan: str | None, upload_min: int) -> EngineConfig:
    """Figure 8c's steps 2 and 3 together, "one graph per GPU" with "pool set up once": `ostinato-overlap` whose
    decode steps run as one graph per GPU, handing each layer's cold routes to a CPU worker whose threads were created
    and pinned at start-up (prefill passes as `ostinato-overlap`)."""
    base = _ostinato_overlap(budget, plan, upload_min)
    return EngineConfig("ostinato-graph", "ostinato", base.server_args + GRAPH_ARGS, {},
                        base.description + "; a decode step runs as one graph per GPU, its cold routes on a resident "
                                           "CPU worker")


# the engine flags that lend decode the upload path's staging areas (engine/README.md, "Borrowed memory")
BORROW_ARGS = ("--residency-borrow", "all")


def _ostinato_borrow(budget: ExpertBudget, plan: str | None, upload_min: int,
                     flags: tuple[str, ...] = BORROW_ARGS) -> EngineConfig:
    """Figure 8c's step 4, "+ borrowed memory", on per-segment graphs: `ostinato-overlap` with decode steps borrowing
    the staging areas for the cold experts the CPU computes most (on one graph per GPU: `ostinato-graph-borrow`);
    `flags`: the borrowed memory's (default: the whole staging area, the engine's defaults)."""
    base = _ostinato_overlap(budget, plan, upload_min)
    return EngineConfig("ostinato-borrow", "ostinato", base.server_args + flags, {},
                        base.description + "; decode steps also compute the cold experts the CPU used most from the "
                                           "staging areas they borrow (upload passes take them back)"
                        + ("" if flags == BORROW_ARGS else
                           " (decay, margin and admissions chosen on development sessions)"))


def _ostinato_graph_borrow(budget: ExpertBudget, plan: str | None, upload_min: int,
                           flags: tuple[str, ...] = BORROW_ARGS) -> EngineConfig:
    """Figure 8c's step 4 on one graph per GPU: `ostinato-graph` with decode steps borrowing the staging areas (the
    borrowed experts join the GPU branch of the step's graph); `flags` as for `ostinato-borrow`."""
    base = _ostinato_graph(budget, plan, upload_min)
    return EngineConfig("ostinato-graph-borrow", "ostinato", base.server_args + flags, {},
                        base.description + "; decode steps also compute the cold experts the CPU used most from the "
                                           "staging areas they borrow (upload passes take them back)"
                        + ("" if flags == BORROW_ARGS else
                           " (decay, margin and admissions chosen on development sessions)"))


def _ostinato_native_prefill_overlap(budget: ExpertBudget, plan: str | None, upload_min: int) -> EngineConfig:
    """Table 8's ablation step 4, "+ overlapped branches": native prefill, decode steps overlap their branches."""
    base = _ostinato_native_prefill(budget, plan, upload_min)
    return EngineConfig("ostinato-native-prefill-overlap", "ostinato", base.server_args + OVERLAP_ARGS, base.env,
                        base.description + "; a decode step does not wait for its GPU branch before its CPU branch "
                                           "(with one GPU llama.cpp's scheduler still does)")


# The largest pass llama.cpp's expert cache serves (the paper, Section 2).
CACHE_MAX_PASS = 32
# An Np no forward pass reaches: every cold route on the CPU in every pass (KTransformers' placement).
NO_UPLOAD = 2**31 - 1


def _expert_cache(budget: ExpertBudget, plan: str | None, upload_min: int) -> EngineConfig:
    """llama.cpp's expert cache as the paper describes it (ik_llama.cpp ports the same policy)."""
    return EngineConfig(
        "llama.cpp-expert-cache", "ostinato",
        _plan_args("llama.cpp-expert-cache", plan) + ("--residency-policy", "lru",
                                                      "--residency-cache-max-pass", str(CACHE_MAX_PASS)),
        {"GGML_OP_OFFLOAD_MIN_BATCH": str(OP_OFFLOAD_MIN_BATCH)},
        f"(policy, implemented here) one LRU cache of experts per GPU pool, of the plan's size and first filled with "
        f"its experts; passes of at most {CACHE_MAX_PASS} tokens upload each missing expert on demand and compute "
        f"every route from the cache; larger passes compute every route on the CPU, and from "
        f"{OP_OFFLOAD_MIN_BATCH} tokens upload the experts they use")


def _buun(budget: ExpertBudget, plan: str | None, upload_min: int) -> EngineConfig:
    return EngineConfig(
        "buun", "ostinato", _plan_args("buun", plan) + ("--residency-policy", "decay"),
        {"GGML_OP_OFFLOAD_MIN_BATCH": str(OP_OFFLOAD_MIN_BATCH)},
        f"(policy, implemented here) a cache of the plan's size, warmed with its experts, that decode steps use "
        f"(missing experts on the CPU) and that swaps experts by decaying access counts at token boundaries; "
        f"prefill passes compute every route on the CPU, and from {OP_OFFLOAD_MIN_BATCH} tokens upload the experts "
        f"they use")


def _ktransformers(budget: ExpertBudget, plan: str | None, upload_min: int) -> EngineConfig:
    return EngineConfig(
        "ktransformers-placement", "ostinato",
        _plan_args("ktransformers-placement", plan) + ("--residency-upload-min", str(NO_UPLOAD)),
        {}, "(policy, implemented here) KTransformers' default placement: the same number of each layer's most-routed "
            "experts on the GPU (a uniform plan of the same pool bytes), every other route on the CPU in every "
            "pass, no uploads")


PRESETS = {
    "llama.cpp-layers": _layers,
    "llama.cpp-cpu-experts": _cpu_experts,
    "llama.cpp-gpu-experts": _gpu_experts,
    "ostinato": _ostinato,
    "ostinato-native-prefill": _ostinato_native_prefill,
    "ostinato-overlap": _ostinato_overlap,
    "ostinato-native-prefill-overlap": _ostinato_native_prefill_overlap,
    "ostinato-borrow": _ostinato_borrow,
    "ostinato-graph": _ostinato_graph,
    "ostinato-graph-borrow": _ostinato_graph_borrow,
    "llama.cpp-expert-cache": _expert_cache,
    "buun": _buun,
    "ktransformers-placement": _ktransformers,
}
# presets that take a residency plan, and the rule of `ostinato residency plan --rule` that makes it
PLAN_RULES = {
    "ostinato": "frequency",
    "ostinato-native-prefill": "frequency",
    "ostinato-overlap": "frequency",
    "ostinato-native-prefill-overlap": "frequency",
    "ostinato-borrow": "frequency",
    "ostinato-graph": "frequency",
    "ostinato-graph-borrow": "frequency",
    "llama.cpp-expert-cache": "frequency",
    "buun": "frequency",
    "ktransformers-placement": "uniform",
}
PLAN_PRESETS = tuple(PLAN_RULES)
# presets with borrowed memory, whose parameters the replay takes from development sessions (residency borrow-tune)
BORROW_PRESETS = ("ostinato-borrow", "ostinato-graph-borrow")
# presets whose pools a baseline's policy manages: series and tables label them "(policy, implemented here)"
POLICY_PRESETS = ("llama.cpp-expert-cache", "buun", "ktransformers-placement")
POLICY_SUFFIX = " (policy, implemented here)"


def display_name(engine: str) -> str:
    """An engine's name in tables and figures: a baseline's policy on the engine's pools says so."""
    return engine + POLICY_SUFFIX if engine in POLICY_PRESETS else engine


def borrow_args(tuned: dict) -> tuple[str, ...]:
    """The engine flags of borrowed-memory parameters chosen on development sessions (`ostinato residency
    borrow-tune`'s "chosen": slots, decay, margin, admit)."""
    return ("--residency-borrow", str(int(tuned["slots"])), "--residency-borrow-decay", repr(float(tuned["decay"])),
            "--residency-borrow-margin", repr(float(tuned["margin"])), "--residency-borrow-admit",
            str(int(tuned["admit"])))


def preset(name: str, budget: ExpertBudget, variant: str | None = None,
           extra_args: tuple[str, ...] = (), extra_env: dict[str, str] | None = None,
           plan: str | None = None, upload_min: int = UPLOAD_MIN, borrow: dict | None = None) -> EngineConfig:
    """The named configuration for this budget; `variant`, extra flags and environment override or add.

    `plan` is used by the presets of PLAN_PRESETS only, `upload_min` (Np) by the `ostinato` presets only; `borrow`
    (parameters chosen on development sessions, `borrow_args`) by BORROW_PRESETS only, whose flags it replaces (else
    the engine's defaults over the whole staging area).
    ik_llama.cpp ports llama.cpp's expert cache (the paper, Section 2): its policy is `llama.cpp-expert-cache`.
    """
    if name not in PRESETS:
        raise ValueError(f"engine preset {name!r}: expected one of {', '.join(PRESETS)}")
    if borrow is not None and name not in BORROW_PRESETS:
        raise ValueError(f"engine preset {name!r}: borrowed-memory parameters apply to {', '.join(BORROW_PRESETS)} only")
    if borrow is not None:
        make = _ostinato_graph_borrow if name == "ostinato-graph-borrow" else _ostinato_borrow
        cfg = make(budget, plan, upload_min, borrow_args(borrow))
    else:
        cfg = PRESETS[name](budget, plan, upload_min) if name in PLAN_PRESETS else PRESETS[name](budget)
    return EngineConfig(cfg.name, variant or cfg.variant, cfg.server_args + tuple(extra_args),
                        {**cfg.env, **(extra_env or {})}, cfg.description)
