# Stage engine: the pinned llama.cpp with the patch series, built as the variants the pipeline runs (stock and
# ostinato, and upstream only when a replay engine asks for it; the test suite builds all three).


rule build_engine:
    input:
        stage_inputs(Path("engine"), "ostinato"),
    output:
        expand("{d}/{v}/bin/{t}", d=ENGINE_DIR, v=PIPELINE_VARIANTS, t=["llama-server", "llama-bench"]),
        expand("{d}/{v}/manifest.json", d=ENGINE_DIR, v=PIPELINE_VARIANTS),
    log:
        "results/engine/build_engine.log",
    benchmark:
        "results/engine/build_engine.benchmark.tsv"
    conda:
        "../../environment.yml"
    threads: ALL_CORES
    resources:
        **ENGINE_GPU,
    params:
        backend=BACKEND.name,
        cuda_arch=f"--cuda-arch {config['engine']['cuda_arch']}" if config["engine"]["cuda_arch"] else "",
        sdist=(f"--source-tarball {config['engine']['source_tarball']}" if config["engine"]["source_tarball"] else
               f"--sdist {config['engine']['sdist']}" if config["engine"]["sdist"] else ""),
        jobs=lambda wildcards, threads: config["engine"]["jobs"] or threads,
        variants=",".join(PIPELINE_VARIANTS),
    shell:
        "ostinato engine build --backend {params.backend} --variants {params.variants} {params.cuda_arch} "
        "{params.sdist} --jobs {params.jobs} --out build/engine --log {log} >> {log} 2>&1"
