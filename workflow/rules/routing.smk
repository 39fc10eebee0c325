# Stage routing: synthetic routing traces calibrated to the paper's routing facts (one file per session, the engine's
# record/force format, flagged synthetic), their Section 2.3 statistics and the notebook.


rule make_routing:
    input:
        unpack(routing_inputs),
    output:
        directory("results/routing/{set}"),
    log:
        "results/routing/{set}.log",
    benchmark:
        "results/routing/{set}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(routing_sets()),
    params:
        opts=lambda w: routing_generate_opts(w.set),
    shell:
        "ostinato routing generate {params.opts} --out {output} --no-progress > {log} 2>&1"


rule compute_routing_stats:
    input:
        dev=routing_stats_dirs("dev"),
        heldout=routing_stats_dirs("heldout"),
    output:
        "results/routing/stats.json",
    log:
        "results/routing/stats.log",
    benchmark:
        "results/routing/stats.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        decode=ROUTING["stats"]["n_resident_decode"],
        prefill=ROUTING["stats"]["n_resident_prefill"],
    shell:
        "ostinato routing stats --dev {input.dev} --heldout {input.heldout} --n-resident-decode {params.decode} "
        "--n-resident-prefill {params.prefill} --out {output} > {log} 2>&1"


rule write_routing_stats_params:
    output:
        "results/routing/routing_stats.params.yaml",
    log:
        "results/routing/write_routing_stats_params.log",
    benchmark:
        "results/routing/write_routing_stats_params.benchmark.tsv"
    conda:
        "../../environment.yml"
    shell:
        "ostinato figures params --out {output} --set 'stats_json=[results/routing/stats.json]' "
        "--set figures_dir=figures --set tables_dir=tables --set output_stem=routing_stats > {log} 2>&1"


rule render_routing_stats:
    input:
        notebook="notebooks/routing_stats.ipynb",
        params="results/routing/routing_stats.params.yaml",
        stats="results/routing/stats.json",
    output:
        notebook="results/routing/routing_stats.ipynb",
        **reported_notebook_outputs("routing_stats"),
    log:
        "results/routing/render_routing_stats.log",
    benchmark:
        "results/routing/render_routing_stats.benchmark.tsv"
    conda:
        "../../environment.yml"
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"
