# Stage calibrate: the cost model's constants on this machine, measured with the `ostinato` engine on the replayed
# model (a resident pool of calibrate.resident_share, routing forced to r = 0..k cold routes per token and layer);
# gamma0 and G come from calibrate.base_profile and the profile says so. Runs alone: it is timed work. The calibrate
# notebook shows this run's constants beside the reference machine's.


rule calibrate:
    input:
        server=engine_bin("ostinato"),
        model=f"models/{REPLAY_MODEL}.gguf",
        tree=f"{ENGINE_DIR}/stock/manifest.json",
    output:
        profile="results/calibrate/profile.yaml",
        sim_params="results/calibrate/sim-params.yaml",
        fit="results/calibrate/fit.json",
        rows="results/calibrate/rows.csv",
        timers="results/calibrate/timers.csv",
        uploads="results/calibrate/uploads.csv",
    log:
        "results/calibrate/calibrate.log",
    benchmark:
        "results/calibrate/calibrate.benchmark.tsv"
    conda:
        "../../environment.yml"
    threads: ALL_CORES
    resources:
        bench=1,
        **ENGINE_GPU,
    params:
        opts=lambda w: calibrate_opts(),
        machine=MACHINE,
        tree=f"{ENGINE_DIR}/tree",
        variants=lambda w, input: str(Path(input.server).parents[2]),
        model_name=REPLAY_MODEL,
    shell:
        "ostinato calibrate --model {input.model} --llama-tree {params.tree} --variants-dir {params.variants} "
        "--machine '{params.machine}' --model-name {params.model_name} --threads {threads} {params.opts} "
        "--out results/calibrate > {log} 2>&1"


rule write_calibrate_params:
    output:
        "results/calibrate/calibrate.params.yaml",
    log:
        "results/calibrate/write_calibrate_params.log",
    benchmark:
        "results/calibrate/write_calibrate_params.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        fits=yaml_list(f for f, _ in calibrate_sources()),
        series=json.dumps([m for _, m in calibrate_sources()]),
        machine=MACHINE,
    shell:
        "ostinato figures params --out {output} --set 'fits={params.fits}' --set 'series={params.series}' "
        "--set 'machine={params.machine}' --set figures_dir=figures --set tables_dir=tables "
        "--set output_stem=calibrate > {log} 2>&1"


rule render_calibrate:
    input:
        notebook="notebooks/calibrate.ipynb",
        params="results/calibrate/calibrate.params.yaml",
        fits=[f for f, _ in calibrate_sources()],
    output:
        notebook="results/calibrate/calibrate.ipynb",
        **reported_notebook_outputs("calibrate"),
    log:
        "results/calibrate/render_calibrate.log",
    benchmark:
        "results/calibrate/render_calibrate.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        machine=MACHINE,  # the label of this run's measured series, for the report's caption
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"
