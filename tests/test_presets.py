"""Named engine configurations turn one expert budget into each engine's placement flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ostinato.presets import OP_OFFLOAD_MIN_BATCH, PLAN_RULES, PRESETS, preset
from ostinato.residency.budget import ExpertBudget, expert_budget_from_gguf

GIB = 1 << 30
V4_LAYER = 256 * 13_369_344  # one DeepSeek-V4-Flash MoE layer of MXFP4 experts


def test_layers_preset_places_whole_layers_within_the_budget():
    budget = ExpertBudget((V4_LAYER,) * 8, 14 * GIB)  # 3.42 GB a layer: 14 GiB holds 4
    cfg = preset("llama.cpp-layers", budget)
    assert budget.layers_on_gpu() == 4
    assert cfg.server_args == ("-ngl", "99", "--n-cpu-moe", "4")
    assert cfg.env == {"GGML_OP_OFFLOAD_MIN_BATCH": str(OP_OFFLOAD_MIN_BATCH)} and cfg.variant == "stock"


def test_budget_edges_and_layers_of_two_sizes():
    assert ExpertBudget((100,) * 8).layers_on_gpu() == 8
    assert ExpertBudget((100,) * 8, 99).layers_on_gpu() == 0
    assert ExpertBudget((100,) * 8, 10_000).layers_on_gpu() == 8
    # filled from the last layer down: the two 120-byte layers fit in 250, a third layer would not
    assert ExpertBudget((100, 100, 120, 120), 250).layers_on_gpu() == 2
    assert preset("llama.cpp-layers", ExpertBudget((100,) * 8, 0)).server_args[-1] == "8"


def test_ostinato_preset_loads_the_plan():
    budget = ExpertBudget((V4_LAYER,) * 8, 14 * GIB)
    cfg = preset("ostinato", budget, plan="p.json", upload_min=256)
    assert cfg.variant == "ostinato"
    assert cfg.server_args == ("-ngl", "99", "--residency-plan", "p.json", "--residency-upload-min", "256")
    with pytest.raises(ValueError, match="residency plan"):
        preset("ostinato", budget)


def test_native_prefill_preset_is_the_ablation_step():
    # the same pool, but prefill as llama.cpp does it (with its op offload from 512 tokens); Np does not apply
    cfg = preset("ostinato-native-prefill", ExpertBudget((V4_LAYER,) * 8, 14 * GIB), plan="p.json", upload_min=256)
    assert cfg.variant == "ostinato"
    assert cfg.server_args == ("-ngl", "99", "--residency-plan", "p.json", "--residency-prefill", "native")
    assert cfg.env == {"GGML_OP_OFFLOAD_MIN_BATCH": str(OP_OFFLOAD_MIN_BATCH)}
    with pytest.raises(ValueError, match="'ostinato-native-prefill' needs a residency plan"):
        preset("ostinato-native-prefill", ExpertBudget((100,) * 4))


@pytest.mark.parametrize("base", ["ostinato", "ostinato-native-prefill"])
def test_overlap_presets_add_the_branches_flag_to_their_base(base):
    """`<base>-overlap` is its base preset with the split path's branches overlapped, nothing else changed."""
    budget = ExpertBudget((V4_LAYER,) * 8, 14 * GIB)
    b = preset(base, budget, plan="p.json", upload_min=256)
    o = preset(f"{base}-overlap", budget, plan="p.json", upload_min=256)
    assert o.name == f"{base}-overlap" and o.variant == b.variant == "ostinato" and o.env == b.env
    assert o.server_args == b.server_args + ("--residency-branches", "overlap")
    assert PLAN_RULES[o.name] == PLAN_RULES[base]


def test_cpu_and_gpu_experts_presets():
    budget = ExpertBudget((100,) * 4)
    assert "--cpu-moe" in preset("llama.cpp-cpu-experts", budget).server_args
    assert preset("llama.cpp-gpu-experts", budget).server_args == ("-ngl", "99")
    with pytest.raises(ValueError, match="needs every expert on the GPU"):
        preset("llama.cpp-gpu-experts", ExpertBudget((100,) * 4, 250))


def test_overrides_and_unknown_names():
    cfg = preset("llama.cpp-layers", ExpertBudget((100,) * 4, 200), variant="ostinato",
                 extra_args=("-t", "16"), extra_env={"X": "1"})
    assert cfg.variant == "ostinato" and cfg.server_args[-2:] == ("-t", "16") and cfg.env["X"] == "1"
    with pytest.raises(ValueError, match="engine preset 'buun'"):
        preset("buun", ExpertBudget((100,) * 4))


