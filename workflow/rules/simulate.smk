# Stage 9, simulate: the cost model replays the held-out sessions and their routing for a machine profile,
# for every engine policy; predicted TTFT/TPOT/totals per request and per session.


rule simulate:
    input:
        sessions="results/sessions/{set}.jsonl",
        routing="results/routing/{set}",
        plan="results/plan/plan.json",
        sim_params=([config["simulate"]["sim_params"]] if config["simulate"].get("sim_params") else []),
    output:
        requests="results/simulate/{set}/{profile}.requests.csv",
        sessions="results/simulate/{set}/{profile}.sessions.csv",
        params="results/simulate/{set}/{profile}.params.json",
    log:
        "results/simulate/{set}/{profile}.log",
    conda:
        "../../environment.yml"
    params:
        model=config["simulate"]["model"],
        policies=",".join(config["simulate"]["policies"]),
        sim_params=lambda w, input: f"--sim-params {input.sim_params}" if input.sim_params else "",
    shell:
        "ostinato sim run --sessions {input.sessions} --routing-dir {input.routing} --plan {input.plan} "
        "--profile {wildcards.profile} --model {params.model} {params.sim_params} --policies {params.policies} "
        "--out-requests {output.requests} --out-sessions {output.sessions} --params-out {output.params} "
        "> {log} 2>&1"
