"""Session data model: chat messages, agent requests and their tokenized form, with JSONL I/O.

A sessions JSONL line has one definition, `session.schema.json` (plus the agreements `check_session_line` adds);
every reader of these files (the replay, routing layouts, the simulator, the capacity test) goes through it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal

from ostinato.atomic import atomic_open
from ostinato.errors import InputError
from ostinato.inputs import open_regular, parse_json
from ostinato.schemas import first_error

SESSION_SCHEMA = "session.schema.json"

RequestKind = Literal["first", "tool", "user"]
KINDS: tuple[str, ...] = ("first", "tool", "user")


@dataclass(frozen=True)
class Message:
    """One chat message as recorded by a trace (role, text, tool calls as dicts)."""

    role: str
    content: str
    tool_calls: tuple[dict, ...] = ()
    completion_tokens: int | None = None  # recorded by the trace (the agent model's own count), if any


@dataclass(frozen=True)
class Request:
    """One agent request: the messages new since the previous assistant message, and its reply."""

    kind: RequestKind
    new_messages: tuple[Message, ...]
    output: Message

    @property
    def recorded_output_tokens(self) -> int | None:
        """Completion tokens the trace recorded for this reply (None when the file has none)."""
        return self.output.completion_tokens


@dataclass(frozen=True)
class Session:
    """One agent session from a trace: an id (stable, sortable), its source and its requests."""

    session_id: str
    source: str
    requests: tuple[Request, ...]
    meta: dict = field(default_factory=dict)  # e.g. tau2 domain, source file name


@dataclass(frozen=True)
class TokenizedRequest:
    """A request as the replay sends it: the new prompt token ids and the forced output token ids."""

    turn: int
    kind: str
    new_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    n_output_recorded: int | None = None  # the trace's completion-token count, when it has one

    @property
    def n_new(self) -> int:
        """Number of new input tokens of this request."""
        return len(self.new_token_ids)

    @property
    def n_output(self) -> int:
        """Number of recorded output tokens of this request."""
        return len(self.output_token_ids)

    def to_json(self) -> dict:
        """Return the JSON object of one request (ids and counts)."""
        return {
            "turn": self.turn,
            "kind": self.kind,
            "n_new": self.n_new,
            "n_output": self.n_output,
            "new_token_ids": list(self.new_token_ids),
            "output_token_ids": list(self.output_token_ids),
            "n_output_recorded": self.n_output_recorded,
        }

    @classmethod
    def from_json(cls, obj: dict, turn: int = 0) -> "TokenizedRequest":
        """Parse one request object written by `to_json` (checked by `check_session_line`); `turn` if it has none."""
        return cls(
            turn=int(obj.get("turn", turn)),
            kind=obj["kind"],
            new_token_ids=tuple(obj["new_token_ids"]),
            output_token_ids=tuple(obj["output_token_ids"]),
            n_output_recorded=obj.get("n_output_recorded"),
        )


@dataclass(frozen=True)
class TokenizedSession:
    """A session ready to replay: id, provenance (source, tokenizer, template) and requests."""

    session_id: str
    source: str
    tokenizer: str
    template: str
    requests: tuple[TokenizedRequest, ...]
    meta: dict = field(default_factory=dict)

    @property
    def n_context(self) -> int:
        """Total tokens of the whole conversation (all new and output tokens)."""
        return sum(r.n_new + r.n_output for r in self.requests)

    def to_json(self) -> dict:
        """Return the JSON object of one session (one JSONL line)."""
        return {
            "session": self.session_id,
            "source": self.source,
            "tokenizer": self.tokenizer,
            "template": self.template,
            "n_requests": len(self.requests),
            "n_context": self.n_context,
            "meta": self.meta,
            "requests": [r.to_json() for r in self.requests],
        }

    @classmethod
    def from_json(cls, obj: dict) -> "TokenizedSession":
        """Parse one session object written by `to_json` (checked by `check_session_line`, with token ids)."""
        return cls(
            session_id=obj["session"],
            source=obj.get("source", ""),
            tokenizer=obj.get("tokenizer", ""),
            template=obj.get("template", ""),
            requests=tuple(TokenizedRequest.from_json(r, i) for i, r in enumerate(obj["requests"])),
            meta=dict(obj.get("meta") or {}),
        )


def write_sessions_jsonl(sessions: Iterable[TokenizedSession], path: Path) -> int:
    """Write sessions as JSON lines atomically (temp file, then rename); return the count."""
    n = 0
    with atomic_open(path) as fh:
        for s in sessions:
            fh.write(json.dumps(s.to_json(), separators=(",", ":")) + "\n")
            n += 1
    return n


@lru_cache(maxsize=1)
def _vocab_sizes() -> dict[str, int]:
    """Vocabulary size of each tokenizer name a session line may carry (deferred: ostinato.models loads more)."""
    from ostinato.models.vocab import VOCAB_SIZES

    return dict(VOCAB_SIZES)


def check_session_line(obj: object) -> str | None:
    """What is wrong with one parsed sessions line (`key '...': ...`), or None: the schema, then the agreements it
    cannot state (counts and ids, n_requests, n_context, ids below the vocabulary of a known tokenizer)."""
    err = first_error("ostinato.sessions", SESSION_SCHEMA, obj)
    if err is not None:
        return err
    requests = obj["requests"]
    if "n_requests" in obj and obj["n_requests"] != len(requests):
        return f"key 'n_requests': {obj['n_requests']}, the line has {len(requests)} requests"
    n_vocab = _vocab_sizes().get(obj.get("tokenizer", ""))
    context = 0
    for i, r in enumerate(requests):
        for ids, count in (("new_token_ids", "n_new"), ("output_token_ids", "n_output")):
            if ids in r and count in r and len(r[ids]) != r[count]:
                return f"key 'requests[{i}].{count}': {r[count]}, but {ids} holds {len(r[ids])}"
            if ids in r and n_vocab is not None and r[ids] and max(r[ids]) >= n_vocab:
                bad = next(j for j, t in enumerate(r[ids]) if t >= n_vocab)
                return (f"key 'requests[{i}].{ids}[{bad}]': token id {r[ids][bad]} is outside the {obj['tokenizer']} "
                        f"vocabulary ({n_vocab} tokens)")
        context += len(r["new_token_ids"]) if "new_token_ids" in r else r["n_new"]
        context += len(r["output_token_ids"]) if "output_token_ids" in r else r["n_output"]
    if "n_context" in obj and obj["n_context"] != context:
        return f"key 'n_context': {obj['n_context']}, the requests hold {context} tokens"
    return None


def _where(path: Path, lineno: int, obj: object) -> str:
    """`file:line: session <id>` (the session when the line names one)."""
    sid = obj.get("session") if isinstance(obj, dict) else None
    return f"{path}:{lineno}: session {sid}" if isinstance(sid, str) and sid else f"{path}:{lineno}"


OnBad = Callable[[InputError], None]


def _numbered_lines(path: str | os.PathLike, on_bad: OnBad | None,
                    need_ids: bool) -> Iterator[tuple[int, dict]]:
    """(line number, checked object) of each non-blank line; see `iter_session_lines`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"sessions file {path} does not exist (expected JSON lines from `ostinato sessions build`)")
    with open_regular(path, "a sessions JSONL file") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InputError(f"{path}:{lineno}: not UTF-8 text (byte {exc.start})") from None
                if not text.strip():
                    continue
                obj = parse_json(text, f"{path}:{lineno}", "one session per line")
                err = check_session_line(obj)
                if err is None and need_ids:
                    counts = [i for i, r in enumerate(obj["requests"])
                              if "new_token_ids" not in r or "output_token_ids" not in r]
                    if counts:
                        err = (f"key 'requests[{counts[0]}]': token counts without token ids (a replay sends "
                               f"new_token_ids and output_token_ids: `ostinato sessions build` writes them)")
                if err is not None:
                    raise InputError(f"{_where(path, lineno, obj)}: {err}")
            except InputError as exc:
                if on_bad is None:
                    raise
                on_bad(exc)
                continue
            yield lineno, obj


