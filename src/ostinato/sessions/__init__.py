"""Agent sessions: trace readers, chat framing, tokenization and the JSONL the replay reads.

Modules: readers (tau2, mini-swe-agent), rebench (SWE-rebench rows), chat, tokenize, tables (per-turn counts),
synth (ids from counts), splits (Table 2 sets), stats (Table 2 rows), sources (mirror / URL / table), provenance.
"""

from ostinato.sessions.chat import CHATML, DEEPSEEK, ChatTemplate, get_template
from ostinato.sessions.model import (
    Message,
    Request,
    Session,
    TokenizedRequest,
    TokenizedSession,
    read_sessions_jsonl,
    write_sessions_jsonl,
)
from ostinato.sessions.readers import TraceError, iter_source, read_swe_mini, split_requests, tau2_sessions
from ostinato.sessions.tokenize import Caps, resolve_tokenizer, tokenize_session

__all__ = [
    "CHATML", "DEEPSEEK", "ChatTemplate", "get_template", "Message", "Request", "Session",
    "TokenizedRequest", "TokenizedSession", "read_sessions_jsonl", "write_sessions_jsonl",
    "iter_source", "read_swe_mini", "split_requests", "tau2_sessions", "Caps", "resolve_tokenizer",
    "tokenize_session", "TraceError",
]
