"""The local-agent check: the `ostinato` llama-server, started with a residency plan, serves an agent through the
official `openai` Python client as an agent framework would call it: a chat completion, the same one streamed, a
request with tool definitions and `tool_choice`, and a conversation holding an assistant's tool call and the tool's
result. Each exchange is checked for a well-formed answer; with random weights the text is noise and the model does
not choose a tool, so what is checked is that the server takes the requests, renders the tools and the tool turns
into the prompt (its prompt grows by them) and answers in the API's shape.

The synthesized models carry no chat template and llama.cpp's ChatML fallback drops tool definitions and tool
calls, so the server gets `--jinja` and `TOOLS_TEMPLATE`: ChatML with tools in Qwen3's layout (`<tools>` in the system
turn, `<tool_call>` in the assistant's, `<tool_response>` in a user turn).
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ostinato.atomic import atomic_open
from ostinato.server.launcher import LlamaServer, ServerConfig

TOOLS_TEMPLATE = """\
{%- if tools -%}
<|im_start|>system
{% if messages[0].role == "system" %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == "system" -%}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif -%}
{%- for message in messages -%}
{%- if message.role == "user" or (message.role == "system" and not loop.first) -%}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == "assistant" -%}
<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{%- if message.tool_calls %}{% for call in message.tool_calls %}{% if call.function is defined %}\
{% set call = call.function %}{% endif %}{% if (loop.first and message.content) or not loop.first %}
{% endif %}<tool_call>
{"name": "{{ call.name }}", "arguments": {% if call.arguments is string %}{{ call.arguments }}\
{% else %}{{ call.arguments | tojson }}{% endif %}}
</tool_call>{% endfor %}{% endif %}<|im_end|>
{% elif message.role == "tool" -%}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""

TOOLS = [{"type": "function", "function": {
    "name": "list_files", "description": "List the files of a directory of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "a directory"}},
                   "required": ["path"]}}}]
SYSTEM = "You are a coding agent working in a repository. Use the tools to look around."
USER = "Which files are in the repository's top directory?"
FINISH = ("stop", "length", "tool_calls")


@dataclass(frozen=True)
class AgentCheck:
    """How to start the server: binary, model, residency plan, threads, context, log, extra arguments."""

    server_bin: Path
    model: Path
    plan: Path | None = None
    threads: int = 2
    ctx_size: int = 2048
    log: Path | None = None
    server_args: tuple[str, ...] = ()
    max_tokens: int = 16
    startup_timeout_s: float = 300.0


@dataclass
class Exchange:
    """One request through the client: whether its answer is well-formed, and what was seen."""

    name: str
    ok: bool
    detail: dict = field(default_factory=dict)
    problem: str = ""


@dataclass
class AgentReport:
    """Every exchange of one check, and how the server was started."""

    server: dict
    exchanges: list[Exchange]

    @property
    def ok(self) -> bool:
        return bool(self.exchanges) and all(e.ok for e in self.exchanges)

    def write(self, path: Path) -> None:
        with atomic_open(path) as fh:
            json.dump({"ok": self.ok, "server": self.server, "exchanges": [asdict(e) for e in self.exchanges]},
                      fh, indent=2)
            fh.write("\n")


def _message_problem(resp) -> str:
    """What is wrong with a non-streamed chat completion ("" when it is well-formed)."""
    if not resp.choices:
        return "no choices"
    choice = resp.choices[0]
    msg = choice.message
    if msg.role != "assistant":
        return f"role {msg.role!r}"
    if choice.finish_reason not in FINISH:
        return f"finish_reason {choice.finish_reason!r}"
    if not (msg.content or msg.tool_calls):
        return "neither content nor tool calls"
    for call in msg.tool_calls or []:
        if call.function.name not in {t["function"]["name"] for t in TOOLS}:
            return f"a call of an unknown tool {call.function.name!r}"
        try:
            json.loads(call.function.arguments)
        except ValueError:
            return f"tool call arguments are not JSON: {call.function.arguments!r}"
    if resp.usage is None or resp.usage.completion_tokens < 1 or resp.usage.prompt_tokens < 1:
        return "no usage"
    return ""


