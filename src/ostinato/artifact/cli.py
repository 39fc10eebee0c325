"""`ostinato artifact docs`: render the documents whose numbers come from data, or check they are current."""

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


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `artifact` group."""
    p = sub.add_parser("artifact", help="the artifact's documents rendered from their data")
    g = p.add_subparsers(dest="artifact_cmd", required=True)
    d = g.add_parser("docs", help="render ARTIFACT.md and the reference READMEs from their templates (*.md.j2)")
    d.add_argument("--root", default=".", help="the repository root (default .)")
    d.add_argument("--check", action="store_true", help="render nothing; exit 1 naming each document that differs")
    d.set_defaults(func=_cmd_docs)
