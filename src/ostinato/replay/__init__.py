"""Replay harness: resumable runner of sessions against an engine, per-request records and result tables.

The server it drives and the streaming client are `ostinato.server`.
"""

from ostinato.replay.results import load_requests, load_runs, summarize_sessions
from ostinato.replay.runner import ReplayConfig, RunSummary, replay_session, run_replay
from ostinato.replay.store import ResultStore

__all__ = ["load_requests", "load_runs", "summarize_sessions", "ReplayConfig", "RunSummary", "replay_session",
           "run_replay", "ResultStore"]
