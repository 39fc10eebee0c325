# Stage 6, plan: routing profile of the development sessions → capacity test (memory model) → frequency-ranked
# residency plan (Prop 3.1) the engine loads, with its summary; plus the cost model's checks against the paper.


rule routing_profile:
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
        memory=config["plan"]["memory"],
        sessions=f"results/sessions/{config['plan']['dev_set']}.jsonl",
    output:
        "results/plan/capacity.json",
    log:
        "results/plan/capacity.log",
    conda:
        "../../environment.yml"
    shell:
        "ostinato residency capacity --memory {input.memory} --kv-tokens-from {input.sessions} "
        "--out {output} > {log} 2>&1"


rule plan:
    input:
        profile=f"results/profile/{config['plan']['dev_set']}.profile.json",
        heldout=([f"results/profile/{config['plan']['heldout_set']}.profile.json"]
                 if config["plan"].get("heldout_set") else []),
        capacity="results/plan/capacity.json",
    output:
        plan="results/plan/plan.json",
        summary="results/plan/summary.json",
    log:
        "results/plan/plan.log",
    conda:
        "../../environment.yml"
    params:
        heldout=lambda w, input: f"--heldout {input.heldout}" if input.heldout else "",
        model=config["plan"].get("model_name", ""),
    shell:
        "ostinato residency plan --profile {input.profile} --capacity {input.capacity} {params.heldout} "
        "--model-name '{params.model}' --out {output.plan} --summary {output.summary} > {log} 2>&1"


rule costmodel_check:
    output:
        "results/costmodel/checks-{profile}.json",
    log:
        "results/costmodel/checks-{profile}.log",
    conda:
        "../../environment.yml"
    shell:
        "ostinato costmodel check --profile {wildcards.profile} --out {output} > {log} 2>&1"