def iter_session_lines(path: str | os.PathLike, on_bad: OnBad | None = None) -> Iterator[dict]:
    """Yield the checked objects of a sessions JSONL file (blank lines skipped). A bad line raises an InputError
    naming the file, the line and the session, or, with `on_bad`, is passed to it and skipped."""
    for _, obj in _numbered_lines(path, on_bad, need_ids=False):
        yield obj


def iter_sessions_jsonl(path: Path, on_bad: OnBad | None = None) -> Iterator[TokenizedSession]:
    """Yield the sessions of a JSONL file written by `write_sessions_jsonl` (every request with its token ids)."""
    for _, obj in _numbered_lines(path, on_bad, need_ids=True):
        yield TokenizedSession.from_json(obj)


def read_sessions_jsonl(path: Path, on_bad: OnBad | None = None) -> list[TokenizedSession]:
    """Return all sessions of a JSONL file; a second line with a session id already seen is bad too (an error, or
    `on_bad`'s and skipped)."""
    sessions: list[TokenizedSession] = []
    seen: set[str] = set()
    for lineno, obj in _numbered_lines(path, on_bad, need_ids=True):
        if obj["session"] in seen:
            exc = InputError(f"{path}:{lineno}: session {obj['session']}: duplicate session id")
            if on_bad is None:
                raise exc
            on_bad(exc)
            continue
        seen.add(obj["session"])
        sessions.append(TokenizedSession.from_json(obj))
    return sessions


def iter_session_counts(path: str | os.PathLike) -> Iterator[tuple[str, list[tuple[str, int, int]]]]:
    """Yield (session id, [(kind, n_new, n_output) per request]) of a sessions JSONL file, ids or counts."""
    for obj in iter_session_lines(path):
        yield obj["session"], [
            (r["kind"], len(r["new_token_ids"]) if "new_token_ids" in r else r["n_new"],
             len(r["output_token_ids"]) if "output_token_ids" in r else r["n_output"]) for r in obj["requests"]]
