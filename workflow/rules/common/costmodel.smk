# Helpers of stage costmodel (its rules: workflow/rules/costmodel.smk).
COSTMODEL_PROFILES = config["costmodel"]["profiles"] if "costmodel" in config else []


def costmodel_targets():
    """The checks of every configured profile (to add to `rule all`)."""
    return [f"results/costmodel/checks-{p}.json" for p in COSTMODEL_PROFILES]
