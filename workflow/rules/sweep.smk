# Stage sweep: the input-length sweep of Figure 7b. Each engine of sweep.engines (presets at equal GPU memory for
# experts) prefills a prefix once, then sweep.sizes new tokens after it and decodes forced tokens (`ostinato sweep`,
# routing forced from synthetic traces); the fig7b notebook puts this run beside the paper and the shipped H200 sweep.
# Runs alone: it is timed work.


rule sweep_prefill:
    input:
        stock=engine_bin("stock"),
        ostinato=engine_bin("ostinato"),
        model=f"models/{REPLAY_MODEL}.gguf",
        tree=f"{ENGINE_DIR}/stock/manifest.json",
        borrow=sweep_borrow(),
    output:
        rows="results/sweep/rows.csv",
        summary="results/sweep/summary.json",
        cold="results/sweep/cold.json",
    log:
        "results/sweep/sweep.log",
    benchmark:
        "results/sweep/sweep.benchmark.tsv"
    conda:
        "../../environment.yml"
    threads: ALL_CORES
    resources:
        bench=1,
        **ENGINE_GPU,
    params:
        opts=lambda w: sweep_opts(),
        tree=f"{ENGINE_DIR}/tree",
        variants=lambda w, input: str(Path(input.stock).parents[2]),
    shell:
        "ostinato sweep --model {input.model} --llama-tree {params.tree} --variants-dir {params.variants} "
        "--threads {threads} {params.opts} --out results/sweep --no-progress > {log} 2>&1"


rule write_fig7b_params:
    output:
        "results/sweep/fig7b.params.yaml",
    log:
        "results/sweep/write_fig7b_params.log",
    benchmark:
        "results/sweep/write_fig7b_params.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        machine=MACHINE,
        baseline=lambda w: SWEEP["engines"][0],
        reference=REFERENCE_SWEEP,
        reference_machine=FIGURES["reference_machine"],
    shell:
        "ostinato figures params --out {output} --set summary_json=results/sweep/summary.json "
        "--set 'machine={params.machine}' --set baseline={params.baseline} "
        "--set 'reference_json={params.reference}' --set 'reference_machine={params.reference_machine}' "
        "--set figures_dir=figures --set tables_dir=tables --set output_stem=fig7b > {log} 2>&1"


rule render_fig7b:
    input:
        notebook="notebooks/fig7b.ipynb",
        params="results/sweep/fig7b.params.yaml",
        summary="results/sweep/summary.json",
        reference=REFERENCE_SWEEP or [],
    output:
        notebook="results/sweep/fig7b.ipynb",
        **reported_notebook_outputs("fig7b"),
    log:
        "results/sweep/fig7b.log",
    benchmark:
        "results/sweep/fig7b.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        machine=MACHINE,  # the label of this run's measured series, for the report's caption
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"
