# Stage 6, plan: routing profile of the development sessions → capacity test (memory model) → frequency-ranked
# residency plan (Prop 3.1), with its summary; plus the cost model's checks against the paper's constants.
# The profile is counted from routing traces (synthetic, or recorded by the engine).


rule profile_routing:
    input:
        routing="results/routing/{set}",  # one <session, / → __>.route per session (routing stage)
    output:
        "results/profile/{set}.profile.json",
    log:
        "results/profile/{set}.log",
    conda:
        "../../environment.yml"
    shell:
        "ostinato residency profile --trace {input.routing}/*.route --out {output} > {log} 2>&1"


rule capacity:
    input:
        memory=config["plan"].get("memory") or [],
        sessions=f"results/sessions/{config['plan'].get('kv_set', '')}.jsonl" if config["plan"].get("kv_set") else [],
    output:
        "results/plan/capacity.json",
    log:
        "results/plan/capacity.log",
    conda:
        "../../environment.yml"
    params:
        kv=lambda w, input: f"--kv-tokens-from {input.sessions}" if input.sessions else "",
    shell:
        "ostinato residency capacity --memory {input.memory} {params.kv} --out {output} > {log} 2>&1"


rule plan_residency:
    input:
        unpack(plan_inputs),
    output:
        plan="results/plan/plan.json",
        summary="results/plan/summary.json",
    log:
        "results/plan/plan.log",
    conda:
        "../../environment.yml"
    params:
        opts=lambda w, input: plan_opts(input),
        model=config["plan"].get("model_name", ""),
    shell:
        "ostinato residency plan --profile {input.profile} {params.opts} "
        "--model-name '{params.model}' --out {output.plan} --summary {output.summary} > {log} 2>&1"


rule costmodel_check:
    output:
        "results/costmodel/checks-{profile}.json",
    log:
        "results/costmodel/checks-{profile}.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        profile=name_pattern(config.get("costmodel", {}).get("profiles", [])),
    shell:
        "ostinato costmodel check --profile {wildcards.profile} --out {output} > {log} 2>&1"


rule plan_replay_residency:
    input:
        profile=lambda w: f"results/profile/{config['replay']['residency']['dev_set']}.recorded.profile.json",
        model="models/{model}.gguf",
        tree=f"{ENGINE_DIR}/stock/manifest.json",
        capacity=lambda w: replay_capacity() or [],
    output:
        plan="results/plan/replay/{model}.plan.json",
        summary="results/plan/replay/{model}.summary.json",
    log:
        "results/plan/replay/{model}.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        model=name_pattern([config["replay"]["model"]]),
    params:
        size=lambda w, input: (f"--capacity {input.capacity}" if input.capacity else
                               f"--resident-share {config['replay'].get('residency', {}).get('resident_share', 0.5)}"),
        tree=f"{ENGINE_DIR}/tree",
    shell:
        "ostinato residency plan --profile {input.profile} --gguf {input.model} --llama-tree {params.tree} "
        "{params.size} --model-name {wildcards.model} --out {output.plan} "
        "--summary {output.summary} > {log} 2>&1"


rule check_memory_model:
    input:
        server=engine_bin("stock"),
        model="models/{model}.gguf",
        tree=f"{ENGINE_DIR}/stock/manifest.json",
    output:
        memory="results/plan/memory/{model}.memory.yaml",
        report="results/plan/memory/{model}.check.json",
    log:
        "results/plan/memory/{model}.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        model=name_pattern([config["replay"]["model"]]),
    threads: workflow.cores
    params:
        opts=memory_opts(),
        tree=f"{ENGINE_DIR}/tree",
    shell:
        "ostinato residency memory --model {input.model} --llama-tree {params.tree} --server-bin {input.server} "
        "{params.opts} --log-dir results/plan/memory/{wildcards.model}-servers --out {output.memory} "
        "--report {output.report} > {log} 2>&1"


rule capacity_replay_model:
    input:
        memory="results/plan/memory/{model}.memory.yaml",
        sessions=f"results/sessions/{config['replay'].get('residency', {}).get('dev_set', '')}.jsonl",
    output:
        "results/plan/memory/{model}.capacity.json",
    log:
        "results/plan/memory/{model}.capacity.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        model=name_pattern([config["replay"]["model"]]),
    shell:
        "ostinato residency capacity --memory {input.memory} --kv-tokens-from {input.sessions} --out {output} "
        "> {log} 2>&1"
