# Stage artifact: the evaluator's verdict. check_local_agent talks to the `ostinato` llama-server (started with the
# replay's plan) through the official OpenAI client, as a local agent would; check_claims evaluates every check of
# artifact/claims.yaml on this run's results and the shipped data (tables/claims.{csv,md}, shown first in the report).


rule check_local_agent:
    input:
        server=engine_bin("ostinato"),
        model=f"models/{REPLAY['model']}.gguf",
        plan=f"results/residency/replay/{REPLAY['model']}.{PLAN_RULES['ostinato']}.plan.json",
    output:
        report("results/artifact/local_agent.json", caption="../report/local_agent.rst", category=REPORT_VERDICT,
               subcategory="The local-agent check"),
    log:
        "results/artifact/check_local_agent.log",
    benchmark:
        "results/artifact/check_local_agent.benchmark.tsv"
    conda:
        "../../environment.yml"
    threads: ALL_CORES
    resources:
        **ENGINE_GPU,
    params:
        threads=REPLAY["threads"],
        server=agent_server_args(),
    shell:
        "ostinato artifact agent --server-bin {input.server} --model {input.model} --plan {input.plan} "
        "--threads {params.threads} {params.server} --out {output} > {log} 2>&1"


rule check_claims:
    input:
        claims=ARTIFACT_CLAIMS,
        schema=ARTIFACT_SCHEMA,
        results=claims_inputs,
    output:
        csv=report("tables/claims.csv", caption="../report/claims.rst", category=REPORT_VERDICT,
                   subcategory="Every check"),
        md="tables/claims.md",
        html=report("results/artifact/claims.html", caption="../report/claims.rst", category=REPORT_VERDICT,
                    subcategory="Every check"),
    log:
        "results/artifact/check_claims.log",
    benchmark:
        "results/artifact/check_claims.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        backend=BACKEND.name,
        machine=MACHINE,
        model=REPLAY["model"],
    shell:
        "ostinato artifact check --claims {input.claims} --backend {params.backend} --var 'machine={params.machine}' "
        "--var model={params.model} --csv {output.csv} --md {output.md} --html {output.html} > {log} 2>&1"
