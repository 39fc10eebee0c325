"""`ostinato sessions {get,tables,split,build}`: resolve sources, derive per-turn tables, split, write JSON lines."""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from pathlib import Path
from typing import Iterator

from ostinato.errors import InputError
from ostinato.sessions.chat import DEFAULT_TEMPLATE, TEMPLATES, get_template
from ostinato.sessions.model import TokenizedSession, write_sessions_jsonl
from ostinato.sessions.readers import SOURCES, iter_source
from ostinato.sessions.tokenize import TOKENIZERS, Caps, resolve_tokenizer, tokenize_session


def _cap(value: str) -> int | None:
    """argparse type of a cap: an integer ≥ 0, where 0 means no cap (as in the config)."""
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 (0 = no cap), got {value}")
    return n or None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `sessions` group and its commands."""
    group = subparsers.add_parser("sessions", help="agent sessions from public traces")
    sub = group.add_subparsers(dest="command", required=True)
    _register_build(sub)
    _register_get(sub)
    _register_tables(sub)
    _register_split(sub)


def _register_build(sub: argparse._SubParsersAction) -> None:
    """`sessions build`: sessions of a mirror (tokenized) or of a per-turn table (synthesized ids) as JSONL."""
    b = sub.add_parser("build", help="write the requests of sessions as token ids (JSONL, one session per line)")
    b.add_argument("--source", required=True, choices=SOURCES, help="trace format / source name")
    where = b.add_mutually_exclusive_group(required=True)
    where.add_argument("--mirror", type=Path, help="mirror root holding <source>/ (or the folder of one source)")
    where.add_argument("--table", type=Path, help="per-turn table (data/sessions/<source>.turns.csv): ids synthesized")
    where.add_argument("--traces", type=Path, help="manifest of `sessions get` (mirror or table)")
    b.add_argument("--split", type=Path, default=None, help="split file (data/sessions/splits.json)")
    b.add_argument("--split-set", default=None, help="keep the sessions of this set of --split (and its request cap)")
    b.add_argument("--select", type=int, default=0, help="first N sessions sorted by id (0 = all; default 0)")
    b.add_argument("--tokenizer", default="byte", choices=TOKENIZERS, help="vocabulary of the model (default byte)")
    b.add_argument("--template", default=None, choices=sorted(TEMPLATES), help="chat framing (default per tokenizer)")
    b.add_argument("--output-count", default="recorded", choices=("recorded", "text"),
                   help="output length: the trace's recorded completion tokens where present (default), or the text's")
    b.add_argument("--seed", type=int, default=0, help="seed of synthesized ids (table mode, recorded padding)")
    b.add_argument("--max-requests", type=_cap, default=None, help="keep at most this many requests per session (0 = all)")
    b.add_argument("--max-new-tokens", type=_cap, default=None, help="cap the new input tokens of each request (0 = no cap)")
    b.add_argument("--max-output-tokens", type=_cap, default=None, help="cap the output tokens of each request (0 = no cap)")
    b.add_argument("--max-context-tokens", type=_cap, default=None,
                   help="end a session before the request that would pass this context (e.g. the server's -c)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--allow-empty", action="store_true",
                   help="write an empty file when no session has a request (default: an error)")
    b.add_argument("--out", required=True, type=Path, help="output JSONL file (one session per line)")
    b.set_defaults(func=run_build)


def _register_get(sub: argparse._SubParsersAction) -> None:
    """`sessions get`: decide where a source's sessions come from and write a manifest."""
    g = sub.add_parser("get", help="resolve a source: local mirror, download (cached), or the committed per-turn table")
    g.add_argument("--source", required=True, choices=SOURCES)
    g.add_argument("--mirror", type=Path, default=None, help="mirror root holding <source>/")
    g.add_argument("--url", default=None, help="canonical URL (default: the source's registry entry)")
    g.add_argument("--table", type=Path, default=None, help="fallback per-turn table when nothing is reachable")
    g.add_argument("--no-probe", action="store_true",
                   help="no network at all: no probe, no download (offline machines)")
    g.add_argument("--no-download", action="store_true",
                   help="only probe the URL, never download (a complete cache is still reused)")
    g.add_argument("--download-url", default=None,
                   help="what to download: a .tar.gz of the repository (GitHub archive layout) or, for swe-rebench, "
                        "a JSONL/JSON rows file; http(s):// or file:// (default: the GitHub archive at the pinned "
                        "commit)")
    g.add_argument("--sha256", default=None, help="sha256 the download must have (else it is deleted and get fails)")
    g.add_argument("--cache", type=Path, default=None, help="download cache root, holding <source>/ (default "
                                                             "results/sessions/mirror)")
    g.add_argument("--member", action="append", default=None, metavar="GLOB",
                   help="archive paths to extract, below its top folder (repeatable; default: the source's "
                        "trace paths)")
    g.add_argument("--no-progress", action="store_true", help="no download progress bar")
    g.add_argument("--out", required=True, type=Path, help="manifest JSON read by `sessions build --traces`")
    g.set_defaults(func=run_get)


