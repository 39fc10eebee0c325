# Stage residency: routing profiles (route counts per layer and expert) → memory model and capacity test → the
# frequency-ranked residency plan (Prop 3.1) with its summary. Two plans: the one of the `residency` config section
# on synthetic traces (the simulator's), and the ones the replayed engines with pools load, planned from the
# routing the stock engine records on the development sessions (`replay.residency`): by frequency (`ostinato`, the
# caches) or uniformly per layer (`ktransformers-placement`); on the same routing, `tune_borrow` chooses the borrowed
# memory's parameters of `ostinato-borrow`.


rule profile_routing:
    input:
        routing="results/routing/{set}",  # one <session, / → __>.route per session (routing stage)
    output:
        "results/residency/profile/{set}.json",
    log:
        "results/residency/profile/{set}.log",
    benchmark:
        "results/residency/profile/{set}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(routing_sets()),
    shell:
        "ostinato residency profile --trace {input.routing}/*.route --out {output} > {log} 2>&1"


rule record_routing:
    input:
        server=engine_bin("stock"),
        model=f"models/{REPLAY_MODEL}.gguf",
        sessions="results/sessions/{set}.jsonl",
    output:
        directory("results/residency/recorded/{set}"),
    log:
        "results/residency/recorded/{set}.log",
    benchmark:
        "results/residency/recorded/{set}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(config["sessions"]["sets"]),
    threads: ALL_CORES
    resources:
        bench=1,
        **ENGINE_GPU,
    params:
        partial="results/residency/recorded/.partial/{set}",  # an interrupted run resumes here; moved when complete
        server_args=f"--server-arg=-c --server-arg={config['replay']['ctx_size']} "
                    f"--server-arg=-t --server-arg={config['replay']['threads']}",
        machine=MACHINE,
    shell:
        "(ostinato replay run --engine-name record --server-bin {input.server} --model {input.model} "
        "--sessions {input.sessions} --out {params.partial}/replay --routing-record-dir {params.partial}/routing "
        "--machine-label {params.machine} {params.server_args} --no-progress --on-setup-change restart "
        "&& mv {params.partial} {output} && rmdir --ignore-fail-on-non-empty $(dirname {params.partial})) > {log} 2>&1"


rule profile_recorded_routing:
    input:
        recorded="results/residency/recorded/{set}",
    output:
        "results/residency/profile/{set}.recorded.json",
    log:
        "results/residency/profile/{set}.recorded.log",
    benchmark:
        "results/residency/profile/{set}.recorded.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(config["sessions"]["sets"]),
    shell:
        "ostinato residency profile --trace {input.recorded}/routing/*.route --out {output} > {log} 2>&1"


rule run_capacity_test:
    input:
        memory=(RESIDENCY["memory_model"] or []) if RESIDENCY else [],
        sessions=f"results/sessions/{RESIDENCY['kv_set']}.jsonl" if RESIDENCY and RESIDENCY["kv_set"] else [],
    output:
        "results/residency/capacity.json",
    log:
        "results/residency/capacity.log",
    benchmark:
        "results/residency/capacity.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        kv=lambda w, input: f"--kv-tokens-from {input.sessions}" if input.sessions else "",
    shell:
        "ostinato residency capacity --memory {input.memory} {params.kv} --out {output} > {log} 2>&1"


rule plan_residency:
    input:
        unpack(residency_inputs),
    output:
        plan="results/residency/plan.json",
        summary="results/residency/summary.json",
    log:
        "results/residency/plan.log",
    benchmark:
        "results/residency/plan.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        opts=lambda w, input: residency_plan_opts(input),
        model=RESIDENCY["model_name"] if RESIDENCY else "",
    shell:
        "ostinato residency plan --profile {input.profile} {params.opts} "
        "--model-name '{params.model}' --out {output.plan} --summary {output.summary} > {log} 2>&1"


