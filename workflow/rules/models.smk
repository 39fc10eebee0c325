# Stage models: synthesize a GGUF from a named shape spec, or download real weights with a checksum.


rule synth_model:
    input:
        engine=f"{ENGINE_DIR}/stock/manifest.json",
        ranking=lambda w: router_inputs(w.model),
    output:
        "models/{model}.gguf",
    log:
        "results/models/{model}.log",
    benchmark:
        "results/models/{model}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        model=name_pattern(SYNTH_MODELS),
    threads: min(8, ALL_CORES)
    params:
        tree=f"{ENGINE_DIR}/tree",
        spec=lambda w: config["models"][w.model]["spec"],
        opts=lambda w: synth_opts(w.model),
    shell:
        "ostinato models synth --spec {params.spec} {params.opts} --llama-tree {params.tree} "
        "--workers {threads} --out {output} > {log} 2>&1"


rule download_model:
    output:
        "models/{model}.gguf",
    log:
        "results/models/{model}.log",
    benchmark:
        "results/models/{model}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        model=name_pattern(DOWNLOAD_MODELS),
    params:
        url=lambda w: config["models"][w.model]["url"],
        sha256=lambda w: config["models"][w.model]["sha256"],
    shell:
        "ostinato models download --url {params.url} --sha256 {params.sha256} --out {output} "
        "--no-progress > {log} 2>&1"
