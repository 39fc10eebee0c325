# Helpers of stage sessions (its rules: workflow/rules/sessions.smk).
SESSION_SOURCES = ("swe-mini", "tau2", "swe-rebench")
SESSIONS = config["sessions"]


def sessions_tables_dir():
    """Folder of the per-turn tables the splits and Table 2 read: derived here, or the committed ones."""
    return "results/sessions/tables" if SESSIONS["derive_tables"] else SESSIONS["tables"]


def session_table(source):
    """Per-turn table of one source as the splits and Table 2 read it."""
    return f"{sessions_tables_dir()}/{source}.turns.csv"


def get_traces_opts(source):
    """`ostinato sessions get` options of one source: mirror, committed table, URL override, network, download."""
    opts = [f"--table {SESSIONS['tables']}/{source}.turns.csv", f"--cache {SESSIONS['cache']}", "--no-progress"]
    if SESSIONS["mirror"]:
        opts.append(f"--mirror {SESSIONS['mirror']}")
    if source in SESSIONS["urls"]:
        opts.append(f"--url {SESSIONS['urls'][source]}")
    if not SESSIONS["probe_urls"]:
        opts.append("--no-probe")
    if not SESSIONS["download"]:
        opts.append("--no-download")
    if source in SESSIONS["download_urls"]:
        opts.append(f"--download-url {SESSIONS['download_urls'][source]}")
    if source in SESSIONS["sha256"]:
        opts.append(f"--sha256 {SESSIONS['sha256'][source]}")
    return " ".join(opts)


def traces_path(input):
    """The folder a `get_traces` manifest points at (mirror or download cache)."""
    with open(input.traces, encoding="utf-8") as fh:
        return json.load(fh)["path"]


def session_set_inputs(name):
    """Inputs of `build_sessions` for one set: its source's manifest, and the split file if the set uses one."""
    s = SESSIONS["sets"][name]
    inputs = {"traces": f"results/sessions/traces/{s['source']}.json"}
    if s.get("split"):
        inputs["split"] = "results/sessions/splits.json"
    return inputs


def session_build_opts(name):
    """`ostinato sessions build` options of one configured session set."""
    s = SESSIONS["sets"][name]
    flags = [("select", "--select"), ("tokenizer", "--tokenizer"), ("max_requests", "--max-requests"),
             ("max_new_tokens", "--max-new-tokens"), ("max_output_tokens", "--max-output-tokens"),
             ("max_context_tokens", "--max-context-tokens"), ("output_count", "--output-count"), ("seed", "--seed")]
    opts = [f"{f} {s[k]}" for k, f in flags]
    if s.get("split"):
        opts.append(f"--split results/sessions/splits.json --split-set {s['split']}")
    return " ".join(opts)


def sessions_targets():
    """Outputs of the Table 2 notebook (to add to `rule all`)."""
    return list(notebook_outputs("table2").values())
