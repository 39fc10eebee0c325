# Helpers of stage models (its rules: workflow/rules/models.smk).
SYNTH_MODELS = [m for m, c in config["models"].items() if "spec" in c]
DOWNLOAD_MODELS = [m for m, c in config["models"].items() if "url" in c]


def synth_opts(model):
    """`ostinato models synth` options of one configured model."""
    c = config["models"][model]
    flags = [("vocab", "--vocab"), ("expert_type", "--expert-type"), ("dense_type", "--dense-type"), ("seed", "--seed"),
             ("router", "--router"), ("router_ranking", "--router-ranking"), ("router_seed", "--router-seed")]
    return " ".join(f"{f} {c[k]}" for k, f in flags if k in c)


def router_inputs(model):
    """The routing profile a calibrated router ranks its experts by (`router_ranking: profile:PATH`), else none."""
    ranking = str(config["models"][model].get("router_ranking", ""))
    return [ranking[len("profile:"):]] if ranking.startswith("profile:") else []


def replay_arch():
    """The llama.cpp architecture of the replayed model when its spec names it (a synthesized model), else ""."""
    from ostinato.models.spec import get_spec

    spec = config["models"][config["replay"]["model"]].get("spec")
    return get_spec(spec).arch if spec else ""
