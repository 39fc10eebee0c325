"""`ostinato artifact docs` renders the documents whose numbers come from data, or checks they are current;
`ostinato artifact collect` ships a finished run's quoted results as a reference."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ostinato.artifact import docs


def _cmd_docs(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve()
    if args.check:
        stale = docs.check(root)
        for doc in stale:
            print(f"{doc}: differs from its rendering (run `ostinato artifact docs`, then review the change)",
                  file=sys.stderr)
        return 1 if stale else 0
    for doc in docs.write(root):
        print(f"rendered {doc}", file=sys.stderr)
    return 0


def _cmd_collect(args: argparse.Namespace) -> int:
    from ostinato.artifact.collect import collect

    paths = collect(Path(args.root).resolve(), Path(args.out), args.machine, args.command)
    print(f"collected {len(paths)} files into {args.out}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `artifact` group."""
    p = sub.add_parser("artifact", help="the artifact's documents rendered from their data")
    g = p.add_subparsers(dest="artifact_cmd", required=True)
    d = g.add_parser("docs", help="render ARTIFACT.md and the reference READMEs from their templates (*.md.j2)")
    d.add_argument("--root", default=".", help="the repository root (default .)")
    d.add_argument("--check", action="store_true", help="render nothing; exit 1 naming each document that differs")
    d.set_defaults(func=_cmd_docs)
    c = g.add_parser("collect", help="copy a finished default-config run's quoted results into data/reference/<machine>/")
    c.add_argument("--root", default=".", help="the repository root the run wrote results/ and tables/ under")
    c.add_argument("--out", required=True, help="e.g. data/reference/cpu-2c")
    c.add_argument("--machine", required=True, help="the machine's label (machine description in run.json)")
    c.add_argument("--command", default="make reproduce", help="the command that made the run (default make reproduce)")
    c.set_defaults(func=_cmd_collect)
