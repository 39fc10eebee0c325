"""Streaming client of llama-server's native `/completion` endpoint (after vLLM's request functions)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import httpx


@dataclass(frozen=True)
class RequestInput:
    """One completion request: the whole prompt as token ids and the output tokens to force."""

    prompt_token_ids: tuple[int, ...]
    n_predict: int
    forced_token_ids: tuple[int, ...] = ()
    temperature: float = 0.0
    id_slot: int = 0
    cache_prompt: bool = True
    extra: dict = field(default_factory=dict)

    def payload(self) -> dict:
        """Return the JSON body sent to `/completion` (upstream ignores the `forced_tokens` field)."""
        body = {
            "prompt": list(self.prompt_token_ids),
            "n_predict": self.n_predict,
            "stream": True,
            "cache_prompt": self.cache_prompt,
            "return_tokens": True,
            "temperature": self.temperature,
            "ignore_eos": True,
            "id_slot": self.id_slot,
        }
        if self.forced_token_ids:
            body["forced_tokens"] = list(self.forced_token_ids)
        body.update(self.extra)
        return body

    def openai_payload(self, model: str) -> dict:
        """Return the JSON body of an OpenAI-compatible `/v1/completions` request: the same prompt token ids and
        output length; the API has no forced tokens, so the engine generates its own (greedy, EOS ignored)."""
        return {"model": model, "prompt": list(self.prompt_token_ids), "max_tokens": self.n_predict, "stream": True,
                "temperature": self.temperature, "ignore_eos": True, "stream_options": {"include_usage": True}}


@dataclass
class RequestOutput:
    """Client-side timing and tokens of one streamed completion, with the server's own timings."""

    success: bool = False
    error: str = ""
    t_send: float = 0.0  # time.perf_counter() when the request was sent
    t_first_token: float | None = None
    t_last_token: float | None = None
    t_done: float | None = None  # end of the stream
    wall_send: float = 0.0  # time.time() at send, to place the request in wall-clock time
    ttft: float | None = None
    latency: float | None = None  # send → end of stream
    itl: list[float] = field(default_factory=list)  # gaps between chunks carrying tokens
    token_ids: list[int] = field(default_factory=list)  # token ids streamed back
    n_chunks: int = 0  # chunks carrying at least one token
    n_output: int = 0  # server's tokens_predicted when known, else streamed token count
    timings: dict = field(default_factory=dict)  # the final chunk's `timings`
    final: dict = field(default_factory=dict)  # other fields of the final chunk (stop_type, tokens_cached…)
    connection_error: bool = False  # the server could not be reached or dropped the connection
    # with `n_probs` in the request: per streamed token, the ids and log-probabilities of the server's top tokens
    # (`completion_probabilities`), as sent: a bitwise check of two engines compares them (ostinato.replay.bitwise)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (latency − ttft) / (n − 1)."""
        if self.latency is None or self.ttft is None or self.n_output < 2:
            return None
        return (self.latency - self.ttft) / (self.n_output - 1)


# The request APIs of `send_completion`: "llama" is llama-server's /completion with the recorded outputs forced (the
# stock and ostinato engines); "llama-generate" the same endpoint and fields without forced outputs or routing, for
# llama.cpp forks that lack them (the engine generates outputs of the recorded length); "openai" /v1/completions.
APIS = ("llama", "llama-generate", "openai")
LLAMA_APIS = ("llama", "llama-generate")

_FINAL_KEYS = ("stop_type", "tokens_predicted", "tokens_evaluated", "tokens_cached", "truncated", "id_slot")


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """Yield the payload of each SSE `data:` line (comments, pings and other fields skipped)."""
    for line in lines:
        if line.startswith("data:"):
            yield line[5:].strip()


def _token_chunk(out: RequestOutput, now: float, last: float | None) -> float:
    """Time a chunk that carries output: TTFT at the first, an inter-token gap after; return `now`."""
    if out.t_first_token is None:
        out.t_first_token = now
        out.ttft = now - out.t_send
    else:
        out.itl.append(now - last)
    out.t_last_token = now
    out.n_chunks += 1
    return now


