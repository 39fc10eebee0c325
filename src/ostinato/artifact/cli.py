"""`ostinato artifact docs` renders the documents whose numbers come from data, or checks they are current;
`ostinato artifact collect` ships a finished run's quoted results as a reference; `ostinato artifact check` writes
the verdict of every claim on this run and the shipped data; `ostinato artifact agent` talks to a started
`ostinato` llama-server through the official OpenAI client, as a local agent would."""

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


def _variables(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--var {pair!r}: expected NAME=VALUE")
        out[key] = value
    return out


def _cmd_check(args: argparse.Namespace) -> int:
    import socket

    from ostinato.artifact import verdict_table
    from ostinato.artifact.checks import load_claims
    from ostinato.artifact.verdict import Context, evaluate_all, verdicts
    from ostinato.engine.backend import resolve_backend

    root = Path(args.root).resolve()
    claims = load_claims(root / args.claims)
    variables = {"machine": socket.gethostname(), **_variables(args.var)}
    ctx = Context(Context.kind_of(resolve_backend(args.backend).name), root, variables)
    results = evaluate_all(claims, ctx)
    table = verdicts(claims, results)
    verdict_table.write(table, verdict_table.Header.of(ctx), args.csv, args.md, args.html)
    print(f"{len(results)} checks of {len(claims)} claims on a {ctx.kind} run: "
          f"{verdict_table.counts(verdict_table.frame(table))}", file=sys.stderr)
    return 0


def _cmd_agent(args: argparse.Namespace) -> int:
    from ostinato.artifact.agent import AgentCheck, run_agent_check

    report = run_agent_check(AgentCheck(server_bin=Path(args.server_bin), model=Path(args.model),
                                        plan=Path(args.plan) if args.plan else None, threads=args.threads,
                                        ctx_size=args.ctx_size, log=Path(args.log) if args.log else None,
                                        server_args=tuple(args.server_arg)))
    report.write(Path(args.out))
    print(f"local agent check: {'ok' if report.ok else 'FAILED'} ({args.out})", file=sys.stderr)
    return 0 if report.ok else 1


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
    k = g.add_parser("check", help="the verdict of every claim of artifact/claims.yaml on this run and the shipped data")
    k.add_argument("--root", default=".", help="the repository root the run wrote results/ and tables/ under")
    k.add_argument("--claims", default="artifact/claims.yaml", help="the claims file, relative to --root")
    k.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"],
                   help="this run's engine backend (as engine.backend): cuda makes it a gpu run, cpu a cpu run")
    k.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                   help="a variable the checks' sources use: machine (default: the host name), model")
    k.add_argument("--csv", help="write the checks here (tables/claims.csv)")
    k.add_argument("--md", help="write the verdict by claim and every check here (tables/claims.md)")
    k.add_argument("--html", help="write the report's verdict table here (results/artifact/claims.html)")
    k.set_defaults(func=_cmd_check)
    a = g.add_parser("agent", help="start the ostinato llama-server with a plan and talk to it through the OpenAI "
                                   "client: chat completions, streaming, a tool call")
    a.add_argument("--server-bin", required=True, help="build/engine/<backend>/ostinato/bin/llama-server")
    a.add_argument("--model", required=True, help="the GGUF the server loads")
    a.add_argument("--plan", help="the residency plan the server loads (--residency-plan)")
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("--ctx-size", type=int, default=2048)
    a.add_argument("--server-arg", action="append", default=[], help="one more llama-server argument (repeatable)")
    a.add_argument("--log", help="the server's log file")
    a.add_argument("--out", required=True, help="results/artifact/local_agent.json")
    a.set_defaults(func=_cmd_agent)
