"""The local-agent check (ARTIFACT.md A21): the `ostinato` llama-server of the CPU build, started with a residency
plan, serves the official `openai` client as an agent framework would call it (chat, streaming, tools, a tool
result). The tiny model has random weights: the answers' shape is checked, not their text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ostinato.artifact.agent import TOOLS_TEMPLATE, AgentCheck, converse, run_agent_check
from ostinato.models.gguf_shape import moe_shape_from_gguf
from ostinato.residency.budget import single_gpu_plan
from ostinato.residency.planfile import write_plan
from ostinato.server.launcher import LlamaServer, ServerConfig


@pytest.fixture(scope="module")
def plan(engine_variants, tiny_v4_model, llama_tree, tmp_path_factory) -> Path:
    """Half of every MoE layer's experts resident, as the pipeline's replay plans them."""
    shape = moe_shape_from_gguf(tiny_v4_model, llama_tree)
    path = tmp_path_factory.mktemp("agent") / "plan.json"
    write_plan(path, single_gpu_plan(shape, {l: list(range(shape.n_expert // 2)) for l in shape.moe_layers()}))
    return path


def test_openai_client_chat_stream_and_tools_with_a_plan(engine_variants, tiny_v4_model, plan, tmp_path):
    log = tmp_path / "server.log"
    report = run_agent_check(AgentCheck(engine_variants["ostinato"] / "llama-server", tiny_v4_model, plan, log=log))
    by_name = {e.name: e for e in report.exchanges}
    assert list(by_name) == ["plan", "chat", "stream", "tools", "tool_result"]
    assert report.ok, [(e.name, e.problem) for e in report.exchanges if not e.ok]
    # the tool definitions and then the tool call and its result reach the prompt
    assert by_name["chat"].detail["prompt_tokens"] < by_name["tools"].detail["prompt_tokens"] \
        < by_name["tool_result"].detail["prompt_tokens"]
    assert by_name["stream"].detail["content_chunks"] >= 2
    text = log.read_text(errors="replace")
    assert "resident experts" in text and "--jinja" in text
    out = tmp_path / "local_agent.json"
    report.write(out)
    doc = json.loads(out.read_text())
    assert doc["ok"] and [e["ok"] for e in doc["exchanges"]] == [True] * 5


def test_without_the_tools_template_the_tools_are_dropped(engine_variants, tiny_v4_model, plan, tmp_path):
    """Why the check starts the server with its own template: llama.cpp's ChatML fallback for a model without a chat
    template renders neither the tool definitions nor the tool turns, so the prompt does not grow by them."""
    import openai

    cfg = ServerConfig(binary=engine_variants["ostinato"] / "llama-server", model=tiny_v4_model,
                       args=["-c", "2048", "-t", "2", "--residency-plan", str(plan)],
                       log_path=tmp_path / "server.log", startup_timeout_s=120)
    with LlamaServer(cfg) as srv:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="no-key", timeout=120, max_retries=0)
        exchanges = {e.name: e for e in converse(client, "tiny", 8)}
    assert exchanges["chat"].ok and exchanges["stream"].ok
    assert not exchanges["tools"].ok and exchanges["tools"].problem == "the tool definitions did not reach the prompt"
    assert "<tool_call>" in TOOLS_TEMPLATE and "<tool_response>" in TOOLS_TEMPLATE


def test_a_server_that_does_not_start_is_an_error_with_its_log(engine_variants, tiny_v4_model, tmp_path, capsys):
    from ostinato.server.launcher import ServerError

    with pytest.raises(ServerError):
        run_agent_check(AgentCheck(engine_variants["ostinato"] / "llama-server", tiny_v4_model,
                                   tmp_path / "no-plan.json", startup_timeout_s=60))
    assert "the end of the server log" in capsys.readouterr().err