def _parse_chunk(data: str, out: RequestOutput) -> dict | None:
    """The JSON of one SSE payload, or None after recording a parse or server error in `out`."""
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as exc:
        out.error = f"bad SSE data {data[:80]!r}: {exc}"
        return None
    if "error" in chunk:
        err = chunk["error"]
        out.error = f"server error: {err.get('message', err) if isinstance(err, dict) else err}"
        return None
    return chunk


def _chunks(lines: Iterable[str], out: RequestOutput, clock) -> Iterator[tuple[float, dict]]:
    """(arrival time, JSON) of each SSE payload until `[DONE]`, or until one records an error in `out`."""
    for data in iter_sse_data(lines):
        now = clock()
        if data == "[DONE]":
            return
        chunk = _parse_chunk(data, out)
        if chunk is None:
            return
        yield now, chunk


def consume_stream(lines: Iterable[str], out: RequestOutput, clock=time.perf_counter,
                   text_chunks: bool = False) -> RequestOutput:
    """Fill `out` from the SSE lines of a `/completion` stream, timestamping chunks as they arrive.

    A chunk carries output when it streams token ids (`tokens`, llama-server with `return_tokens`). With
    `text_chunks` (api llama-generate), a server whose chunks have no `tokens` field at all (ik_llama.cpp) carries
    output in each non-final chunk with text; without it such a stream is an error, since forced outputs cannot be
    checked without the ids.
    """
    last = None
    for now, chunk in _chunks(lines, out, clock):
        tokens = chunk.get("tokens") or []
        if tokens:
            last = _token_chunk(out, now, last)
            out.token_ids.extend(int(t) for t in tokens)
        elif text_chunks and "tokens" not in chunk and chunk.get("content") and not chunk.get("stop"):
            # a server that streams no token ids (ik_llama.cpp's /completion): a chunk of text carries output
            last = _token_chunk(out, now, last)
        try:
            for p in chunk.get("completion_probabilities") or []:
                top = p.get("top_logprobs") or []
                out.top_ids.append([int(t["id"]) for t in top])
                out.top_logprobs.append([float(t["logprob"]) for t in top])
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            out.error = f"bad completion_probabilities in a chunk ({type(exc).__name__}: {exc})"
            return out
        if chunk.get("stop"):
            out.timings = dict(chunk.get("timings") or {})
            out.final = {k: chunk[k] for k in _FINAL_KEYS if k in chunk}
    if out.error:  # a payload that did not parse, or the server's error
        return out
    out.t_done = clock()
    out.latency = out.t_done - out.t_send
    out.n_output = int(out.final.get("tokens_predicted", len(out.token_ids)))
    if not out.final:
        out.error = "stream ended without a final chunk (stop=true)"
    elif out.t_first_token is None and out.n_output > 0:
        out.error = ("no chunk carried a token" if text_chunks else
                     "no chunk carried a token id (a server that streams no token ids, such as a llama.cpp fork, "
                     "cannot replay forced outputs: use --api llama-generate)")
    else:
        out.success = True
    return out


def consume_openai_stream(lines: Iterable[str], out: RequestOutput, clock=time.perf_counter) -> RequestOutput:
    """Fill `out` from the SSE lines of an OpenAI-compatible `/v1/completions` stream.

    A chunk whose choices carry text is a token chunk (TTFT at the first); the output length is the final
    `usage.completion_tokens` when the server sends it, else the number of text chunks; a server's `timings`
    (llama-server sends them) are kept.
    """
    last = None
    for now, chunk in _chunks(lines, out, clock):
        choices = chunk.get("choices") or []
        if "".join(c.get("text") or "" for c in choices):
            last = _token_chunk(out, now, last)
        for c in choices:
            if c.get("finish_reason"):
                out.final["finish_reason"] = c["finish_reason"]
        if chunk.get("usage"):
            out.final["usage"] = dict(chunk["usage"])
        if chunk.get("timings"):
            out.timings = dict(chunk["timings"])
    if out.error:  # a payload that did not parse, or the server's error
        return out
    out.t_done = clock()
    out.latency = out.t_done - out.t_send
    usage = out.final.get("usage") or {}
    out.n_output = int(usage.get("completion_tokens", out.n_chunks))
    if "finish_reason" not in out.final and not usage:
        out.error = "stream ended without a finish_reason or usage"
    elif out.t_first_token is None and out.n_output > 0:
        out.error = "no chunk carried text"
    else:
        out.success = True
    return out


