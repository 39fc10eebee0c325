# Stage replay: each configured engine replays the session sets through llama-server (or an engine reached by URL),
# one session at a time, in a fixed order (replay_order: the engine order alternates between sets and between
# repeated runs). A replay writes its per-session results into a partial directory, so an interrupted run resumes
# there, and moves it to its output directory when complete: `--forcerun replay` measures again from scratch.


rule replay:
    input:
        unpack(replay_inputs),
    output:
        results=directory("results/replay/{run}{set}/{engine}"),
        sessions="results/replay/{run}{set}/{engine}.sessions.csv",
        requests="results/replay/{run}{set}/{engine}.requests.csv",
    log:
        "results/replay/{run}{set}/{engine}.log",
    benchmark:
        "results/replay/{run}{set}/{engine}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        run=run_pattern(),
        set=name_pattern(config["sessions"]["sets"]),
        engine=name_pattern(REPLAY["engines"]),
    threads: ALL_CORES
    resources:
        bench=1,
        **ENGINE_GPU,
    params:
        partial="results/replay/{run}{set}/.partial",  # an interrupted replay resumes here; moved when complete
        server=lambda w: server_opts(w.engine),
        preset=lambda w, input: preset_opts(w.engine, input),
        routing=lambda w, input: routing_opts(w, input, f"results/replay/{w.run}{w.set}/.partial"),
        machine=MACHINE,
        reach=lambda w, input: replay_reach(w.engine, input),
        max_retries=REPLAY["max_retries"],
        load_threshold=REPLAY["foreign_load_threshold"],
        rates=deadline_rates_opts,
    shell:
        "(ostinato replay run --engine-name {wildcards.engine} {params.reach} --sessions {input.sessions} "
        "--out {params.partial} --machine-label {params.machine} {params.preset} {params.routing} {params.server} "
        "--no-progress --on-setup-change restart --max-retries {params.max_retries} "
        "{params.rates} "
        "&& mv {params.partial}/{wildcards.engine} {output.results} && rmdir --ignore-fail-on-non-empty {params.partial} "
        "&& ostinato replay summarize --in {output.results} --out {output.sessions} "
        "--requests-out {output.requests} --foreign-load-threshold {params.load_threshold}) > {log} 2>&1"


rule summarize_replay:
    input:
        [f"results/replay/{r}{s}/{e}{x}" for r, s, e in replay_order() for x in ("", ".sessions.csv")],
    output:
        sessions="results/replay/sessions.csv",
        requests="results/replay/requests.csv",
    log:
        "results/replay/summarize_replay.log",
    benchmark:
        "results/replay/summarize_replay.benchmark.tsv"
    conda:
        "../../environment.yml"
    params:
        dirs=" ".join(f"results/replay/{r}{s}/{e}" for r, s, e in replay_order()),  # run by run, as --runs needs
        runs=len(replay_runs()),
        load_threshold=REPLAY["foreign_load_threshold"],
    shell:
        "ostinato replay summarize --in {params.dirs} --runs {params.runs} --out {output.sessions} "
        "--requests-out {output.requests} --foreign-load-threshold {params.load_threshold} > {log} 2>&1"


# The paper's Appendix A check over whole sessions (replay.bitwise): one engine replays the sets with its own flags
# (`base`) and with each variant's flags added, every request asking for its top log-probabilities; each variant must
# return the base's tokens and bitwise the same log-probabilities (`ostinato replay bitwise`: the job fails otherwise,
# its log naming the first difference). It runs after the timed replays and is no timing. Each replay serves all its
# sessions on one server start: a server keeps state from one session to the next (borrowed memory), so an interrupted
# one starts again from its first session instead of resuming on a new server start.
rule replay_bitwise:
    input:
        unpack(bitwise_inputs),
    output:
        results=directory("results/replay/bitwise/{set}/{variant}"),
    log:
        "results/replay/bitwise/{set}/{variant}.log",
    benchmark:
        "results/replay/bitwise/{set}/{variant}.benchmark.tsv"
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(bitwise_sets()),
        variant=name_pattern(["base", *BITWISE.get("variants", {})]),
    threads: ALL_CORES
    resources:
        bench=1,
        **ENGINE_GPU,
    params:
        engine=BITWISE.get("engine", ""),
        partial="results/replay/bitwise/{set}/.partial-{variant}",  # an interrupted replay's, removed at the start
        server=lambda w: server_opts(BITWISE["engine"]),
        preset=lambda w, input: preset_opts(BITWISE["engine"], input),
        variant=lambda w: bitwise_args(w.variant),
        routing=lambda w, input: (f"--routing-force-dir {input.routing}" if REPLAY["routing_force"] else ""),
        machine=MACHINE,
        n_probs=BITWISE.get("n_probs", 4),
        max_retries=REPLAY["max_retries"],
    shell:
        "(rm -rf {params.partial} && ostinato replay run --engine-name {params.engine} --server-bin {input.server} "
        "--model {input.model} --sessions {input.sessions} --out {params.partial} --machine-label {params.machine} {params.preset} "
        "{params.routing} {params.server} {params.variant} --record-probs {params.n_probs} --no-progress "
        "--on-setup-change restart --max-retries {params.max_retries} --strict "
        "&& mv {params.partial}/{params.engine} {output.results} && rm -rf {params.partial}) > {log} 2>&1"


rule check_bitwise:
    input:
        base="results/replay/bitwise/{set}/base",
        variant="results/replay/bitwise/{set}/{variant}",
    output:
        "results/replay/bitwise/{set}/{variant}.json",
    log:
        "results/replay/bitwise/{set}/{variant}.check.log",
    conda:
        "../../environment.yml"
    wildcard_constraints:
        set=name_pattern(bitwise_sets()),
        variant=name_pattern(BITWISE.get("variants", {})),
    shell:
        "ostinato replay bitwise --in {input.base} {input.variant} --out {output} > {log} 2>&1"
