"""`ostinato figures params`: write a notebook's papermill parameters file from key=value pairs."""

from __future__ import annotations

import argparse

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
