"""Agent-trace formats a user may bring, told apart by their keys, so a reader refuses another format by name
instead of reading it as its own (no sessions, or nonsense).

Read: mini-swe-agent trajectories (`--source swe-mini`), tau2-bench simulations (`tau2`) and chat rows of
SWE-rebench's OpenHands trajectories (`swe-rebench`). Named and refused: SWE-agent trajectories (`.traj`:
`trajectory` steps of thought/action/observation, `history` messages with `agent`/`message_type`), OpenHands event
streams (events with `source` and `action`/`observation`, as in its evaluation output's `history`) and Agent Data
Protocol samples (`content` of steps tagged `class_`).
"""

from __future__ import annotations

from pathlib import Path

READ = "ostinato reads mini-swe-agent trajectories (--source swe-mini), tau2-bench simulations (--source tau2) " \
       "and SWE-rebench chat rows (--source swe-rebench); convert it to one of those (docs/sessions-and-replay.md)"

MINI_SWE_AGENT = "a mini-swe-agent trajectory"
TAU2 = "tau2-bench simulations"
SWE_REBENCH = "SWE-rebench chat rows"
SWE_AGENT = "a SWE-agent trajectory"
OPENHANDS = "an OpenHands event stream"
ADP = "an Agent Data Protocol sample"


def _has(items: object, keys: set[str]) -> bool:
    """Whether a list holds an object with one of `keys`."""
    return isinstance(items, list) and any(isinstance(x, dict) and keys & x.keys() for x in items[:50])


def _events(items: object) -> bool:
    """OpenHands events: `source` plus an `action` or `observation`."""
    return isinstance(items, list) and any(
        isinstance(x, dict) and "source" in x and ("action" in x or "observation" in x) for x in items[:50])


def sniff(doc: object) -> str | None:
    """The agent-trace format a parsed JSON document (or JSONL row) looks like, or None."""
    if isinstance(doc, list):
        first = next((x for x in doc if isinstance(x, dict)), None)
        if first is None:
            return None
        if "task_id" in first and "messages" in first:
            return TAU2
        if _events(doc):
            return OPENHANDS
        if "class_" in first:
            return ADP
        return sniff(first) if {"trajectory", "history", "content", "messages"} & first.keys() else None
    if not isinstance(doc, dict):
        return None
    if "simulations" in doc or "simulation_run" in doc:
        return TAU2
    if _has(doc.get("trajectory"), {"action", "observation", "thought", "response"}) \
            or _has(doc.get("history"), {"message_type", "agent"}):
        return SWE_AGENT
    if _events(doc.get("history")) or _events(doc.get("trajectory")):
        return OPENHANDS
    if _has(doc.get("content"), {"class_"}):
        return ADP
    if _has(doc.get("trajectory"), {"role"}):
        return SWE_REBENCH
    if isinstance(doc.get("messages"), list) and ("trajectory_format" in doc or "info" in doc):
        return MINI_SWE_AGENT
    return None


def other_format(where: str | Path, doc: object, expected: str) -> str | None:
    """The message for a document (at `where`: a file, a file's row) that is another known format than `expected`
    (None if it is not one)."""
    found = sniff(doc)
    if found is None or found == expected:
        return None
    return f"{where}: this is {found}, not {expected}; {READ}"
