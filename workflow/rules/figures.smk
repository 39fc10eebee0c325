# Stage 10, figures: papermill runs one notebook per result; the executed notebook is kept as an output.


rule write_replay_summary_params:
    output:
        "results/figures/replay_summary.params.yaml",
    log:
        "results/figures/write_replay_summary_params.log",
    conda:
        "../../environment.yml"
    params:
        machine=MACHINE,
        engines="[" + ", ".join(config["replay"]["engines"]) + "]",
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
        pdf="figures/replay_summary.pdf",
        png="figures/replay_summary.png",
        csv="tables/replay_summary.csv",
        md="tables/replay_summary.md",
        compare_csv="tables/replay_compare.csv",
        compare_md="tables/replay_compare.md",
    log:
        "results/figures/replay_summary.log",
    conda:
        "../../environment.yml"
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"
