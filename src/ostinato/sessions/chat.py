"""Simple chat framing (role markers) so tokenized requests include the template overhead."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ostinato.sessions.model import Message


@dataclass(frozen=True)
class ChatTemplate:
    """Role markers around each message; `generation` opens the assistant turn the model writes."""

    name: str
    begin: str  # format fields: {role}, {Role} (capitalized)
    end: str
    generation: str
    tool_call_begin: str = "<tool_call>\n"
    tool_call_end: str = "\n</tool_call>"

    def render_message(self, msg: Message) -> str:
        """Render one non-assistant message (system, user, tool) with its role markers."""
        return self.begin.format(role=msg.role, Role=msg.role.capitalize()) + msg.content + self.end

    def render_output(self, msg: Message) -> str:
        """Render what the model writes for an assistant message: text, tool calls, end marker."""
        parts = [msg.content]
        for call in msg.tool_calls:
            parts.append(self.tool_call_begin + json.dumps(call, ensure_ascii=False, sort_keys=True) + self.tool_call_end)
        return "".join(p for p in parts if p) + self.end

    def render_prompt(self, messages: tuple[Message, ...]) -> str:
        """Render the new input of a request: its messages, then the assistant generation marker."""
        out = []
        for m in messages:
            if m.role == "assistant":  # e.g. a scripted greeting that no model produced
                out.append(self.generation + self.render_output(m))
            else:
                out.append(self.render_message(m))
        return "".join(out) + self.generation


CHATML = ChatTemplate(
    name="chatml",
    begin="<|im_start|>{role}\n",
    end="<|im_end|>\n",
    generation="<|im_start|>assistant\n",
)

DEEPSEEK = ChatTemplate(
    name="deepseek",
    begin="<｜{Role}｜>",
    end="<｜end▁of▁sentence｜>",
    generation="<｜Assistant｜>",
)

TEMPLATES: dict[str, ChatTemplate] = {t.name: t for t in (CHATML, DEEPSEEK)}

# Default template per tokenizer name (byte and qwen use ChatML markers).
DEFAULT_TEMPLATE: dict[str, str] = {"byte": "chatml", "qwen": "chatml", "deepseek": "deepseek"}


def get_template(name: str) -> ChatTemplate:
    """Return the named chat template; ValueError lists the known names."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"--template {name!r} is not one of {sorted(TEMPLATES)}") from None
