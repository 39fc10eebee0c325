# Stage sessions: public agent traces (local mirror, canonical URL, or the committed per-turn tables)
# → per-turn tables → Table 2 splits → session sets as requests of token ids; the Table 2 notebook.


rule get_traces:
    output:
        "results/sessions/traces/{source}.json",
    log:
        "results/sessions/traces/{source}.log",
    benchmark:
        "results/sessions/traces/{source}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        source=name_pattern(SESSION_SOURCES),
    params:
        opts=lambda w: get_traces_opts(w.source),
    shell:
        "ostinato sessions get --source {wildcards.source} {params.opts} --out {output} > {log} 2>&1"


rule derive_tables:
    input:
        traces="results/sessions/traces/{source}.json",
    output:
        table="results/sessions/tables/{source}.turns.csv",
        provenance="results/sessions/tables/{source}.provenance.json",
    log:
        "results/sessions/tables/{source}.log",
    benchmark:
        "results/sessions/tables/{source}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        source=name_pattern(SESSION_SOURCES),
    params:
        mirror=lambda w, input: traces_path(input),
    shell:
        "ostinato sessions tables --source {wildcards.source} --mirror {params.mirror} --no-progress "
        "--provenance {output.provenance} --out {output.table} > {log} 2>&1"


rule split_sessions:
    input:
        swe=session_table("swe-mini"),
        tau2=session_table("tau2"),
    output:
        "results/sessions/splits.json",
    log:
        "results/sessions/split_sessions.log",
    benchmark:
        "results/sessions/split_sessions.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        seed=SESSIONS["split_seed"],
    shell:
        "ostinato sessions split --swe-table {input.swe} --tau2-table {input.tau2} --seed {params.seed} "
        "--out {output} > {log} 2>&1"


rule build_sessions:
    input:
        unpack(lambda w: session_set_inputs(w.set)),
    output:
        "results/sessions/{set}.jsonl",
    log:
        "results/sessions/{set}.log",
    benchmark:
        "results/sessions/{set}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(SESSIONS["sets"]),
    params:
        source=lambda w: SESSIONS["sets"][w.set]["source"],
        opts=lambda w: session_build_opts(w.set),
    shell:
        "ostinato sessions build --source {params.source} --traces {input.traces} {params.opts} --no-progress "
        "--out {output} > {log} 2>&1"


rule render_table2:
    input:
        notebook="notebooks/table2.ipynb",
        swe=session_table("swe-mini"),
        tau2=session_table("tau2"),
        splits="results/sessions/splits.json",
        paper="data/paper/table2.csv",
    output:
        params="results/sessions/table2.params.yaml",
        notebook="results/sessions/table2.ipynb",
        **reported_notebook_outputs("table2"),
    log:
        "results/sessions/render_table2.log",
    benchmark:
        "results/sessions/render_table2.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        tokenizer=SESSIONS["table2"]["tokenizer"],
        output_count=SESSIONS["table2"]["output_count"],
    shell:
        "(ostinato figures params --out {output.params} --set swe_table={input.swe} --set tau2_table={input.tau2} "
        "--set splits={input.splits} --set paper_csv={input.paper} --set tokenizer={params.tokenizer} "
        "--set output_count={params.output_count} --set figures_dir=figures --set tables_dir=tables "
        "--set output_stem=table2 "
        "&& papermill {input.notebook} {output.notebook} -f {output.params} --log-output) > {log} 2>&1"