def _register_tables(sub: argparse._SubParsersAction) -> None:
    """`sessions tables`: derive the per-turn table (numbers only) of a mirror."""
    t = sub.add_parser("tables", help="per-turn token counts of every session of a mirror (CSV, no text)")
    t.add_argument("--source", required=True, choices=SOURCES)
    t.add_argument("--mirror", required=True, type=Path)
    t.add_argument("--tokenizers", nargs="+", default=["deepseek", "qwen"], choices=TOKENIZERS)
    t.add_argument("--provenance", type=Path, default=None, help="provenance JSON to update (one entry per table)")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--out", required=True, type=Path)
    t.set_defaults(func=run_tables)


def _register_split(sub: argparse._SubParsersAction) -> None:
    """`sessions split`: Table 2 splits from the SWE and τ2 per-turn tables."""
    s = sub.add_parser("split", help="seeded development / screening / held-out sets sized like Table 2")
    s.add_argument("--swe-table", required=True, type=Path)
    s.add_argument("--tau2-table", required=True, type=Path)
    s.add_argument("--swe-source", default="swe-mini", choices=("swe-mini", "swe-rebench"))
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", required=True, type=Path)
    s.set_defaults(func=run_split)


def _selected(sessions: Iterator, keep: list[str] | None, select: int) -> Iterator:
    """Keep the sessions whose id is in `keep` (all if None), then the first `select` (0 = all)."""
    if keep is not None:
        wanted = set(keep)
        sessions = (s for s in sessions if (s.session_id if hasattr(s, "session_id") else s[0].session) in wanted)
    return itertools.islice(sessions, select) if select else sessions


def _split_filter(args: argparse.Namespace) -> tuple[list[str] | None, int | None]:
    """Session ids and request cap of `--split-set` (None, None without a split)."""
    if args.split is None and args.split_set is None:
        return None, None
    if args.split is None or args.split_set is None:
        raise ValueError("--split and --split-set go together")
    from ostinato.sessions.splits import read_splits

    sets = read_splits(args.split)
    if args.split_set not in sets:
        raise ValueError(f"--split-set {args.split_set!r} is not a set of {args.split} ({', '.join(sets)})")
    chosen = sets[args.split_set]
    if chosen.source != args.source:
        raise ValueError(f"--split-set {args.split_set!r} holds {chosen.source} sessions, not --source {args.source}")
    return list(chosen.sessions), chosen.max_requests or None


def run_build(args: argparse.Namespace) -> int:
    """Handler of `sessions build`; writes the JSONL and prints a one-line summary."""
    from tqdm import tqdm

    if args.select < 0:
        raise ValueError(f"--select must be >= 0, got {args.select}")
    keep, split_cap = _split_filter(args)
    max_requests = min(c for c in (args.max_requests, split_cap) if c) if (args.max_requests or split_cap) else None
    caps = Caps(max_requests, args.max_new_tokens, args.max_output_tokens, args.max_context_tokens)
    template = get_template(args.template or DEFAULT_TEMPLATE[args.tokenizer])
    prefer = args.output_count == "recorded"
    mirror, table = args.mirror, args.table
    if args.traces is not None:
        from ostinato.sessions.sources import read_manifest

        resolved = read_manifest(args.traces)
        if resolved.source != args.source:
            raise ValueError(f"--traces {args.traces} resolves {resolved.source}, not --source {args.source}")
        print(f"{args.source}: {resolved.mode} {resolved.path} ({resolved.note})", file=sys.stderr)
        mirror, table = (Path(resolved.path), None) if resolved.mode == "mirror" else (None, Path(resolved.path))
    built: Iterator[TokenizedSession]
    if table is not None:
        from ostinato.sessions.synth import synthesize_session
        from ostinato.sessions.tables import read_table

        rows = read_table(table)
        groups = (rows[s] for s in sorted(rows))
        built = (synthesize_session(g, args.tokenizer, args.seed, args.source, caps, prefer, template.name,
                                    {"table": table.name}) for g in _selected(groups, keep, args.select))
    else:
        tokenizer = resolve_tokenizer(args.tokenizer)
        sessions = _selected(iter_source(args.source, mirror), keep, args.select)
        built = (tokenize_session(s, tokenizer, template, tokenizer_name=args.tokenizer, caps=caps,
                                  prefer_recorded=prefer, seed=args.seed) for s in sessions)
    every = list(tqdm(built, desc=f"sessions {args.source}", unit="session", disable=args.no_progress,
                      file=sys.stderr))
    kept = [t for t in every if t.requests]
    empty = [t.session_id for t in every if not t.requests]
    if empty:
        print(f"left out {len(empty)} sessions without a request (no assistant message answering user or tool "
              f"input): {', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}", file=sys.stderr)
    if not kept and not args.allow_empty:
        raise InputError(f"--source {args.source}: no session with a request in {mirror or table} ({len(every)} read; "
                         f"--allow-empty writes an empty file)")
    if keep is not None:
        missing = sorted(set(keep) - {t.session_id for t in kept})
        if missing and not args.select:
            raise ValueError(f"split set {args.split_set}: sessions not found in the source: {missing[:5]}")
    n = write_sessions_jsonl(kept, args.out)
    n_req = sum(len(t.requests) for t in kept)
    print(f"wrote {n} sessions, {n_req} requests to {args.out}", file=sys.stderr)
    return 0


