# Stage 8, replay: each engine variant replays the session sets through llama-server, one session at a time, in a
# fixed order (replay_order: the engine order alternates between sets and between repeated runs).


rule replay:
    input:
        server=lambda w: replay_server_inputs(w.engine),
        model=lambda w: [] if engine_url(w.engine) else f"models/{config['replay']['model']}.gguf",
        sessions="results/sessions/{set}.jsonl",
        routing=lambda w: f"results/routing/{w.set}" if config["replay"].get("routing_force") else [],
        plan=lambda w: replay_plan(w.engine),
        capacity=lambda w: (replay_capacity() or []) if config["replay"]["engines"][w.engine].get("preset") else [],
        after=replay_after,
    output:
        sessions="results/replay/{run}{set}/{engine}.sessions.csv",
        requests="results/replay/{run}{set}/{engine}.requests.csv",
    log:
        "results/replay/{run}{set}/{engine}.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        run=run_pattern(),
        set=name_pattern(config["sessions"]["sets"]),
        engine=name_pattern(config["replay"]["engines"]),
    threads: workflow.cores
    resources:
        bench=1,
    params:
        server_args=lambda w: server_args(w.engine),
        env=lambda w: server_env(w.engine),
        preset=lambda w, input: preset_opts(w.engine, input),
        routing=lambda w, input: (f"--routing-force-dir {input.routing} "
                                  f"--routing-record-dir results/replay/{w.run}{w.set}/{w.engine}/routing")
                                 if input.routing else "",
        machine=MACHINE,
        reach=lambda w, input: replay_reach(w.engine, input),
    shell:
        "(ostinato replay run --engine-name {wildcards.engine} {params.reach} "
        "--sessions {input.sessions} --out results/replay/{wildcards.run}{wildcards.set} "
        "--machine-label {params.machine} {params.preset} {params.routing} {params.server_args} {params.env} "
        "--no-progress "
        "--on-setup-change restart "
        "&& ostinato replay summarize --in results/replay/{wildcards.run}{wildcards.set}/{wildcards.engine} "
        "--out {output.sessions} --requests-out {output.requests}) > {log} 2>&1"


rule summarize_replay:
    input:
        [f"results/replay/{r}{s}/{e}.sessions.csv" for r, s, e in replay_order()],
    output:
        sessions="results/replay/sessions.csv",
        requests="results/replay/requests.csv",
    log:
        "results/replay/summarize_replay.log",
    conda:
        "../../environment.yml"
    params:
        dirs=" ".join(f"results/replay/{r}{s}/{e}" for r, s, e in replay_order()),  # run by run, as --runs needs
        runs=len(replay_runs()),
    shell:
        "ostinato replay summarize --in {params.dirs} --runs {params.runs} --out {output.sessions} "
        "--requests-out {output.requests} > {log} 2>&1"
