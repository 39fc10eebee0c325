"""Replay sessions one at a time as a local agent runs them, against one llama-server, resumably.

Faults: a request that fails while the server is up (a 4xx) fails its session, and the next one runs; a server
that crashes or stops answering is restarted and the session replayed again from its first request, up to
`max_retries` times, before it is recorded as failed. Every request of a session is recorded, once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import httpx
from tqdm import tqdm

from ostinato.atomic import sha256_file
from ostinato.server.client import LLAMA_APIS, RequestInput, RequestOutput, erase_slot, send_completion
from ostinato.errors import InputError
from ostinato.inputs import load_json
from ostinato.replay.deadline import ReplayRates, estimate, fits, rates_of
from ostinato.replay.load import LoadProbe, probe_for, usage_between
from ostinato.replay.provenance import gpu_names
from ostinato.replay.store import ResultStore, write_json_atomic
from ostinato.routing.trace import trace_filename
from ostinato.sessions.model import TokenizedSession

SKIPPED = "skipped: an earlier request of this session failed"
# The warm-up prompt: ids every vocabulary has, so no session's ids (which may be bad) can fail it.
WARMUP_TOKEN_IDS: tuple[int, ...] = tuple(range(32))


class Server(Protocol):
    """What the runner needs from a server (LlamaServer satisfies it)."""

    client: httpx.Client
    n_starts: int

    @property
    def base_url(self) -> str: ...  # noqa: D102
    def is_alive(self) -> bool: ...  # noqa: D102
    def healthy(self) -> bool: ...  # noqa: D102
    def exit_code(self) -> int | None: ...  # noqa: D102
    def log_tail(self, n_bytes: int = 2000) -> str: ...  # noqa: D102
    def start(self) -> None: ...  # noqa: D102
    def restart(self) -> None: ...  # noqa: D102
    def warmup(self, prompt_token_ids: list[int], n_predict: int = 4) -> None: ...  # noqa: D102


AfterRequest = Callable[[Server, TokenizedSession, int], None]


@dataclass
class ReplayConfig:
    """Options of one replay run of one engine."""

    engine: str
    out_dir: Path
    machine: str = ""
    retry_failed: bool = False
    # when the sessions file, model or server command changed since the results were made:
    # "refuse" (an error) or "restart" (move the old results aside and start afresh)
    on_setup_change: str = "refuse"
    # teacher-forced routing: the engine follows <routing_force_dir>/<session>.route (positions of the whole
    # conversation), and/or records what it computes to <routing_record_dir>/<session>.route
    routing_force_dir: Path | None = None
    routing_record_dir: Path | None = None
    # the server's --routing-dir: requests name their traces relative to it (None: the two directories' common one)
    routing_root: Path | None = None

    def routing_dir(self) -> Path | None:
        """The directory the routing traces are named relative to (the server's --routing-dir), if any."""
        if self.routing_root is not None:
            return Path(self.routing_root).resolve()
        dirs = [Path(d).resolve() for d in (self.routing_force_dir, self.routing_record_dir) if d is not None]
        return Path(os.path.commonpath(dirs)) if dirs else None
    request_timeout_s: float = 600.0
    # a session whose server crashed (or stopped answering) is replayed again from its first request on the
    # restarted server, up to this many times, before it is recorded as failed
    max_retries: int = 2
    temperature: float = 0.0
    # > 0: every request asks for its top `record_probs` tokens' log-probabilities (`n_probs`) and the records keep
    # them, for a bitwise check of two engines (`ostinato replay bitwise`); 0: not asked (the timed replays)
    record_probs: int = 0
    warmup: bool = True
    progress: bool = True
    # the engine borrows memory (--residency-borrow): each request's record keeps what the server's GET /residency
    # borrow counters did during it (decode steps, steps that hit a borrowed expert, routes computed on one, ...)
    borrow_counters: bool = False
    # "llama": llama-server's /completion (forced output tokens, slot erase, routing, server timings);
    # "llama-generate": the same endpoint, slot erase and server timings without forced outputs or routing (a
    # llama.cpp fork such as ik_llama.cpp generates outputs of the recorded length);
    # "openai": an OpenAI-compatible /v1/completions (an external engine generates its own outputs)
    api: str = "llama"
    model_name: str = ""  # the "model" field of OpenAI requests
    after_request: AfterRequest | None = None  # test hook, called after each request
    # samples the machine's load around each request (ostinato.replay.load); None: `probe_for(server)` at the run's
    # start; tests inject one that returns given samples
    load_probe: LoadProbe | None = None
    # a Unix time by which the run must end: a session starts only if the engine's recorded requests say it ends
    # before then (ostinato.replay.deadline); the others are left for a later run (RunSummary.deferred)
    deadline: float | None = None
    # other engines' rates, for a session of this engine before it has recorded any (the longest estimate counts)
    deadline_siblings: list[ReplayRates] = field(default_factory=list)
    # replays of other session sets, for a session that neither this engine nor its siblings can estimate yet
    deadline_elsewhere: list[ReplayRates] = field(default_factory=list)


@dataclass
class ServedSessions:
    """The sessions one server start has served, in order. A server keeps state from one session to the next
    (borrowed memory's scores and slots, caches), so two replays compared bitwise are comparable session by session
    only where their servers had served the same sessions before; each record keeps that history as `server_prior`."""

    server_start: int = 0
    sessions: list[str] = field(default_factory=list)

    def prior(self, server_start: int) -> dict:
        """What the server of start number `server_start` served before the session it starts now: a count and
        the sha256 of the session ids in order (a restarted server has served none)."""
        if server_start != self.server_start:
            self.server_start, self.sessions = server_start, []
        return {"sessions": len(self.sessions),
                "sha256": hashlib.sha256("\n".join(self.sessions).encode()).hexdigest()}

    def add(self, server_start: int, session_id: str) -> None:
        """Note a session that the server of start number `server_start` served."""
        self.prior(server_start)
        self.sessions.append(session_id)


@dataclass
class RunSummary:
    """Counts of one run: sessions replayed, skipped as already present, failed, replayed again after a crash
    (session -> retries), server restarts."""

    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    retried: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    deferred: list[str] = field(default_factory=list)  # not started: they would not end before the deadline


def _last_log_line(server: Server) -> str:
    """Return the last non-empty line of the server log (for failure reasons)."""
    lines = [ln for ln in server.log_tail().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def failure_reason(server: Server, error: str) -> tuple[str, bool]:
    """Explain a failed request; return (reason, server needs a restart)."""
    healthy = server.is_alive() and server.healthy()
    if not healthy:  # give a dying process a moment to be reaped, so its exit code can be reported
        deadline = time.monotonic() + 2.0
        while server.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    if not server.is_alive():
        tail = _last_log_line(server)
        return f"server exited with code {server.exit_code()} ({error}){'; log: ' + tail if tail else ''}", True
    if not healthy:
        return f"server stopped answering ({error})", True
    return error, False



def forced_tokens_match(streamed: list[int], forced: list[int], n_generated: int) -> bool:
    """The server generated every forced token, and each streamed token is the forced one in order.

    llama-server sends no chunk for a token that ends inside a UTF-8 character, so its id never reaches the
    client; the streamed ids are then the forced ids with those gaps, and the server's count is complete.
    """
    if n_generated != len(forced):
        return False
    it = iter(forced)
    return all(any(t == f for f in it) for t in streamed)

def request_record(engine: str, machine: str, session: TokenizedSession, turn: int, n_prompt: int,
                   out: RequestOutput | None, error: str, server_start: int, forced: bool = True,
                   attempt: int = 1, load: dict | None = None) -> dict:
    """Return the JSON line of one request (client times in seconds, server timings as sent).

    `forced`: the recorded outputs were forced (llama-server); an OpenAI-compatible engine generates its own,
    of the recorded length, and `forced_match` is then null. `attempt`: which replay of the session (1, or more
    after a server crash) the record comes from. `load`: what else loaded the machine while the request ran
    (`ostinato.replay.load.usage_between`), absent for a request that was not sent.
    """
    req = session.requests[turn]
    rec = {
        "engine": engine, "machine": machine, "session": session.session_id, "turn": turn,
        "kind": req.kind, "n_new": req.n_new, "n_prompt": n_prompt, "n_forced": req.n_output if forced else 0,
        "ok": out is not None and out.success and not error, "error": error, "server_start": server_start,
        "attempt": attempt,
    }
    if load is not None:
        rec["load"] = load
    if out is not None:
        forced = list(req.output_token_ids)
        rec.update({
            "wall_send": out.wall_send, "ttft_s": out.ttft, "latency_s": out.latency, "tpot_s": out.tpot,
            "itl_s": out.itl, "n_output": out.n_output, "n_streamed": len(out.token_ids), "n_chunks": out.n_chunks,
            "forced_match": (forced_tokens_match(out.token_ids, forced, out.n_output)
                             if out.success and rec["n_forced"] else None),
            "streamed_token_ids": out.token_ids,
            "server": out.timings, **{f"final_{k}": v for k, v in out.final.items()},
        })
        if out.top_logprobs:
            rec.update({"top_ids": out.top_ids, "top_logprobs": out.top_logprobs})
    return rec


def replay_session(server: Server, session: TokenizedSession, cfg: ReplayConfig,
                   bar: tqdm | None = None, attempt: int = 1,
                   served: ServedSessions | None = None) -> tuple[list[dict], str, bool]:
    """Replay one session from an erased slot; return (records, failure reason or "", needs restart).

    Request i sends the whole conversation so far (all earlier new and recorded output tokens, then
    its own new tokens) and forces its recorded output; every request gets a record, also after a failure.
    `served`: the sessions the server served before this one; every record keeps them as `server_prior` and
    the session is added once it ran without a server restart.
    """
    records: list[dict] = []
    reason, restart = "", False
    forced = cfg.api == "llama"  # only our engines emit the recorded outputs; a peer generates its own
    if cfg.api in LLAMA_APIS:  # an OpenAI engine's cache is its own business: each request sends the whole conversation
        try:
            erase_slot(server.client, server.base_url, 0)
        except (httpx.TransportError, RuntimeError) as exc:
            reason, restart = failure_reason(server, f"slot erase failed: {exc}")
    context: list[int] = []
    extra = routing_fields(cfg, session.session_id)
    if cfg.record_probs:
        extra = {**extra, "n_probs": cfg.record_probs}
    if cfg.routing_record_dir is not None:
        # a trace left by an interrupted replay of this session: the server records only into files it creates
        trace_path(cfg.routing_record_dir, session.session_id).unlink(missing_ok=True)
    counters = borrow_counters(server) if cfg.borrow_counters and not reason else None
    prior = served.prior(server.n_starts) if served is not None else None
    for turn, req in enumerate(session.requests):
        prompt = context + list(req.new_token_ids)
        if reason:
            records.append(request_record(cfg.engine, cfg.machine, session, turn, len(prompt), None,
                                          reason if turn == 0 and not records else SKIPPED, server.n_starts, forced,
                                          attempt))
            if bar is not None:
                bar.update(1)
            continue
        inp = RequestInput(tuple(prompt), max(1, req.n_output), req.output_token_ids if forced else (),
                           cfg.temperature, extra=extra)
        before = cfg.load_probe.sample() if cfg.load_probe is not None else None
        out = send_completion(server.client, server.base_url, inp, cfg.request_timeout_s, cfg.api, cfg.model_name)
        load = (usage_between(before, cfg.load_probe.sample(), cfg.load_probe.cores)
                if cfg.load_probe is not None else None)
        error = ""
        if not out.success:
            error, restart = failure_reason(server, out.error)
            reason = error
        records.append(request_record(cfg.engine, cfg.machine, session, turn, len(prompt), out, error, server.n_starts,
                                      forced, attempt, load))
        if counters is not None and not error:
            now = borrow_counters(server)
            if now is not None:
                records[-1]["borrow"] = {k: now[k] - counters[k] for k in BORROW_DELTAS}
            counters = now
        context = prompt + list(req.output_token_ids)  # the recorded conversation, whatever the engine generated
        if bar is not None:
            bar.update(1)
        if cfg.after_request is not None:
            cfg.after_request(server, session, turn)
    if prior is not None:
        for rec in records:
            rec["server_prior"] = prior
        if not restart:
            served.add(server.n_starts, session.session_id)
    return records, reason, restart


# the borrow counters of GET /residency that a request's record keeps as differences over the request
BORROW_DELTAS = ("steps", "steps_hit", "hits", "cpu_routes", "admissions", "evictions", "reclaimed")


def residency_counters(server: Server, block: str) -> dict | None:
    """One block of the server's GET /residency counters (`borrow`, `graph`), None when it serves none or fails."""
    try:
        r = server.client.get(f"{server.base_url}/residency", timeout=30)
    except httpx.TransportError:
        return None
    return r.json().get(block) if r.status_code == 200 else None


def borrow_counters(server: Server) -> dict | None:
    """The server's borrowed-memory counters (GET /residency's `borrow`), None when it serves none or fails."""
    return residency_counters(server, "borrow")


def trace_path(directory: Path, session_id: str) -> Path:
    """The routing trace of a session in a trace directory (`/` in the id becomes `__`)."""
    return Path(directory).resolve() / trace_filename(session_id)


def routing_fields(cfg: ReplayConfig, session_id: str) -> dict:
    """The request's `routing` field (force and/or record trace of this session, relative to the server's
    --routing-dir), or nothing."""
    root = cfg.routing_dir()
    if root is None:
        return {}
    routing = {}
    if cfg.routing_force_dir is not None:
        routing["force"] = os.path.relpath(trace_path(cfg.routing_force_dir, session_id), root)
    if cfg.routing_record_dir is not None:
        Path(cfg.routing_record_dir).mkdir(parents=True, exist_ok=True)
        routing["record"] = os.path.relpath(trace_path(cfg.routing_record_dir, session_id), root)
    for name, rel in routing.items():
        if rel == ".." or rel.startswith(".." + os.sep):
            raise ValueError(f"the {name} trace of {session_id} is outside the routing root {root}")
    return {"routing": routing}


def check_forced_traces(sessions: list[TokenizedSession], cfg: ReplayConfig) -> None:
    """Fail before any request if a session has no forced routing trace (naming the file)."""
    if cfg.routing_force_dir is None:
        return
    missing = [trace_path(cfg.routing_force_dir, s.session_id) for s in sessions
               if not trace_path(cfg.routing_force_dir, s.session_id).is_file()]
    if missing:
        raise FileNotFoundError(f"--routing-force-dir: no routing trace {missing[0]} "
                                f"({len(missing)} of {len(sessions)} sessions lack one; make them with "
                                f"`ostinato routing generate --sessions ...`)")


def run_replay(sessions: list[TokenizedSession], server: Server, cfg: ReplayConfig,
               run_info: dict | None = None) -> RunSummary:
    """Replay every session not yet recorded (in order), starting the server if needed and
    restarting it after a crash (the session then replayed again, up to `cfg.max_retries` times).

    A session's lines are written when it ends (atomically), so a killed run resumes at the first
    missing session; failed sessions are kept as recorded unless `retry_failed`; an unreadable result file
    (a truncated last line) counts as missing.
    """
    if cfg.max_retries < 0:
        raise ValueError(f"--max-retries must be >= 0, got {cfg.max_retries}")
    check_forced_traces(sessions, cfg)
    store = ResultStore.for_engine(cfg.out_dir, cfg.engine)
    if cfg.on_setup_change == "restart" and _setup_changed(_read_runs(store.root / "runs.json"), run_info or {}):
        aside = store.root.with_name(f"{store.root.name}.superseded-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}")
        store.root.rename(aside)
        print(f"[{cfg.engine}] the setup changed: earlier results moved to {aside}")
        store = ResultStore.for_engine(cfg.out_dir, cfg.engine)
    store.remove_partial()
    summary = RunSummary()
    todo = []
    for s in sessions:
        status, why = store.read_status(s.session_id)
        if status == "unreadable":
            print(f"[{cfg.engine}] {why}: session {s.session_id} is replayed again")
        # a recorded session whose routing trace is asked for but gone (e.g. its directory was cleared for a
        # rerun) is replayed again, or the rerun would leave the trace missing
        lost_trace = (status == "ok" and cfg.routing_record_dir is not None
                      and not trace_path(cfg.routing_record_dir, s.session_id).exists())
        if status in ("missing", "unreadable") or (status == "failed" and cfg.retry_failed) or lost_trace:
            todo.append(s)
        else:
            summary.skipped.append(s.session_id)
    info = {**(run_info or {}), "engine": cfg.engine, "machine": cfg.machine,
            "started": dt.datetime.now(dt.timezone.utc).isoformat(), "n_sessions": len(sessions),
            "n_todo": len(todo)}
    history = _read_runs(store.root / "runs.json")
    _check_same_setup(store.root, history, info)
    write_json_atomic(store.root / "runs.json", history + [info])
    if not todo:
        return summary
    rates = rates_of(store.root) if cfg.deadline is not None else ReplayRates()
    late = _past_deadline(todo[0], rates, cfg)
    if late:  # not even the server is started
        summary.deferred = [x.session_id for x in todo]
        print(f"[{cfg.engine}] {len(todo)} session(s) left for a later run: {late}")
        _finish_info(store, history, info, summary)
        return summary
    server.start()  # no-op when already running
    if cfg.load_probe is None:
        cfg = dataclasses.replace(cfg, load_probe=probe_for(server))
    if cfg.warmup:
        server.warmup(list(WARMUP_TOKEN_IDS))
    n_req = sum(len(s.requests) for s in todo)
    served = ServedSessions()
    with tqdm(total=n_req, unit="req", desc=cfg.engine, disable=not cfg.progress) as bar:
        for i, s in enumerate(todo):
            late = _past_deadline(s, rates, cfg)
            if late:
                summary.deferred = [x.session_id for x in todo[i:]]
                bar.write(f"[{cfg.engine}] {len(summary.deferred)} session(s) left for a later run: {late}")
                break
            bar.set_postfix_str(s.session_id[-40:])
            records, reason = _replay_with_retries(server, s, cfg, bar, summary, served)
            for rec in records:
                rates.add(rec)
            store.write_session(s.session_id, records)
            if reason:
                summary.failed[s.session_id] = reason
                bar.write(f"[{cfg.engine}] session {s.session_id} failed: {reason}")
            else:
                summary.done.append(s.session_id)
    _finish_info(store, history, info, summary)
    return summary


def _past_deadline(session: TokenizedSession, rates: ReplayRates, cfg: ReplayConfig) -> str:
    """Why `session` would not end before `cfg.deadline` ("" when it would, or without a deadline)."""
    if cfg.deadline is None:
        return ""
    expected, left = estimate(session, rates, cfg.deadline_siblings, cfg.deadline_elsewhere), cfg.deadline - time.time()
    if fits(expected, left):
        return ""
    return (f"{session.session_id} would take about {expected or 0:.0f} s, {max(left, 0):.0f} s are left before the "
            "deadline")


def _finish_info(store: ResultStore, history: list[dict], info: dict, summary: RunSummary) -> None:
    """Write this run's entry of runs.json with what it did."""
    info.update({"finished": dt.datetime.now(dt.timezone.utc).isoformat(), "n_done": len(summary.done),
                 "n_failed": len(summary.failed), "restarts": summary.restarts,
                 "retried": dict(summary.retried), "n_deferred": len(summary.deferred)})
    write_json_atomic(store.root / "runs.json", history + [info])


def _replay_with_retries(server: Server, session: TokenizedSession, cfg: ReplayConfig, bar: tqdm,
                         summary: RunSummary, served: ServedSessions) -> tuple[list[dict], str]:
    """Replay a session; after a server crash restart the server and replay it again from its first request (its
    records then all come from one attempt on one server start), up to `cfg.max_retries` times. Return the last
    attempt's records and its failure reason ("" when it succeeded)."""
    attempt = 1
    while True:
        records, reason, restart = replay_session(server, session, cfg, bar, attempt, served)
        if restart:
            server.restart()
            summary.restarts += 1
            if cfg.warmup:
                server.warmup(list(WARMUP_TOKEN_IDS))
        if not restart or attempt > cfg.max_retries:
            if restart and attempt > 1:
                reason = f"{reason} ({attempt} attempts, the server restarted after each)"
            return records, reason
        bar.write(f"[{cfg.engine}] session {session.session_id}: {reason}; server restarted, replaying the session "
                  f"again (retry {attempt} of {cfg.max_retries})")
        summary.retried[session.session_id] = attempt
        bar.total += len(session.requests)
        bar.refresh()
        attempt += 1


# Keys of runs.json that must not change between a run and its resumption.
SETUP_KEYS = ("sessions_sha256", "model", "server_command", "routing_force_dir", "record_probs", "engine_build")


def _gpus(run: dict) -> list[str] | None:
    """The GPU models a run entry's machine description names (None: it has none)."""
    info = run.get("machine_info")
    return gpu_names(info.get("gpus")) if isinstance(info, dict) else None


def _setup_changed(history: list[dict], info: dict) -> list[str]:
    """The setup keys whose value differs between the last run and this one, and `machine_info.gpus` when both
    describe their machine and its GPU models differ: a replay's sessions all ran on one kind of GPU."""
    if not history:
        return []
    last = history[-1]
    changed = [k for k in SETUP_KEYS if last.get(k) != info.get(k)]
    then, now = _gpus(last), _gpus(info)
    if then is not None and now is not None and then != now:
        changed.append("machine_info.gpus")
    return changed


def _check_same_setup(root: Path, history: list[dict], info: dict) -> None:
    """Refuse to resume results made from another sessions file, model or server command."""
    changed = _setup_changed(history, info)
    if changed:
        raise ValueError(
            f"{root} holds results of a different setup ({', '.join(changed)} changed); "
            "use another --out or --engine-name, or delete that directory"
        )


def _read_runs(path: Path) -> list[dict]:
    """Return the run history of an engine directory (one entry per invocation)."""
    if not path.is_file():
        return []
    runs = load_json(path, "the replay's run history (a JSON list)")
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise InputError(f"{path}: expected a JSON list of run entries (delete it to start the history afresh)")
    return runs


def sessions_digest(path: Path) -> dict:
    """Return provenance of a sessions file (path and sha256) for runs.json."""
    return {"sessions_file": str(path), "sessions_sha256": sha256_file(path)}
