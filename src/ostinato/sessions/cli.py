"""`ostinato sessions build`: read a trace mirror, select sessions, tokenize, write JSON lines."""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from ostinato.sessions.chat import DEFAULT_TEMPLATE, TEMPLATES, get_template
from ostinato.sessions.model import write_sessions_jsonl
from ostinato.sessions.readers import SOURCES, iter_source
from ostinato.sessions.tokenize import TOKENIZERS, Caps, resolve_tokenizer, tokenize_session


def _positive(value: str) -> int:
    """argparse type: an integer ≥ 1."""
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return n


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `sessions` group and its `build` command."""
    group = subparsers.add_parser("sessions", help="agent sessions from public traces")
    sub = group.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="tokenize the first N sessions of a trace mirror into a JSONL file")
    b.add_argument("--source", required=True, choices=SOURCES, help="trace format of the mirror")
    b.add_argument("--mirror", required=True, type=Path,
                   help="mirror root holding tau2/ and swe-mini/ (or the folder of one source)")
    b.add_argument("--select", type=int, default=0, help="first N sessions sorted by id (0 = all; default 0)")
    b.add_argument("--tokenizer", default="byte", choices=TOKENIZERS, help="vocabulary of the model (default byte)")
    b.add_argument("--template", default=None, choices=sorted(TEMPLATES), help="chat framing (default per tokenizer)")
    b.add_argument("--max-requests", type=_positive, default=None, help="keep at most this many requests per session")
    b.add_argument("--max-new-tokens", type=_positive, default=None, help="cap the new input tokens of each request")
    b.add_argument("--max-output-tokens", type=_positive, default=None, help="cap the output tokens of each request")
    b.add_argument("--max-context-tokens", type=_positive, default=None,
                   help="end a session before the request that would pass this context (e.g. the server's -c)")
    b.add_argument("--out", required=True, type=Path, help="output JSONL file (one session per line)")
    b.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    """Handler of `sessions build`; writes the JSONL and prints a one-line summary."""
    if args.select < 0:
        raise ValueError(f"--select must be >= 0, got {args.select}")
    tokenizer = resolve_tokenizer(args.tokenizer)
    template = get_template(args.template or DEFAULT_TEMPLATE[args.tokenizer])
    caps = Caps(args.max_requests, args.max_new_tokens, args.max_output_tokens, args.max_context_tokens)
    sessions = iter_source(args.source, args.mirror)
    if args.select:
        sessions = itertools.islice(sessions, args.select)
    tokenized = (
        tokenize_session(s, tokenizer, template, tokenizer_name=args.tokenizer, caps=caps) for s in sessions
    )
    kept = [t for t in tokenized if t.requests]
    n = write_sessions_jsonl(kept, args.out)
    n_req = sum(len(t.requests) for t in kept)
    print(f"wrote {n} sessions, {n_req} requests to {args.out}", file=sys.stderr)
    return 0
