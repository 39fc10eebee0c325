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


rule write_result_params:
    output:
        "results/figures/{result}.params.yaml",
    log:
        "results/figures/write_{result}_params.log",
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
        png="figures/{result}.png",
        csv="tables/{result}.csv",
        md="tables/{result}.md",
    log:
        "results/figures/{result}.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        result=name_pattern(RESULT_NOTEBOOKS),
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"


rule write_calibration_params:
    output:
        "results/figures/calibration.params.yaml",
    log:
        "results/figures/write_calibration_params.log",
    conda:
        "../../environment.yml"
    params:
        opts=calibration_params(),
    shell:
        "ostinato figures params --out {output} {params.opts} > {log} 2>&1"


rule render_calibration:
    input:
        notebook="notebooks/calibration.ipynb",
        params="results/figures/calibration.params.yaml",
        fits=calibration_inputs(),
    output:
        notebook="results/figures/calibration.ipynb",
        pdf="figures/calibration.pdf",
        png="figures/calibration.png",
        csv="tables/calibration.csv",
        md="tables/calibration.md",
    log:
        "results/figures/calibration.log",
    conda:
        "../../environment.yml"
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"


rule write_predicted_params:
    output:
        "results/figures/predicted.params.yaml",
    log:
        "results/figures/write_predicted_params.log",
    conda:
        "../../environment.yml"
    params:
        opts=predicted_params(),
    shell:
        "ostinato figures params --out {output} {params.opts} > {log} 2>&1"


rule render_predicted:
    input:
        notebook="notebooks/predicted.ipynb",
        params="results/figures/predicted.params.yaml",
        data=predicted_inputs(),
    output:
        notebook="results/figures/predicted.ipynb",
        pdf="figures/predicted.pdf",
        png="figures/predicted.png",
        csv="tables/predicted.csv",
        md="tables/predicted.md",
    log:
        "results/figures/predicted.log",
    conda:
        "../../environment.yml"
    shell:
        "papermill {input.notebook} {output.notebook} -f {input.params} --log-output > {log} 2>&1"