def _detail(resp) -> dict:
    choice = resp.choices[0] if resp.choices else None
    return {"finish_reason": choice.finish_reason if choice else None,
            "tool_calls": len(choice.message.tool_calls or []) if choice else 0,
            "content_chars": len(choice.message.content or "") if choice else 0,
            "prompt_tokens": resp.usage.prompt_tokens if resp.usage else None,
            "completion_tokens": resp.usage.completion_tokens if resp.usage else None}


def converse(client, model: str, max_tokens: int) -> list[Exchange]:
    """The four exchanges of an agent's turn through an `openai.OpenAI` client (greedy, so the streamed text must
    equal the non-streamed one)."""
    base = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    common = dict(model=model, max_tokens=max_tokens, temperature=0, seed=0)
    out = []

    chat = client.chat.completions.create(messages=base, **common)
    out.append(Exchange("chat", not _message_problem(chat), _detail(chat), _message_problem(chat)))

    chunks = list(client.chat.completions.create(messages=base, stream=True,
                                                 stream_options={"include_usage": True}, **common))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    pieces = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    problem = ("fewer than two content chunks" if pieces < 2 else
               f"finish_reason {finish}" if (finish[-1] if finish else None) not in FINISH else
               "streamed text differs from the non-streamed answer" if text != (chat.choices[0].message.content or "")
               else "")
    out.append(Exchange("stream", not problem, {"chunks": len(chunks), "content_chunks": pieces,
                                                 "finish_reason": finish[-1] if finish else None}, problem))

    tools = client.chat.completions.create(messages=base, tools=TOOLS, tool_choice="required", **common)
    problem = _message_problem(tools)
    if not problem and tools.usage.prompt_tokens <= chat.usage.prompt_tokens:
        problem = "the tool definitions did not reach the prompt"
    out.append(Exchange("tools", not problem, _detail(tools), problem))

    call = {"id": "call_0", "type": "function",
            "function": {"name": "list_files", "arguments": json.dumps({"path": "."})}}
    turn = base + [{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "call_0", "content": "README.md\nsrc/\ntests/"}]
    result = client.chat.completions.create(messages=turn, tools=TOOLS, **common)
    problem = _message_problem(result)
    if not problem and result.usage.prompt_tokens <= tools.usage.prompt_tokens:
        problem = "the tool call and its result did not reach the prompt"
    out.append(Exchange("tool_result", not problem, _detail(result), problem))
    return out


def _tail(log: Path, n_bytes: int = 4000) -> str:
    """The end of the server's log, for a failure's reason."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    return f"--- the end of the server log {log}:\n{text[-n_bytes:]}\n"


def run_agent_check(check: AgentCheck) -> AgentReport:
    """Start the server with the plan, run the exchanges through the OpenAI client, stop the server."""
    import openai

    with tempfile.TemporaryDirectory(prefix="ostinato-agent-") as tmp:
        template = Path(tmp) / "chat-template.jinja"
        template.write_text(TOOLS_TEMPLATE, encoding="utf-8")
        args = ["-c", str(check.ctx_size), "-t", str(check.threads), "--jinja", "--chat-template-file", str(template)]
        if check.plan is not None:
            args += ["--residency-plan", str(check.plan)]
        log = check.log or Path(tmp) / "server.log"
        cfg = ServerConfig(binary=check.server_bin, model=check.model, args=args + list(check.server_args),
                           log_path=log, startup_timeout_s=check.startup_timeout_s)
        try:
            with LlamaServer(cfg) as srv:
                client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="no-key", timeout=120, max_retries=0)
                exchanges = converse(client, check.model.stem, check.max_tokens)
        except Exception:
            sys.stderr.write(_tail(log))
            raise
        log_text = log.read_text(encoding="utf-8", errors="replace")
        if not all(e.ok for e in exchanges):
            sys.stderr.write(_tail(log))
    if check.plan is not None:
        loaded = "resident experts" in log_text and "residency plan" in log_text
        exchanges.insert(0, Exchange("plan", loaded, {"plan": str(check.plan)},
                                     "" if loaded else "the server log does not show the residency plan loaded"))
    server = {"binary": str(check.server_bin), "model": str(check.model), "plan": str(check.plan or ""),
              "chat_template": "ChatML with tools (ostinato.artifact.agent.TOOLS_TEMPLATE), --jinja",
              "openai": openai.__version__}
    return AgentReport(server, exchanges)
