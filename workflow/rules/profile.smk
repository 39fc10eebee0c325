# Stage 5, profile (engine-recorded): the stock engine replays the development sessions on the replayed model
# with routing recording on; the recorded traces give the route counts that plan the ostinato engine's pools
# (`plan_replay_residency` in plan.smk). Synthetic trace sets are counted by `profile_routing` (plan.smk).


rule record_routing:
    input:
        server=engine_bin("stock"),
        model=f"models/{config['replay']['model']}.gguf",
        sessions="results/sessions/{set}.jsonl",
    output:
        routing=directory("results/profile/recorded/{set}/routing"),
    log:
        "results/profile/recorded/{set}.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(config["sessions"]["sets"]),
    threads: workflow.cores
    resources:
        bench=1,
    params:
        server_args=" ".join(f"--server-arg={a}" for a in ["-c", str(config["replay"]["ctx_size"]),
                                                              "-t", str(config["replay"]["threads"])]),
        machine=MACHINE,
    shell:
        "ostinato replay run --engine-name record --server-bin {input.server} --model {input.model} "
        "--sessions {input.sessions} --out results/profile/recorded/{wildcards.set}/replay "
        "--routing-record-dir {output.routing} --machine-label {params.machine} {params.server_args} "
        "--no-progress --on-setup-change restart > {log} 2>&1"


rule profile_recorded_routing:
    input:
        routing="results/profile/recorded/{set}/routing",
    output:
        "results/profile/{set}.recorded.profile.json",
    log:
        "results/profile/{set}.recorded.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(config["sessions"]["sets"]),
    shell:
        "ostinato residency profile --trace {input.routing}/*.route --out {output} > {log} 2>&1"
