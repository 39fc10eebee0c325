# Shared by every stage: the engine backend and build directory, this machine's label, how rules call the package,
# and small helpers. Each stage's own helpers sit at the top of its rule file (workflow/rules/<stage>.smk). The config
# holds every default: the Snakefile's `validate` filled them in from workflow/schemas/config.schema.yaml.
import json
import re
import shlex
import socket
import sys
from pathlib import Path

from snakemake.settings.types import DeploymentMethod

from ostinato.engine.backend import resolve_backend

BACKEND = resolve_backend(config["engine"]["backend"], config["engine"]["cuda_arch"] or None)
ENGINE_DIR = f"build/engine/{BACKEND.name}"
MACHINE = socket.gethostname() if config["machine"] == "auto" else config["machine"]
FIGURES = config["figures"]  # the notebooks' shared settings (target engine, shipped reference results)
# Every core of the run, for the rules that build, run or time the engine (`threads: ALL_CORES`): the run's --cores,
# or 1 where Snakemake takes no --cores because it runs no job (`snakemake --report report.html`), where reading
# workflow.cores would stop the workflow from loading.
ALL_CORES = workflow.resource_settings.cores or 1

# Rules call `ostinato` and `papermill` through the interpreter that runs Snakemake, so `.venv/bin/snakemake` works
# without activating the venv: every shell command starts with these two shell functions. With --sdm conda they call
# the rule's environment, which installs the package. A notebook whose kernel did not start (a port another process
# took: "Kernel didn't respond in 60 seconds") is run once more; the retry says so in the rule's log.
_DEPLOY = workflow.deployment_settings
PYTHON = "python" if _DEPLOY and DeploymentMethod.CONDA in _DEPLOY.deployment_method else sys.executable
shell.executable("bash")
shell.prefix(f"set -eo pipefail; ostinato() {{{{ '{PYTHON}' -m ostinato \"$@\"; }}}}; "  # braces: f-string, then
             f"papermill() {{{{ '{PYTHON}' -m papermill \"$@\" || {{{{ echo 'papermill failed: running the notebook "
             f"once more' >&2; '{PYTHON}' -m papermill \"$@\"; }}}}; }}}}; ")  # Snakemake's own formatting


def engine_bin(variant, tool="llama-server"):
    """Path of one tool of a built engine variant."""
    return f"{ENGINE_DIR}/{variant}/bin/{tool}"


def name_pattern(names):
    """A wildcard constraint matching exactly these names (nothing if empty)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def yaml_list(items):
    """A YAML flow list of plain names, for `ostinato figures params --set key=[...]`."""
    return "[" + ", ".join(str(i) for i in items) + "]"


def notebook_outputs(stem):
    """The figure and table files a notebook writes under figures/ and tables/."""
    return {"pdf": f"figures/{stem}.pdf", "png": f"figures/{stem}.png", "csv": f"tables/{stem}.csv",
            "md": f"tables/{stem}.md"}


# Each stage's helpers (config sections, option strings, input functions, config checks, `rule all` targets; the
# artifact stage's last: its verdict reads every other stage's outputs).
include: "common/engine.smk"
include: "common/models.smk"
include: "common/sessions.smk"
include: "common/routing.smk"
include: "common/residency.smk"
include: "common/costmodel.smk"
include: "common/sim.smk"
include: "common/limit.smk"
include: "common/replay.smk"
include: "common/calibrate.smk"
include: "common/sweep.smk"
include: "common/figures.smk"
include: "common/artifact.smk"
