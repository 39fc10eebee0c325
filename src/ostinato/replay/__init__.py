"""Replay harness: llama-server lifecycle, streaming client, resumable runner and result tables."""

from ostinato.replay.client import RequestInput, RequestOutput, consume_stream, erase_slot, send_completion
from ostinato.replay.results import load_requests, load_runs, summarize_sessions
from ostinato.replay.runner import ReplayConfig, RunSummary, replay_session, run_replay
from ostinato.replay.server import LlamaServer, ServerConfig, ServerError, free_port
from ostinato.replay.store import ResultStore

__all__ = [
    "RequestInput", "RequestOutput", "consume_stream", "erase_slot", "send_completion", "load_requests", "load_runs",
    "summarize_sessions", "ReplayConfig", "RunSummary", "replay_session", "run_replay", "LlamaServer",
    "ServerConfig", "ServerError", "free_port", "ResultStore",
]
