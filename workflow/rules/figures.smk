# Stage figures: papermill runs one notebook per paper result (and the replay summary, and predicted against
# measured); the executed notebook is kept as an output. Each renders the paper's numbers, this run's replays, the
# shipped reference replays and the simulator side by side, every series labelled by what it is.


rule write_replay_summary_params:
    output:
        "results/figures/replay_summary.params.yaml",
    log:
        "results/figures/write_replay_summary_params.log",
    benchmark:
        "results/figures/write_replay_summary_params.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        machine=MACHINE,
        engines=yaml_list(REPLAY["engines"]),
    shell:
        "ostinato figures params --out {output} --set summary_csv=results/replay/sessions.csv "
        "--set figures_dir=figures --set tables_dir=tables --set 'machine={params.machine}' "
        "--set 'engines={params.engines}' --set output_stem=replay_summary "
        "--set requests_csv=results/replay/requests.csv > {log} 2>&1"


rule render_replay_summary:
    input:
        notebook="notebooks/replay_summary.ipynb",
        params="results/figures/replay_summary.params.yaml",
        sessions="results/replay/sessions.csv",
        requests="results/replay/requests.csv",
    output:
        notebook="results/figures/replay_summary.ipynb",
        **reported_notebook_outputs("replay_summary"),
        compare_csv=reported("tables/replay_compare.csv", "replay_summary"),
        compare_md="tables/replay_compare.md",
        by_new_tokens_csv="tables/replay_by_new_tokens.csv",
        by_new_tokens_md="tables/replay_by_new_tokens.md",
    log:
        "results/figures/replay_summary.log",
    benchmark:
        "results/figures/replay_summary.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        machine=MACHINE,  # the label of this run's measured series, for the report's caption
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"


rule write_result_params:
    output:
        "results/figures/{result}.params.yaml",
    log:
        "results/figures/write_{result}_params.log",
    benchmark:
        "results/figures/write_{result}_params.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        result=name_pattern(RESULT_NOTEBOOKS),
    params:
        opts=lambda w: result_params(w.result),
    shell:
        "ostinato figures params --out {output} {params.opts} > {log} 2>&1"


rule render_result:
    input:
        notebook="notebooks/{result}.ipynb",
        params="results/figures/{result}.params.yaml",
        data=lambda w: result_inputs(w.result),
    output:
        notebook="results/figures/{result}.ipynb",
        pdf="figures/{result}.pdf",
        png=report("figures/{result}.png", caption="../report/result.rst", category=result_section(0),
                   subcategory=result_section(1)),
        csv=report("tables/{result}.csv", caption="../report/result.rst", category=result_section(0),
                   subcategory=result_section(1)),
        md="tables/{result}.md",
    log:
        "results/figures/{result}.log",
    benchmark:
        "results/figures/{result}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        result=name_pattern(RESULT_NOTEBOOKS),
    params:
        machine=MACHINE,  # the label of this run's measured series, for the report's caption
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"


rule write_predicted_params:
    output:
        "results/figures/predicted.params.yaml",
    log:
        "results/figures/write_predicted_params.log",
    benchmark:
        "results/figures/write_predicted_params.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        fits=yaml_list(f for f, _, _ in predicted_sources()),
        sweeps=yaml_list(d for _, d, _ in predicted_sources()),
        machines=json.dumps([m for _, _, m in predicted_sources()]),
        machine=MACHINE,
    shell:
        "ostinato figures params --out {output} --set 'fits={params.fits}' --set 'sweeps={params.sweeps}' "
        "--set 'machines={params.machines}' --set 'machine={params.machine}' "
        "--set figures_dir=figures --set tables_dir=tables --set output_stem=predicted > {log} 2>&1"


rule render_predicted:
    input:
        notebook="notebooks/predicted.ipynb",
        params="results/figures/predicted.params.yaml",
        data=[p for f, d, _ in predicted_sources() for p in (f, f"{d}/summary.json", f"{d}/cold.json")],
    output:
        notebook="results/figures/predicted.ipynb",
        **reported_notebook_outputs("predicted"),
    log:
        "results/figures/predicted.log",
    benchmark:
        "results/figures/predicted.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        machine=MACHINE,  # the label of this run's measured series, for the report's caption
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"
