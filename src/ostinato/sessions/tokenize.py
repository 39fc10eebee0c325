"""Tokenization of sessions: tokenizer lookup by name and per-request token ids with optional caps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ostinato.sessions.chat import ChatTemplate
from ostinato.sessions.model import Session, TokenizedRequest, TokenizedSession

Tokenizer = Callable[[str], list[int]]
TOKENIZERS: tuple[str, ...] = ("byte", "deepseek", "qwen")


def resolve_tokenizer(name: str) -> Tokenizer:
    """Return the tokenizer of a synthesized model's vocabulary (`ostinato.models.vocab`) by name."""
    if name not in TOKENIZERS:
        raise ValueError(f"--tokenizer {name!r} is not one of {TOKENIZERS}")
    from ostinato.models.vocab import get_tokenizer  # deferred: loads vocabulary packages

    return get_tokenizer(name).encode


@dataclass(frozen=True)
class Caps:
    """Optional limits that keep a selection small: per-request token caps, requests and context per session."""

    max_requests: int | None = None
    max_new_tokens: int | None = None
    max_output_tokens: int | None = None
    max_context_tokens: int | None = None


def tokenize_session(
    session: Session,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    tokenizer_name: str = "custom",
    caps: Caps = Caps(),
    prefer_recorded: bool = False,
    seed: int = 0,
) -> TokenizedSession:
    """Render and tokenize each request (new input with role markers, output with tool calls).

    With `prefer_recorded`, a request whose trace recorded its completion tokens gets that many output
    ids: the tokenized reply's head if shorter, else the reply preceded by ids synthesized (seeded by
    `seed` and the session id) for what the text does not show (reasoning). Caps then truncate the
    new/output ids of a request (keeping the head) and stop the session before the request that would
    pass `max_requests` or `max_context_tokens`.
    """
    from ostinato.sessions.synth import IDS_TOKENIZED, fit_output, normal_token_ids, session_rng  # no cycle

    rng = session_rng(seed, session.session_id) if prefer_recorded else None
    out: list[TokenizedRequest] = []
    context = 0
    n_synth = 0
    for turn, req in enumerate(session.requests):
        if caps.max_requests is not None and turn >= caps.max_requests:
            break
        new_ids = list(tokenizer(template.render_prompt(req.new_messages)))
        out_ids = list(tokenizer(template.render_output(req.output)))
        recorded = req.recorded_output_tokens
        if prefer_recorded and recorded:
            out_ids, padded = fit_output(out_ids, recorded, rng, normal_token_ids(tokenizer_name))
            n_synth += padded
        if caps.max_new_tokens is not None:
            new_ids = new_ids[: caps.max_new_tokens]
        if caps.max_output_tokens is not None:
            out_ids = out_ids[: caps.max_output_tokens]
        if not out_ids:
            raise ValueError(f"{session.session_id} turn {turn}: empty output after tokenization")
        if caps.max_context_tokens is not None and context + len(new_ids) + len(out_ids) > caps.max_context_tokens:
            break
        context += len(new_ids) + len(out_ids)
        out.append(TokenizedRequest(turn=turn, kind=req.kind, new_token_ids=tuple(new_ids),
                                    output_token_ids=tuple(out_ids), n_output_recorded=recorded))
    meta = {"ids": IDS_TOKENIZED, "n_requests_recorded": len(session.requests),
            "output_count": "recorded" if prefer_recorded else "text", **session.meta}
    if prefer_recorded:
        meta.update(seed=int(seed), n_output_synthesized=n_synth)
    return TokenizedSession(
        session_id=session.session_id,
        source=session.source,
        tokenizer=tokenizer_name,
        template=template.name,
        requests=tuple(out),
        meta=meta,
    )
