# Stage 1, engine: the pinned llama.cpp with the patch series, built as variants upstream, stock, ostinato.
from ostinato.build.patches import STAGES, stage_inputs
from pathlib import Path as _Path


rule build_engine:
    input:
        stage_inputs(_Path("engine"), "ostinato"),
    output:
        expand("{d}/{v}/bin/{t}", d=ENGINE_DIR, v=STAGES, t=["llama-server", "llama-bench"]),
        expand("{d}/{v}/manifest.json", d=ENGINE_DIR, v=STAGES),
    log:
        "results/engine/build_engine.log",
    conda:
        "../../environment.yml"
    threads: workflow.cores
    params:
        backend=BACKEND.name,
        cuda_arch=f"--cuda-arch {config['engine']['cuda_arch']}" if config["engine"]["cuda_arch"] else "",
        sdist=f"--sdist {config['engine']['sdist']}" if config["engine"]["sdist"] else "",
        jobs=lambda wildcards, threads: config["engine"]["jobs"] or threads,
    shell:
        "ostinato engine build --backend {params.backend} {params.cuda_arch} {params.sdist} "
        "--jobs {params.jobs} --out build/engine --log {log} >> {log} 2>&1"