def test_budget_read_from_a_gguf(tiny_v4_model, llama_tree):
    budget = expert_budget_from_gguf(tiny_v4_model, llama_tree, None)
    # tiny-v4: 4 MoE layers of 16 experts, gate/up/down 64x64 in F32
    assert budget.layer_bytes == (3 * 16 * 64 * 64 * 4,) * 4
    assert expert_budget_from_gguf(tiny_v4_model, llama_tree, budget.layer_bytes[0] * 3).layers_on_gpu() == 3


def test_replay_run_preset_flags(tiny_v4_model, llama_tree, tmp_path):
    import argparse

    from ostinato.replay.cli import _engine_preset

    ns = argparse.Namespace(preset="llama.cpp-layers", expert_budget_gib=(3 * 16 * 64 * 64 * 4 * 2.5) / (1 << 30),
                            llama_tree=llama_tree, model=tiny_v4_model, engine_name="layers", resident_share=None,
                            expert_capacity=None, plan=None, upload_min=512, borrow_params=None)
    cfg = _engine_preset(ns)
    assert cfg.server_args == ("-ngl", "99", "--n-cpu-moe", "2") and "GGML_OP_OFFLOAD_MIN_BATCH" in cfg.env
    with pytest.raises(ValueError, match="--llama-tree"):
        _engine_preset(argparse.Namespace(**{**vars(ns), "llama_tree": None}))
    with pytest.raises(ValueError, match="needs --preset"):
        _engine_preset(argparse.Namespace(**{**vars(ns), "preset": None}))
    assert _engine_preset(argparse.Namespace(**{**vars(ns), "preset": None, "expert_budget_gib": None})).server_args == ()
    # the budget as a share of all routed-expert bytes: half of 4 equal layers is 2 layers on the GPU
    half = argparse.Namespace(**{**vars(ns), "expert_budget_gib": None, "resident_share": 0.5})
    assert _engine_preset(half).server_args == ("-ngl", "99", "--n-cpu-moe", "2")
    assert _engine_preset(argparse.Namespace(**{**vars(half), "resident_share": 1.0})).server_args[-1] == "0"
    with pytest.raises(ValueError, match="give one"):
        _engine_preset(argparse.Namespace(**{**vars(half), "expert_budget_gib": 1.0}))
    with pytest.raises(ValueError, match=r"--resident-share 1.5: expected a share in \[0, 1\]"):
        _engine_preset(argparse.Namespace(**{**vars(half), "resident_share": 1.5}))
    with pytest.raises(ValueError, match="--resident-share needs --preset"):
        _engine_preset(argparse.Namespace(**{**vars(half), "preset": None}))
    # the budget from a capacity test: room for 3 of the 4 layers' experts
    cap = tmp_path / "capacity.json"
    cap.write_text(json.dumps({"layer_gpu": [0] * 5, "terms": [], "pool_bytes": [3 * 16 * 64 * 64 * 4 * 3],
                               "slots": [192], "expert_bytes": [64 * 64 * 4 * 3] * 4, "notes": []}))
    by_cap = argparse.Namespace(**{**vars(half), "resident_share": None, "expert_capacity": cap})
    assert _engine_preset(by_cap).server_args == ("-ngl", "99", "--n-cpu-moe", "1")
    with pytest.raises(FileNotFoundError, match="--expert-capacity"):
        _engine_preset(argparse.Namespace(**{**vars(by_cap), "expert_capacity": cap.with_name("none.json")}))
    with pytest.raises(ValueError, match="--resident-share, --expert-capacity: each sets the budget"):
        _engine_preset(argparse.Namespace(**{**vars(by_cap), "resident_share": 0.5}))


@pytest.mark.parametrize("name,flags,offload", [
    ("llama.cpp-expert-cache", ("--residency-policy", "lru", "--residency-cache-max-pass", "32"), True),
    ("buun", ("--residency-policy", "decay"), True),
    ("ktransformers-placement", ("--residency-upload-min", str(2**31 - 1)), False),
])
def test_baseline_policy_presets_use_the_pools(name, flags, offload):
    from ostinato.presets import PLAN_RULES, POLICY_PRESETS

    cfg = preset(name, ExpertBudget((V4_LAYER,) * 8, 14 * GIB), plan="p.json")
    assert cfg.variant == "ostinato" and name in POLICY_PRESETS
    assert cfg.server_args == ("-ngl", "99", "--residency-plan", "p.json") + flags
    assert (cfg.env == {"GGML_OP_OFFLOAD_MIN_BATCH": str(OP_OFFLOAD_MIN_BATCH)}) == offload
    assert cfg.description.startswith("(policy, implemented here)")
    assert PLAN_RULES[name] == ("uniform" if name == "ktransformers-placement" else "frequency")
    with pytest.raises(ValueError, match="needs a residency plan"):
        preset(name, ExpertBudget((100,) * 4))


