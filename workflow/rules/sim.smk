# Stage sim: the trace-driven simulator replays trace sets through the cost model of every engine policy on one
# machine profile (data/profiles/), with the residency stage's plan; the validation notebook puts the simulated
# engines beside the paper's Tables 3, 7 and 8, Figure 7a and the cost model's checks, and decode beside the
# computed limit (stage limit).


rule simulate:
    input:
        routing="results/routing/{set}",
        plan="results/residency/plan.json",
        sim_params=SIM["params"] or [],
    output:
        requests="results/sim/{set}/requests.csv",
        sessions="results/sim/{set}/sessions.csv",
        params="results/sim/{set}/params.json",
    log:
        "results/sim/{set}.log",
    benchmark:
        "results/sim/{set}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(SIM["sets"]),
    params:
        opts=lambda w, input: sim_opts(input),
    shell:
        "ostinato sim run --routing-dir {input.routing} --plan {input.plan} {params.opts} "
        "--out-requests {output.requests} --out-sessions {output.sessions} --params-out {output.params} > {log} 2>&1"


rule write_sim_validation_params:
    output:
        "results/sim/sim_validation.params.yaml",
    log:
        "results/sim/write_sim_validation_params.log",
    benchmark:
        "results/sim/write_sim_validation_params.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        sessions=yaml_list(f"results/sim/{s}/sessions.csv" for s in SIM["sets"]),
        requests=yaml_list(f"results/sim/{s}/requests.csv" for s in SIM["sets"]),
        limits=yaml_list(f"results/limit/{s}.json" for s in SIM["sets"]),
        sets=yaml_list(SIM["sets"]),
        workloads=yaml_list(sim_workload(s) for s in SIM["sets"]),
        profile=SIM["profile"],
    shell:
        "ostinato figures params --out {output} --set 'sim_sessions={params.sessions}' "
        "--set 'sim_requests={params.requests}' --set 'limit_json={params.limits}' --set 'sim_sets={params.sets}' "
        "--set 'workloads={params.workloads}' --set profile={params.profile} "
        "--set checks_json=results/costmodel/checks-{params.profile}.json "
        "--set figures_dir=figures --set tables_dir=tables --set output_stem=sim_validation > {log} 2>&1"


rule render_sim_validation:
    input:
        notebook="notebooks/sim_validation.ipynb",
        params="results/sim/sim_validation.params.yaml",
        sessions=expand("results/sim/{set}/sessions.csv", set=SIM["sets"]),
        requests=expand("results/sim/{set}/requests.csv", set=SIM["sets"]),
        limits=expand("results/limit/{set}.json", set=SIM["sets"]),
        checks=[f"results/costmodel/checks-{SIM['profile']}.json"] if SIM["sets"] else [],
    output:
        notebook="results/sim/sim_validation.ipynb",
        **reported_notebook_outputs("sim_validation"),
        **{f"{t}_csv": reported(f"tables/sim_validation_{t}.csv", "sim_validation")
           for t in ("ablation", "checks", "fig7a", "limit", "tool_ttft")},
        **{f"{t}_md": f"tables/sim_validation_{t}.md" for t in ("ablation", "checks", "fig7a", "limit", "tool_ttft")},
    log:
        "results/sim/sim_validation.log",
    benchmark:
        "results/sim/sim_validation.benchmark.tsv"
    conda:
        "../../environment.yml"
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"
