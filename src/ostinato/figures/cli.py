"""`ostinato figures params` writes a notebook's papermill parameters file from key=value pairs; `ostinato figures
open` opens a notebook in JupyterLab with the parameters this run's pipeline gave it."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

from ostinato.atomic import atomic_open


def parse_assignments(items: list[str]) -> dict[str, object]:
    """Turn ["a=1", "b=[x, y]"] into {"a": 1, "b": ["x", "y"]}; values are YAML."""
    values: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        values[key] = yaml.safe_load(raw) if raw else ""
    return values


def _cmd_params(args: argparse.Namespace) -> int:
    doc = parse_assignments(args.set)
    if args.param:  # a result notebook's `params` mapping (ostinato.figures.notebook.ResultParams)
        doc["params"] = parse_assignments(args.param)
    with atomic_open(args.out) as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return 0


def find_params(name: str, results: Path) -> Path:
    """The parameters file the pipeline wrote for notebook `name`: `results/<stage>/<name>.params.yaml`."""
    found = sorted(results.glob(f"*/{name}.params.yaml"))
    if not found:
        raise FileNotFoundError(f"no {results}/<stage>/{name}.params.yaml: run the pipeline for this notebook first "
                                f"(e.g. `snakemake --cores all figures/{name}.pdf`), or pass --params")
    if len(found) > 1:
        raise ValueError(f"{name}: several parameter files ({', '.join(map(str, found))}); pass --params")
    return found[0]


def prepare_notebook(notebook: Path, params: Path, out: Path) -> Path:
    """Copy `notebook` to `out` with papermill's injected-parameters cell, without running it."""
    import papermill

    if not notebook.is_file():
        raise FileNotFoundError(f"{notebook}: no such notebook (notebooks/<name>.ipynb)")
    values = yaml.safe_load(params.read_text(encoding="utf-8")) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{params}: expected a mapping of parameters")
    out.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(str(notebook), str(out), parameters=values, prepare_only=True, log_output=False,
                               progress_bar=False)
    return out


def _cmd_open(args: argparse.Namespace) -> int:
    params = Path(args.params) if args.params else find_params(args.name, Path(args.results))
    out = params.with_name(f"{args.name}.interactive.ipynb")
    prepare_notebook(Path(args.notebooks) / f"{args.name}.ipynb", params, out)
    print(f"{out}: notebooks/{args.name}.ipynb with the parameters of {params}", file=sys.stderr)
    if args.prepare_only:
        return 0
    cmd = [sys.executable, "-m", "jupyterlab", str(out)] + (["--no-browser"] if args.no_browser else [])
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI machines run as root; JupyterLab refuses it otherwise
    if args.port:
        cmd.append(f"--port={args.port}")
    return subprocess.call(cmd)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `figures` group."""
    p = sub.add_parser("figures", help="helpers for the notebooks that render figures and tables")
    g = p.add_subparsers(dest="figures_cmd", required=True)
    w = g.add_parser("params", help="write a papermill parameters YAML file")
    w.add_argument("--out", required=True)
    w.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a parameter (YAML value)")
    w.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="an entry of the `params` mapping of a result notebook (YAML value)")
    w.set_defaults(func=_cmd_params)
    o = g.add_parser("open", help="open a notebook in JupyterLab with this run's parameters (run from the repository "
                                  "root, after the pipeline rendered it)")
    o.add_argument("name", help="the notebook: table3, fig7b, sim_validation, ... (notebooks/<name>.ipynb)")
    o.add_argument("--params", help="parameters YAML (default: results/<stage>/<name>.params.yaml, as the rule wrote it)")
    o.add_argument("--results", default="results", help="the pipeline's results folder (default results)")
    o.add_argument("--notebooks", default="notebooks", help="folder of the notebooks (default notebooks)")
    o.add_argument("--prepare-only", action="store_true",
                   help="only write results/<stage>/<name>.interactive.ipynb (parameters injected, not run)")
    o.add_argument("--no-browser", action="store_true", help="start JupyterLab without opening a browser")
    o.add_argument("--port", type=int, default=0, help="JupyterLab's port (default: its own)")
    o.set_defaults(func=_cmd_open)