def send_completion(client: httpx.Client, base_url: str, req: RequestInput, timeout_s: float = 600.0,
                    api: str = "llama", model: str = "") -> RequestOutput:
    """POST one streaming completion and return its timings; errors are recorded, never raised.

    `api`: "llama" (llama-server's `/completion`, forced tokens and server timings), "llama-generate" (the same
    endpoint; the request must carry no forced tokens) or "openai" (an OpenAI-compatible `/v1/completions`, `model`
    names the served model).
    """
    if api not in APIS:
        raise ValueError(f"api {api!r}: expected one of {', '.join(APIS)}")
    if api == "llama-generate" and (req.forced_token_ids or "routing" in req.extra):
        raise ValueError("api llama-generate sends no forced tokens or routing traces (a peer engine lacks them)")
    out = RequestOutput()
    out.wall_send = time.time()
    out.t_send = time.perf_counter()
    llama = api in LLAMA_APIS
    path, body = ("/completion", req.payload()) if llama else ("/v1/completions", req.openai_payload(model))
    try:
        with client.stream("POST", f"{base_url}{path}", json=body, timeout=timeout_s) as resp:
            if resp.status_code != 200:
                body = resp.read().decode("utf-8", "replace")
                out.error = f"HTTP {resp.status_code}: {body[:500]}"
                out.t_done = time.perf_counter()
                out.latency = out.t_done - out.t_send
                return out
            if llama:
                return consume_stream(resp.iter_lines(), out, text_chunks=api == "llama-generate")
            return consume_openai_stream(resp.iter_lines(), out)
    except (httpx.TransportError, httpx.StreamError) as exc:
        out.connection_error = True
        out.error = f"connection error: {type(exc).__name__}: {exc}"
        out.t_done = time.perf_counter()
        out.latency = out.t_done - out.t_send
        return out


def residency_timings(client: httpx.Client, base_url: str, after_pass: int = 0, timeout_s: float = 60.0) -> dict:
    """The `ostinato` llama-server's GET /residency: its pools' counters and, with `--residency-timers`, the in-engine
    timings of the split path's branches of the passes after `after_pass` (`timings`: pass, layer, n_tokens, n_cold,
    gpu_ms, cpu_ms; `timers`: whether the server times them)."""
    resp = client.get(f"{base_url}/residency", params={"after_pass": after_pass}, timeout=timeout_s)
    if resp.status_code != 200:
        raise RuntimeError(f"GET /residency failed: HTTP {resp.status_code} (an `ostinato` build with "
                           f"--residency-plan?): {resp.text[:300]}")
    return resp.json()


def decode_step_timings(timings: list[dict]) -> list[dict]:
    """The timings (`residency_timings`' `timings`) of decode steps: passes that computed one token in every layer (a
    prompt pass's last layer computes only its output row, so a pass counts by its widest layer)."""
    width: dict[int, int] = {}
    for t in timings:
        width[t["pass"]] = max(width.get(t["pass"], 0), t["n_tokens"])
    return [t for t in timings if width[t["pass"]] == 1]


def erase_slot(client: httpx.Client, base_url: str, slot: int = 0, timeout_s: float = 60.0) -> int:
    """Erase the prompt cache of a slot (needs `--slot-save-path`); return the erased token count."""
    resp = client.post(f"{base_url}/slots/{slot}", params={"action": "erase"}, timeout=timeout_s)
    if resp.status_code != 200:
        hint = " (is the server started with --slot-save-path DIR?)" if resp.status_code in (404, 501) else ""
        raise RuntimeError(f"erasing slot {slot} failed: HTTP {resp.status_code}{hint}: {resp.text[:300]}")
    return int(resp.json().get("n_erased", 0))
