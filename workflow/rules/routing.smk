# Stage routing: synthetic routing traces calibrated to the paper's routing facts (one file per session, the engine's
# record/force format, flagged synthetic), their Section 2.3 statistics and the notebook; and the same statistics of
# the routing the stock engine records on the replayed model (routing.recorded: a synthesized model's own router,
# e.g. `router: calibrated`, measured on held-out sessions against the development set its plans rank by).


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


rule compute_recorded_routing_stats:
    input:
        unpack(recorded_routing_inputs),
    output:
        "results/routing/recorded/{model}.stats.json",
    log:
        "results/routing/recorded/{model}.stats.log",
    benchmark:
        "results/routing/recorded/{model}.stats.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        model=name_pattern([REPLAY_MODEL]),
    params:
        decode=ROUTING["stats"]["n_resident_decode"],
        prefill=ROUTING["stats"]["n_resident_prefill"],
        heldout=lambda w, input: " ".join(f"{d}/routing" for d in input.heldout),
        label=lambda w: recorded_routing_label(w.model),
    shell:
        "ostinato routing stats --dev {input.dev}/routing --dev-sessions {input.dev_sessions} "
        "--heldout {params.heldout} --heldout-sessions {input.heldout_sessions} --n-resident-decode {params.decode} "
        "--n-resident-prefill {params.prefill} --paper-shares --label '{params.label}' --out {output} > {log} 2>&1"


rule write_recorded_routing_stats_params:
    output:
        "results/routing/recorded/routing_stats_recorded.params.yaml",
    log:
        "results/routing/recorded/write_routing_stats_recorded_params.log",
    benchmark:
        "results/routing/recorded/write_routing_stats_recorded_params.benchmark.tsv"
    conda:
        "../../environment.yml"
    shell:
        f"ostinato figures params --out {{output}} --set 'stats_json=[results/routing/recorded/{REPLAY_MODEL}.stats.json]' "
        "--set figures_dir=figures --set tables_dir=tables --set output_stem=routing_stats_recorded > {log} 2>&1"


rule render_recorded_routing_stats:
    input:
        notebook="notebooks/routing_stats.ipynb",
        params="results/routing/recorded/routing_stats_recorded.params.yaml",
        stats=f"results/routing/recorded/{REPLAY_MODEL}.stats.json",
    output:
        notebook="results/routing/recorded/routing_stats_recorded.ipynb",
        **notebook_outputs("routing_stats_recorded"),
    log:
        "results/routing/recorded/render_routing_stats_recorded.log",
    benchmark:
        "results/routing/recorded/render_routing_stats_recorded.benchmark.tsv"
    conda:
        "../../environment.yml"
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"