rule plan_replay_residency:
    input:
        profile=lambda w: f"results/residency/profile/{REPLAY_RESIDENCY['dev_set']}.recorded.json",
        model="models/{model}.gguf",
        tree=f"{ENGINE_DIR}/stock/manifest.json",
        capacity=lambda w: replay_capacity() or [],
    output:
        plan="results/residency/replay/{model}.{rule}.plan.json",
        summary="results/residency/replay/{model}.{rule}.summary.json",
    log:
        "results/residency/replay/{model}.{rule}.log",
    benchmark:
        "results/residency/replay/{model}.{rule}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        model=name_pattern([REPLAY_MODEL]),
        rule="frequency|uniform",
    params:
        size=lambda w, input: (f"--capacity {input.capacity}" if input.capacity else
                               f"--resident-share {REPLAY_RESIDENCY['resident_share']}"),
        tree=f"{ENGINE_DIR}/tree",
    shell:
        "ostinato residency plan --profile {input.profile} --gguf {input.model} --llama-tree {params.tree} "
        "{params.size} --rule {wildcards.rule} --model-name {wildcards.model} --out {output.plan} "
        "--summary {output.summary} > {log} 2>&1"


rule tune_borrow:
    input:
        plan="results/residency/replay/{model}.frequency.plan.json",
        sessions=lambda w: f"results/sessions/{REPLAY_RESIDENCY['dev_set']}.jsonl",
        recorded=lambda w: f"results/residency/recorded/{REPLAY_RESIDENCY['dev_set']}",
    output:
        "results/residency/replay/{model}.borrow.json",
    log:
        "results/residency/replay/{model}.borrow.log",
    benchmark:
        "results/residency/replay/{model}.borrow.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        model=name_pattern([REPLAY_MODEL]),
    threads: ALL_CORES
    params:
        grid=lambda w: (f"--slots {REPLAY_RESIDENCY['borrow']['slots']} "
                        f"--decay {','.join(map(str, REPLAY_RESIDENCY['borrow']['decay']))} "
                        f"--margin {','.join(map(str, REPLAY_RESIDENCY['borrow']['margin']))} "
                        f"--admit {borrow_admits()} --admission-cost {REPLAY_RESIDENCY['borrow']['admission_cost']} "
                        f"--upload-min {REPLAY_RESIDENCY['upload_min']}"),
    shell:
        "ostinato residency borrow-tune --plan {input.plan} --sessions {input.sessions} "
        "--routing {input.recorded}/routing {params.grid} --jobs {threads} --no-progress --out {output} > {log} 2>&1"


rule check_memory_model:
    input:
        server=engine_bin("stock"),
        model="models/{model}.gguf",
        tree=f"{ENGINE_DIR}/stock/manifest.json",
    output:
        memory="results/residency/memory/{model}.memory.yaml",
        report="results/residency/memory/{model}.check.json",
    log:
        "results/residency/memory/{model}.log",
    benchmark:
        "results/residency/memory/{model}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        model=name_pattern([REPLAY_MODEL]),
    threads: ALL_CORES
    resources:
        **ENGINE_GPU,
    params:
        opts=lambda w: memory_opts(),
        tree=f"{ENGINE_DIR}/tree",
    shell:
        "ostinato residency memory --model {input.model} --llama-tree {params.tree} --server-bin {input.server} "
        "{params.opts} --log-dir results/residency/memory/{wildcards.model}-servers --out {output.memory} "
        "--report {output.report} > {log} 2>&1"


rule run_replay_capacity_test:
    input:
        memory="results/residency/memory/{model}.memory.yaml",
        sessions=f"results/sessions/{REPLAY_RESIDENCY['dev_set']}.jsonl" if REPLAY_RESIDENCY else [],
    output:
        "results/residency/memory/{model}.capacity.json",
    log:
        "results/residency/memory/{model}.capacity.log",
    benchmark:
        "results/residency/memory/{model}.capacity.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        model=name_pattern([REPLAY_MODEL]),
    shell:
        "ostinato residency capacity --memory {input.memory} --kv-tokens-from {input.sessions} --out {output} "
        "> {log} 2>&1"
