"""Hand-made mini-swe-agent trajectories for the session tests, written to a directory at test time (no trace file
is committed: public traces stay in ../shared/traces)."""

from __future__ import annotations

import json
from pathlib import Path

TRAJECTORIES: dict[str, dict] = {
    "demo__demo-1": {
        "trajectory_format": "mini-swe-agent-1",
        "instance_id": "demo__demo-1",
        "info": {
            "exit_status": "Submitted"
        },
        "messages": [
            {
                "role": "system",
                "content": "You are a helpful assistant that runs one bash command per reply."
            },
            {
                "role": "user",
                "content": "<pr_description>Fix the off-by-one in count().</pr_description>"
            },
            {
                "role": "assistant",
                "content": "THOUGHT: look around.\n\n```bash\nls\n```",
                "extra": {
                    "response": {
                        "usage": {
                            "prompt_tokens": 40,
                            "completion_tokens": 12
                        }
                    }
                }
            },
            {
                "role": "user",
                "content": "<returncode>0</returncode>\n<output>count.py\n</output>"
            },
            {
                "role": "assistant",
                "content": "THOUGHT: read it.\n\n```bash\ncat count.py\n```"
            },
            {
                "role": "user",
                "content": "<returncode>0</returncode>\n<output>def count(x): return len(x) - 1\n</output>"
            },
            {
                "role": "assistant",
                "content": "THOUGHT: fix — naïve −1.\n\n```bash\nsed -i 's/ - 1//' count.py\n```"
            },
            {
                "role": "user",
                "content": "diff --git a/count.py b/count.py"
            }
        ]
    },
    "alpha__alpha-7": {
        "trajectory_format": "mini-swe-agent-1",
        "instance_id": "alpha__alpha-7",
        "messages": [
            {
                "role": "system",
                "content": "System prompt."
            },
            {
                "role": "user",
                "content": "Task: say hi."
            },
            {
                "role": "assistant",
                "content": "```bash\necho hi\n```"
            },
            {
                "role": "user",
                "content": "<returncode>0</returncode>\n<output>hi</output>"
            },
            {
                "role": "assistant",
                "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"
            }
        ]
    }
}


def write_swe_mini(directory: Path) -> Path:
    """Write every trajectory as <name>.traj.json under `directory` and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, doc in TRAJECTORIES.items():
        (directory / f"{name}.traj.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False), encoding="utf-8")
    return directory
