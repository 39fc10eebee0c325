# Stage 9, calibrate: the cost model's constants on this machine, measured with the `ostinato` engine on the replayed
# model (a resident pool of calibrate.expert_fraction, routing forced to r = 0..k cold routes per token and layer);
# gamma0 and G come from calibrate.base_profile and the profile says so. Runs alone: it is timed work.


rule calibrate:
    input:
        server=engine_bin("ostinato"),
        model=f"models/{config['replay']['model']}.gguf",
        tree=f"{ENGINE_DIR}/stock/manifest.json",
    output:
        profile="results/calibrate/profile.yaml",
        sim_params="results/calibrate/sim-params.yaml",
        fit="results/calibrate/fit.json",
        rows="results/calibrate/rows.csv",
        uploads="results/calibrate/uploads.csv",
    log:
        "results/calibrate/calibrate.log",
    conda:
        "../../environment.yml"
    threads: workflow.cores
    resources:
        bench=1,
    params:
        opts=calibrate_opts(),
        machine=MACHINE,
        tree=f"{ENGINE_DIR}/tree",
        variants=lambda w, input: str(Path(input.server).parents[2]),
        model_name=config["replay"]["model"],
    shell:
        "ostinato bench calibrate --model {input.model} --llama-tree {params.tree} --variants-dir {params.variants} "
        "--machine '{params.machine}' --model-name {params.model_name} --threads {threads} {params.opts} "
        "--out results/calibrate > {log} 2>&1"
