"""Session data model: chat messages, agent requests and their tokenized form, with JSONL I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Literal

from ostinato.atomic import atomic_open

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
    def from_json(cls, obj: dict) -> "TokenizedRequest":
        """Parse one request object written by `to_json`."""
        kind = obj["kind"]
        if kind not in KINDS:
            raise ValueError(f"request kind {kind!r} is not one of {KINDS}")
        return cls(
            turn=int(obj["turn"]),
            kind=kind,
            new_token_ids=tuple(int(t) for t in obj["new_token_ids"]),
            output_token_ids=tuple(int(t) for t in obj["output_token_ids"]),
            n_output_recorded=None if obj.get("n_output_recorded") is None else int(obj["n_output_recorded"]),
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
        """Parse one session object written by `to_json`."""
        return cls(
            session_id=str(obj["session"]),
            source=str(obj.get("source", "")),
            tokenizer=str(obj.get("tokenizer", "")),
            template=str(obj.get("template", "")),
            requests=tuple(TokenizedRequest.from_json(r) for r in obj["requests"]),
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


def iter_sessions_jsonl(path: Path) -> Iterator[TokenizedSession]:
    """Yield the sessions of a JSONL file written by `write_sessions_jsonl`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sessions file {path} does not exist (expected JSON lines from `ostinato sessions build`)")
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield TokenizedSession.from_json(json.loads(line))
            except (KeyError, TypeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a session line ({exc})") from exc


def read_sessions_jsonl(path: Path) -> list[TokenizedSession]:
    """Return all sessions of a JSONL file; duplicate session ids are an error."""
    sessions = list(iter_sessions_jsonl(path))
    seen: set[str] = set()
    for s in sessions:
        if s.session_id in seen:
            raise ValueError(f"{path}: duplicate session id {s.session_id!r}")
        seen.add(s.session_id)
    return sessions