def test_borrow_preset_is_the_overlap_preset_with_borrowed_memory():
    """`ostinato-borrow` (Figure 8c's step 4 on this engine) adds borrowed memory to `ostinato-overlap`, nothing else."""
    budget = ExpertBudget((V4_LAYER,) * 8, 14 * GIB)
    o = preset("ostinato-overlap", budget, plan="p.json", upload_min=256)
    b = preset("ostinato-borrow", budget, plan="p.json", upload_min=256)
    assert b.name == "ostinato-borrow" and b.variant == "ostinato" and b.env == o.env == {}
    assert b.server_args == o.server_args + ("--residency-borrow", "all")
    assert PLAN_RULES["ostinato-borrow"] == "frequency"


def test_borrow_preset_takes_the_parameters_chosen_on_development_sessions():
    budget = ExpertBudget((V4_LAYER,) * 8, 14 * GIB)
    tuned = {"slots": 256, "decay": 0.98, "margin": 0.5, "admit": 4, "hit_share": 0.4}
    b = preset("ostinato-borrow", budget, plan="p.json", upload_min=256, borrow=tuned)
    o = preset("ostinato-overlap", budget, plan="p.json", upload_min=256)
    assert b.server_args == o.server_args + ("--residency-borrow", "256", "--residency-borrow-decay", "0.98",
                                             "--residency-borrow-margin", "0.5", "--residency-borrow-admit", "4")
    assert "development sessions" in b.description
    with pytest.raises(ValueError, match="apply to ostinato-borrow, ostinato-graph-borrow only"):
        preset("ostinato", budget, plan="p.json", borrow=tuned)
    g = preset("ostinato-graph-borrow", budget, plan="p.json", upload_min=256, borrow=tuned)
    assert g.name == "ostinato-graph-borrow" and g.server_args == (
        preset("ostinato-graph", budget, plan="p.json", upload_min=256).server_args + b.server_args[len(o.server_args):])


def test_graph_presets_make_decode_one_graph_per_gpu():
    """`ostinato-graph` (Figure 8c's steps 2 and 3) adds one graph per decode step to `ostinato-overlap`, and
    `ostinato-graph-borrow` (step 4 on it) borrowed memory to `ostinato-graph`, nothing else."""
    budget = ExpertBudget((V4_LAYER,) * 8, 14 * GIB)
    o = preset("ostinato-overlap", budget, plan="p.json", upload_min=256)
    g = preset("ostinato-graph", budget, plan="p.json", upload_min=256)
    gb = preset("ostinato-graph-borrow", budget, plan="p.json", upload_min=256)
    assert g.server_args == o.server_args + ("--residency-graph", "step") and g.variant == "ostinato" and g.env == {}
    assert gb.server_args == g.server_args + ("--residency-borrow", "all") and gb.env == {}
    assert PLAN_RULES["ostinato-graph"] == PLAN_RULES["ostinato-graph-borrow"] == "frequency"


def test_replay_cli_reads_the_borrow_tune_json(tmp_path, monkeypatch):
    import argparse

    from ostinato.replay import cli as rcli

    monkeypatch.setattr(rcli, "resolve_budget", lambda *a: ExpertBudget((V4_LAYER,) * 8, 14 * GIB))
    args = argparse.Namespace(preset="ostinato-borrow", engine_name="b", expert_budget_gib=None, resident_share=0.5,
                              expert_capacity=None, llama_tree=tmp_path, model=tmp_path / "m.gguf", plan="p.json",
                              upload_min=512, borrow_params=str(tmp_path / "b.json"))
    (tmp_path / "b.json").write_text('{"chosen": {"slots": 8, "decay": 0.9, "margin": 0.25, "admit": 2}}')
    assert rcli._engine_preset(args).server_args[-8:] == (
        "--residency-borrow", "8", "--residency-borrow-decay", "0.9", "--residency-borrow-margin", "0.25",
        "--residency-borrow-admit", "2")
    (tmp_path / "b.json").write_text('{"grid": []}')
    with pytest.raises(ValueError, match="'chosen' holds slots, decay, margin and admit"):
        rcli._engine_preset(args)


def test_the_config_schema_accepts_every_preset_by_name():
    """sweep.engines and replay.engines.<engine>.preset list exactly the presets: one left out of an enum makes
    snakemake refuse a config that names it (the floor, llama.cpp-gpu-experts, was refused on the GPU that way)."""
    schema = yaml.safe_load((Path(__file__).resolve().parents[1] / "workflow/schemas/config.schema.yaml").read_text())
    sweep = schema["properties"]["sweep"]["properties"]["engines"]["items"]["enum"]
    replay = schema["properties"]["replay"]["properties"]["engines"]["additionalProperties"]["properties"]["preset"]["enum"]
    assert sorted(sweep) == sorted(PRESETS) and sorted(replay) == sorted(PRESETS)
