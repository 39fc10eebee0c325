"""Agent sessions: trace readers, chat framing, tokenization and the JSONL the replay reads."""

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
from ostinato.sessions.readers import iter_source, read_swe_mini, split_requests, tau2_sessions
from ostinato.sessions.tokenize import Caps, resolve_tokenizer, tokenize_session

__all__ = [
    "CHATML", "DEEPSEEK", "ChatTemplate", "get_template", "Message", "Request", "Session",
    "TokenizedRequest", "TokenizedSession", "read_sessions_jsonl", "write_sessions_jsonl",
    "iter_source", "read_swe_mini", "split_requests", "tau2_sessions", "Caps", "resolve_tokenizer",
    "tokenize_session",
]
