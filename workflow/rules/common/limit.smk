# Helpers of stage limit (its rules: workflow/rules/limit.smk).
def plan_total_slots(plan_path):
    """Resident experts of a plan file over all its GPUs (the cache size of the MIN limit)."""
    with open(plan_path, encoding="utf-8") as f:
        return sum(len(g["slots"]) for g in json.load(f)["gpus"])
