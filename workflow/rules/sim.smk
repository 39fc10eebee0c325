# Stage 7, simulate: the trace-driven simulator replays trace sets through the cost model of every engine policy
# on one machine profile (data/profiles/), with the plan stage's residency plan; the validation notebook puts the
# simulated engines beside the paper's Tables 3, 7 and 8, Figure 7a and the cost model's checks, and decode beside
# the computed limit (compute_limit).
check_sim_config()


rule simulate:
    input:
        routing="results/routing/{set}",
        plan="results/plan/plan.json",
        sim_params=config.get("sim", {}).get("params") or [],
    output:
        requests="results/sim/{set}/requests.csv",
        sessions="results/sim/{set}/sessions.csv",
        params="results/sim/{set}/params.json",
    log:
        "results/sim/{set}.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(sim_cfg("sets", [])),
    params:
        opts=lambda w, input: sim_opts(input),
    shell:
        "ostinato sim run --routing-dir {input.routing} --plan {input.plan} {params.opts} "
        "--out-requests {output.requests} --out-sessions {output.sessions} --params-out {output.params} > {log} 2>&1"


rule compute_limit:
    input:
        routing="results/routing/{set}",
        plan="results/plan/plan.json",
        params="results/sim/{set}/params.json",
    output:
        "results/sim/{set}/limit.json",
    log:
        "results/sim/{set}/limit.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(sim_cfg("sets", [])),
    params:
        slots=lambda w, input: plan_total_slots(input.plan),
        read_gbps=sim_cfg("read_gbps", 87.0),
    shell:
        "ostinato limit --trace {input.routing}/*.route --sessions {input.routing}/manifest.json --decode-only "
        "--slots {params.slots} --initial-plan {input.plan} --read-gbps {params.read_gbps} "
        "--other-ms-from {input.params} --out {output} > {log} 2>&1"


rule write_sim_validation_params:
    output:
        "results/sim/sim_validation.params.yaml",
    log:
        "results/sim/write_sim_validation_params.log",
    conda:
        "../../environment.yml"
    params:
        sessions=yaml_list(f"results/sim/{s}/sessions.csv" for s in sim_cfg("sets", [])),
        requests=yaml_list(f"results/sim/{s}/requests.csv" for s in sim_cfg("sets", [])),
        limits=yaml_list(f"results/sim/{s}/limit.json" for s in sim_cfg("sets", [])),
        sets=yaml_list(sim_cfg("sets", [])),
        workloads=yaml_list(sim_workload(s) for s in sim_cfg("sets", [])),
        profile=sim_cfg("profile", "paper-4x4090d"),
    shell:
        "ostinato figures params --out {output} --set 'sim_sessions={params.sessions}' "
        "--set 'sim_requests={params.requests}' --set 'limit_json={params.limits}' --set 'sim_sets={params.sets}' --set 'workloads={params.workloads}' "
        "--set profile={params.profile} --set checks_json=results/costmodel/checks-{params.profile}.json "
        "--set figures_dir=figures --set tables_dir=tables --set output_stem=sim_validation > {log} 2>&1"


rule render_sim_validation:
    input:
        notebook="notebooks/sim_validation.ipynb",
        params="results/sim/sim_validation.params.yaml",
        sessions=expand("results/sim/{set}/sessions.csv", set=sim_cfg("sets", [])),
        requests=expand("results/sim/{set}/requests.csv", set=sim_cfg("sets", [])),
        limits=expand("results/sim/{set}/limit.json", set=sim_cfg("sets", [])),
        checks=f"results/costmodel/checks-{sim_cfg('profile', 'paper-4x4090d')}.json",
    output:
        notebook="results/sim/sim_validation.ipynb",
        pdf="figures/sim_validation.pdf",
        png="figures/sim_validation.png",
        csv="tables/sim_validation.csv",
        md="tables/sim_validation.md",
        ablation_csv="tables/sim_validation_ablation.csv",
        ablation_md="tables/sim_validation_ablation.md",
        checks_csv="tables/sim_validation_checks.csv",
        checks_md="tables/sim_validation_checks.md",
        fig7a_csv="tables/sim_validation_fig7a.csv",
        fig7a_md="tables/sim_validation_fig7a.md",
        limit_csv="tables/sim_validation_limit.csv",
        limit_md="tables/sim_validation_limit.md",
    log:
        "results/sim/sim_validation.log",
    conda:
        "../../environment.yml"
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"