def run_get(args: argparse.Namespace) -> int:
    """Handler of `sessions get`; writes the manifest and says which way the source was resolved."""
    from ostinato.sessions.sources import DEFAULT_CACHE, Download, resolve_source, write_manifest

    if args.sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", args.sha256):
        raise ValueError(f"--sha256 must be 64 hex digits, got {args.sha256!r}")
    download = Download(allowed=not args.no_download, cache=args.cache or DEFAULT_CACHE, url=args.download_url or None,
                        sha256=args.sha256 or None, members=tuple(args.member or ()), progress=not args.no_progress)
    resolved = resolve_source(args.source, args.mirror, args.url, args.table, probe=not args.no_probe,
                              download=download)
    write_manifest(resolved, args.out)
    print(f"{args.source}: {resolved.mode} {resolved.path} ({resolved.note})", file=sys.stderr)
    if resolved.mode == "download":
        print(f"{args.source}: url {resolved.url} sha256 {resolved.sha256} cache {resolved.path}", file=sys.stderr)
    return 0


def run_tables(args: argparse.Namespace) -> int:
    """Handler of `sessions tables`; tokenizes every session with each tokenizer and writes counts only."""
    from tqdm import tqdm

    from ostinato.sessions.tables import session_rows, write_table

    tokenizers = {name: resolve_tokenizer(name) for name in args.tokenizers}
    sessions = tqdm(iter_source(args.source, args.mirror), desc=f"tables {args.source}", unit="session",
                    disable=args.no_progress, file=sys.stderr)
    counter = {"sessions": 0, "files": set()}

    def rows():
        for s in sessions:
            counter["sessions"] += 1
            counter["files"].add(s.meta.get("file", s.session_id))
            yield from session_rows(s, tokenizers)

    n = write_table(rows(), args.out, args.tokenizers)
    if n == 0:
        args.out.unlink()
        raise InputError(f"--source {args.source}: no request in {args.mirror} ({counter['sessions']} sessions read)")
    if args.provenance is not None:
        from ostinato.sessions.provenance import table_entry, update_provenance

        command = (f"sessions tables --source {args.source} --mirror {args.mirror} --tokenizers "
                   f"{' '.join(args.tokenizers)} --provenance {args.provenance} --out {args.out}")
        entry = table_entry(args.source, args.out, args.mirror, len(counter["files"]), counter["sessions"], n,
                            list(args.tokenizers), argv=command.split())
        update_provenance(args.provenance, args.source, entry)
    print(f"wrote {n} rows of {counter['sessions']} sessions to {args.out}", file=sys.stderr)
    return 0


def run_split(args: argparse.Namespace) -> int:
    """Handler of `sessions split`; writes the split file and prints the set sizes."""
    from ostinato.sessions.splits import SplitSpec, make_splits, write_splits
    from ostinato.atomic import sha256_file
    from ostinato.sessions.tables import read_table

    spec = SplitSpec(seed=args.seed)
    sets = make_splits(read_table(args.swe_table), read_table(args.tau2_table), spec, swe_source=args.swe_source)
    tables = {args.swe_source: {"table": args.swe_table.name, "sha256": sha256_file(args.swe_table)},
              "tau2": {"table": args.tau2_table.name, "sha256": sha256_file(args.tau2_table)}}
    command = (f"ostinato sessions split --swe-table {args.swe_table} --tau2-table {args.tau2_table} "
               f"--swe-source {args.swe_source} --seed {args.seed} --out {args.out}")
    write_splits(sets, spec, args.out, tables, command=command)
    for name, s in sets.items():
        print(f"{name}: {len(s.sessions)} sessions" + (f", first {s.max_requests} turns" if s.max_requests else ""),
              file=sys.stderr)
    return 0
