# Stage 3, sessions: agent sessions from public traces (a local mirror) as requests of token ids.


rule build_sessions:
    output:
        "results/sessions/{set}.jsonl",
    log:
        "results/sessions/{set}.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(config["sessions"]["sets"]),
    params:
        source=lambda w: config["sessions"]["sets"][w.set]["source"],
        mirror=config["sessions"]["mirror"],
        opts=lambda w: session_opts(w.set),
    shell:
        "ostinato sessions build --source {params.source} --mirror {params.mirror} {params.opts} "
        "--out {output} > {log} 2>&1"
