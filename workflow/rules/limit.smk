# Stage limit: the computed limit on decode (seed 004: Belady's MIN with bypass for a GPU expert cache of the plan's
# size, starting from the plan's experts) on every simulated trace set; the sim_validation notebook shows decode of
# each simulated engine as a multiple of it.


rule compute_limit:
    input:
        routing="results/routing/{set}",
        plan="results/residency/plan.json",
        params="results/sim/{set}/params.json",
    output:
        "results/limit/{set}.json",
    log:
        "results/limit/{set}.log",
    benchmark:
        "results/limit/{set}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(SIM["sets"]),
    params:
        slots=lambda w, input: plan_total_slots(input.plan),
        read_gbps=config["limit"]["read_gbps"],
    shell:
        "ostinato limit --trace {input.routing}/*.route --sessions {input.routing}/manifest.json --decode-only "
        "--slots {params.slots} --initial-plan {input.plan} --read-gbps {params.read_gbps} "
        "--other-ms-from {input.params} --out {output} > {log} 2>&1"
