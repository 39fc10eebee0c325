"""The `ostinato` console script: one subcommand group per package concern, used by the rules."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module exposes `register(subparsers)`, adding its group; the handler is set with
# `parser.set_defaults(func=...)` and receives the parsed namespace.
_GROUPS = (
    "ostinato.engine.cli",
    "ostinato.models.cli",
    "ostinato.routing.cli",
    "ostinato.sessions.cli",
    "ostinato.replay.cli",
    "ostinato.residency.cli",
    "ostinato.costmodel.cli",
    "ostinato.limit.cli",
    "ostinato.sim.cli",
    "ostinato.figures.cli",
    "ostinato.sweep.cli",
    "ostinato.calibrate.cli",
    "ostinato.artifact.cli",
    "ostinato.peers.cli",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every subcommand group registered."""
    parser = argparse.ArgumentParser(prog="ostinato", description=__doc__)
    sub = parser.add_subparsers(dest="group", required=True)
    for name in _GROUPS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run the chosen subcommand; errors exit 2 with a one-line message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"ostinato: error: {exc}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
