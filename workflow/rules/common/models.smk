# Helpers of stage models (its rules: workflow/rules/models.smk).
SYNTH_MODELS = [m for m, c in config["models"].items() if "spec" in c]
DOWNLOAD_MODELS = [m for m, c in config["models"].items() if "url" in c]


def synth_opts(model):
    """`ostinato models synth` options of one configured model."""
    c = config["models"][model]
    flags = [("vocab", "--vocab"), ("expert_type", "--expert-type"), ("dense_type", "--dense-type"), ("seed", "--seed")]
    return " ".join(f"{f} {c[k]}" for k, f in flags if k in c)


def replay_arch():
    """The llama.cpp architecture of the replayed model when its spec names it (a synthesized model), else ""."""
    from ostinato.models.spec import get_spec

    spec = config["models"][config["replay"]["model"]].get("spec")
    return get_spec(spec).arch if spec else ""
