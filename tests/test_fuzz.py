"""Fuzzing the readers of every untrusted input (issue #17): seeded mutations of valid routing traces, residency
plans, sessions lines, sessions JSONL files, tau2-bench files and mini-swe-agent trajectories, each case ending in
one of two outcomes, never just "did not crash":

- a clear error: an InputError (or FileNotFoundError) whose message names the file;
- a correct result: what the reader returns equals what the input holds, read by tests/fuzz_oracles.py (traces,
  plans, sessions; the reader must accept exactly what its oracle accepts) or, for the agent-trace formats,
  the reading of the unmutated file (mutations that keep the file what it was: unknown keys, key order, layout).

The number of cases per input type and the tally of outcomes are data, `tests/fuzz_cases.json` (ARTIFACT.md's row
A20 quotes them); a test fails when the suite no longer runs or ends as it says. Then the examples the issue lists,
as named regression tests (the replay's are in tests/test_faults.py).
"""

from __future__ import annotations

import copy
import json
import os
import struct
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from fuzz_oracles import plan_oracle, session_oracle, sessions_file_oracle, strict_json, trace_oracle
from ostinato.cli import main
from ostinato.errors import InputError
from ostinato.residency.planfile import PlanFile, read_plan, write_plan
from ostinato.routing.trace import RoutingTrace, TraceShape, pack_header, read_trace, write_trace
from ostinato.sessions.model import read_sessions_jsonl
from ostinato.sessions.readers import iter_source
from swe_mini_fixtures import TRAJECTORIES

CASES_FILE = Path(__file__).with_name("fuzz_cases.json")
CASES = json.loads(CASES_FILE.read_text(encoding="utf-8"))
FIXTURES = Path(__file__).parent / "fixtures"


def clear_error(exc: BaseException, path: Path) -> bool:
    """The outcome class `error`: an InputError or FileNotFoundError naming the file."""
    return isinstance(exc, (InputError, FileNotFoundError)) and str(path) in str(exc)


class Tally:
    """Outcomes of one input type's cases; a case that ends otherwise is kept with its description."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.wrong: list[str] = []

    def error(self, exc: BaseException, path: Path, case: str) -> None:
        if clear_error(exc, path):
            self.counts["error"] += 1
        else:
            self.wrong.append(f"{case}: {type(exc).__name__}: {exc}"[:400])

    def result(self, ok: bool, case: str, why: str = "") -> None:
        if ok:
            self.counts["result"] += 1
        else:
            self.wrong.append(f"{case}: {why}"[:400])

    def check(self, kind: str) -> None:
        assert not self.wrong, f"{kind}: {len(self.wrong)} cases end in neither outcome:\n" + "\n".join(self.wrong[:10])
        assert sum(self.counts.values()) == CASES["cases"][kind], f"{kind}: not every declared case ran"
        assert dict(self.counts) == CASES["outcomes"][kind], (
            f"{kind}: outcomes {dict(self.counts)}, {CASES_FILE.name} says {CASES['outcomes'][kind]} (update it when "
            f"a change of the readers or the mutations moves cases between the two outcomes)")


def rng_for(kind: str) -> np.random.Generator:
    return np.random.default_rng([CASES["seed"], sum(map(ord, kind))])


def pick(rng: np.random.Generator, options: list):
    """One of `options`, as it is (numpy's choice would convert bytes, strings and big integers)."""
    return options[int(rng.integers(len(options)))]


# --- mutations of bytes and of JSON documents -----------------------------------------------------------------------

EXTREMES = [0, 1, 2, 254, 255, 256, 65535, 65536, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
VALUES: list[object] = [None, True, False, 0, 1, -1, 2, 2**32, 2**64, 2**70, 1.0, 1.5, "", "x",
                        "fnv1a64:0000000000000000", [], [0], [0, 0], [[0, 0]], {}, {"a": 1}]


def mutate_bytes(data: bytes, rng: np.random.Generator, n: int) -> bytes:
    """Flip bits, set bytes, truncate, append, duplicate or drop a span: `n` steps."""
    b = bytearray(data)
    for _ in range(n):
        op = int(rng.integers(6))
        if op == 0 and b:
            i = int(rng.integers(len(b)))
            b[i] ^= 1 << int(rng.integers(8))
        elif op == 1 and b:
            b[int(rng.integers(len(b)))] = int(rng.integers(256))
        elif op == 2:
            del b[int(rng.integers(len(b) + 1)):]
        elif op == 3:
            b += bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
        elif op == 4 and b:
            i = int(rng.integers(len(b)))
            b[i:i] = b[i:i + int(rng.integers(1, 9))]
        elif b:
            i = int(rng.integers(len(b)))
            del b[i:i + int(rng.integers(1, 9))]
    return bytes(b)


def json_paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    """Every location in a document (the root excluded): keys and list indices."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out += json_paths(v, prefix + (k,))
    return out


def _parent(doc: object, path: tuple) -> object:
    for k in path[:-1]:
        doc = doc[k]
    return doc


def mutate_doc(doc: object, rng: np.random.Generator, n: int) -> object:
    """Delete a key or item, replace a value (any JSON type, extreme integers), nudge an integer, add an unknown
    key, duplicate or swap list items: `n` steps on a copy."""
    doc = copy.deepcopy(doc)
    for _ in range(n):
        paths = json_paths(doc)
        if not paths:
            return VALUES[int(rng.integers(len(VALUES)))]
        path = paths[int(rng.integers(len(paths)))]
        parent, key = _parent(doc, path), path[-1]
        op = int(rng.integers(7))
        if op == 0:
            del parent[key]
        elif op == 1:
            parent[key] = copy.deepcopy(VALUES[int(rng.integers(len(VALUES)))])
        elif op == 2 and type(parent[key]) is int:
            parent[key] += pick(rng, [-1, 1, -parent[key] - 1, parent[key]])
        elif op == 3 and isinstance(parent[key], dict):
            parent[key][f"unknown_{int(rng.integers(100))}"] = copy.deepcopy(VALUES[int(rng.integers(len(VALUES)))])
        elif op == 4 and isinstance(parent[key], list) and parent[key]:
            lst = parent[key]
            lst.insert(int(rng.integers(len(lst) + 1)), copy.deepcopy(lst[int(rng.integers(len(lst)))]))
        elif op == 5 and isinstance(parent[key], list) and len(parent[key]) > 1:
            lst = parent[key]
            i, j = (int(x) for x in rng.choice(len(lst), 2, replace=False))
            lst[i], lst[j] = lst[j], lst[i]
        elif op == 6 and isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] = EXTREMES[int(rng.integers(len(EXTREMES)))]
    return doc


def mutate_text(text: bytes, rng: np.random.Generator) -> bytes:
    """A JSON text damaged as a file can be: cut, a byte changed, NaN for a number, a byte-order mark, deep nesting,
    trailing data, or re-laid out (which changes nothing)."""
    op = int(rng.integers(7))
    if op == 0:
        return text[: int(rng.integers(len(text)))]
    if op == 1:
        return mutate_bytes(text, rng, 1)
    if op == 2:
        digits = [i for i, c in enumerate(text) if chr(c).isdigit() and not chr(text[i - 1]).isdigit()]
        if digits:
            i = digits[int(rng.integers(len(digits)))]
            return text[:i] + pick(rng, [b"NaN", b"Infinity", b"-Infinity"]) + text[i + 1:]
        return text
    if op == 3:
        return "\ufeff".encode() + text
    if op == 4:
        depth = pick(rng, [10, 3000])
        return b"[" * depth + text + b"]" * depth
    if op == 5:
        return text + pick(rng, [b" ", b"\n", b"{}", b"x", b"\x00"])
    return json.dumps(json.loads(text), indent=int(rng.integers(0, 3)), ensure_ascii=bool(rng.integers(2))).encode()


# --- routing traces -------------------------------------------------------------------------------------------------

def valid_trace(rng: np.random.Generator) -> bytes:
    """A valid trace of a small shape: uint8 or uint16 ids, a dense layer, rows not computed, weights sometimes."""
    n_layer = int(rng.integers(1, 4))
    n_expert = pick(rng, [2, 8, 254, 255, 300])
    k = int(rng.integers(1, min(n_expert, 4) + 1))
    shape = TraceShape(n_layer, n_expert, k)
    n_pos = int(rng.integers(0, 6))
    ids = np.full((n_pos, n_layer, k), shape.none_id, dtype=shape.id_dtype)
    for p in range(n_pos):
        for il in range(n_layer):
            if rng.random() < 0.8:
                ids[p, il] = rng.choice(n_expert, k, replace=False)
    weights = rng.random((n_pos, n_layer, k)).astype("<f2") if rng.random() < 0.3 else None
    flags = (1 if weights is not None else 0) | (2 if rng.random() < 0.5 else 0)
    body = ids.tobytes() + (weights.tobytes() if weights is not None else b"")
    return pack_header(shape, n_pos, flags) + body


def mutate_trace(data: bytes, rng: np.random.Generator) -> bytes:
    """A header field set to an extreme or nudged, an id set to none, out of range or a row neighbour's, or bytes."""
    op = int(rng.integers(4))
    b = bytearray(data)
    if op == 0:  # a header field
        off, fmt = [(8, "<I"), (12, "<I"), (16, "<I"), (20, "<I"), (24, "<I"), (28, "<I"), (32, "<Q")][int(rng.integers(7))]
        old = struct.unpack_from(fmt, b, off)[0]
        limit = 2**32 - 1 if fmt == "<I" else 2**64 - 1
        new = pick(rng, [old + 1, max(old - 1, 0), pick(rng, EXTREMES)])
        struct.pack_into(fmt, b, off, min(new, limit))
        return bytes(b)
    n_layer, n_expert, k, id_bytes = struct.unpack_from("<4I", b, 12)
    (n_pos,) = struct.unpack_from("<Q", b, 32)
    if op == 1 and n_pos:  # one id
        cell = int(rng.integers(n_pos * n_layer * k))
        none = 255 if id_bytes == 1 else 65535
        row = cell - cell % k
        value = pick(rng, [none, n_expert, n_expert - 1, 0, none - 1,
                           int.from_bytes(b[64 + row * id_bytes: 64 + (row + 1) * id_bytes], "little")])
        b[64 + cell * id_bytes: 64 + (cell + 1) * id_bytes] = value.to_bytes(id_bytes, "little")
        return bytes(b)
    return mutate_bytes(data, rng, int(rng.integers(1, 4)))


def test_fuzz_routing_traces(tmp_path: Path) -> None:
    kind = "routing trace"
    rng, tally = rng_for(kind), Tally()
    for i in range(CASES["cases"][kind]):
        data = valid_trace(rng)
        if rng.random() < 0.9:
            data = mutate_trace(data, rng)
        path = tmp_path / f"case{i}.route"
        path.write_bytes(data)
        want = trace_oracle(data)
        try:
            t = read_trace(path, mmap=bool(i % 2))
        except Exception as exc:  # noqa: BLE001 - the outcome class is what is tested
            if want is not None:
                tally.wrong.append(f"case {i}: the oracle reads a valid trace, the reader says {exc}")
            else:
                tally.error(exc, path, f"case {i}")
            continue
        got = {"shape": (t.shape.n_layer, t.shape.n_expert, t.shape.n_expert_used), "n_pos": t.n_pos,
               "ids": np.asarray(t.ids).tolist(), "synthetic": t.synthetic,
               "weights": None if t.weights is None else t.weights.tobytes()}
        tally.result(got == want, f"case {i}", "read differs from the oracle's reading" if want else
                     "accepted a trace the oracle refuses")
    tally.check(kind)


# --- residency plans ------------------------------------------------------------------------------------------------

def valid_plan(rng: np.random.Generator, path: Path) -> bytes:
    """A valid plan of a small random model on one to three GPUs (written by write_plan)."""
    n_layer = int(rng.integers(1, 6))
    n_expert = int(rng.integers(2, 9))
    k = int(rng.integers(1, n_expert + 1))
    eb = [pick(rng, [0, 10, 25]) for _ in range(n_layer)]
    n_gpu = int(rng.integers(1, min(3, n_layer) + 1))
    cuts = sorted(rng.choice(np.arange(1, n_layer), n_gpu - 1, replace=False).tolist()) if n_gpu > 1 else []
    layers = [list(range(a, b)) for a, b in zip([0, *cuts], [*cuts, n_layer])]
    slots = []
    for ls in layers:
        s = [(l, e) for l in ls if eb[l] for e in range(n_expert) if rng.random() < 0.4]
        slots.append(np.asarray(s, dtype=np.int64).reshape(-1, 2))
    pools = [pick(rng, [0, sum(eb[l] for l, _ in s) + int(rng.integers(0, 20))]) for s in slots]
    extra = {"note": "fuzz"} if rng.random() < 0.3 else {}
    write_plan(path, PlanFile("m", n_layer, n_expert, k, eb, layers, pools, slots, "abc", extra))
    return path.read_bytes()


def test_fuzz_residency_plans(tmp_path: Path) -> None:
    kind = "residency plan"
    rng, tally = rng_for(kind), Tally()
    for i in range(CASES["cases"][kind]):
        path = tmp_path / f"case{i}.json"
        text = valid_plan(rng, path)
        r = rng.random()
        if r < 0.55:
            doc = mutate_doc(json.loads(text), rng, int(rng.integers(1, 3)))
            if rng.random() < 0.5 and isinstance(doc, dict):  # a consistent checksum, so the rules behind it show
                doc = _with_checksum(doc)
            text = json.dumps(doc).encode()
        elif r < 0.95:
            text = mutate_text(text, rng)
        path.write_bytes(text)
        want = plan_oracle(text)
        try:
            p = read_plan(path)
        except Exception as exc:  # noqa: BLE001
            if want is not None:
                tally.wrong.append(f"case {i}: the oracle reads a valid plan, the reader says {exc}")
            else:
                tally.error(exc, path, f"case {i}")
            continue
        got = None if want is None else {
            "name": p.model_name, "shape": (p.n_layer, p.n_expert, p.n_expert_used), "expert_bytes": p.expert_bytes,
            "gpu_layers": p.gpu_layers, "pool_bytes": p.pool_bytes, "slots": [s.tolist() for s in p.slots],
            "profile_sha256": p.profile_sha256, "extra": p.extra}
        tally.result(want is not None and got == want, f"case {i}",
                     "read differs from the oracle's reading" if want else f"accepted a plan the oracle refuses: {text[:300]!r}")
    tally.check(kind)


def _with_checksum(doc: dict) -> dict:
    """The document with the checksum its slots give, where its shape lets one be computed."""
    from ostinato.residency.planfile import _checksum

    try:
        m, gpus = doc["model"], sorted(doc["gpus"], key=lambda g: g["gpu"])
        doc["checksum"] = _checksum(m["n_layer"], m["n_expert"], m["n_expert_used"], [g["slots"] for g in gpus])
    except Exception:  # noqa: BLE001 - a shape too broken for a checksum keeps the old one
        pass
    return doc


# --- sessions lines and files ---------------------------------------------------------------------------------------

def valid_session(rng: np.random.Generator, name: str) -> dict:
    """A valid sessions line: ids within the tokenizer's vocabulary, counts and totals given or not."""
    tokenizer = pick(rng, ["byte", "qwen", "custom"])
    hi = {"byte": 259, "qwen": 151936, "custom": 10**6}[tokenizer]
    reqs = []
    for t in range(int(rng.integers(0, 4))):
        new = rng.integers(0, hi, int(rng.integers(0, 6))).tolist()
        out = rng.integers(0, hi, int(rng.integers(1, 5))).tolist()
        r = {"turn": t, "kind": "first" if t == 0 else pick(rng, ["tool", "user"]), "new_token_ids": new,
             "output_token_ids": out, "n_output_recorded": None if rng.random() < 0.5 else len(out) + 3}
        if rng.random() < 0.7:
            r.update(n_new=len(new), n_output=len(out))
        reqs.append(r)
    line = {"session": name, "source": "fuzz", "tokenizer": tokenizer, "template": "chatml",
            "meta": {"seed": 1}, "requests": reqs}
    if rng.random() < 0.7:
        line.update(n_requests=len(reqs), n_context=sum(len(r["new_token_ids"]) + len(r["output_token_ids"])
                                                       for r in reqs))
    return line


def _session_content(s) -> dict:
    return {"session": s.session_id, "source": s.source, "tokenizer": s.tokenizer, "template": s.template,
            "meta": s.meta, "requests": [(r.turn, r.kind, r.new_token_ids, r.output_token_ids, r.n_output_recorded)
                                         for r in s.requests]}


def test_fuzz_session_lines(tmp_path: Path) -> None:
    kind = "session line"
    rng, tally = rng_for(kind), Tally()
    for i in range(CASES["cases"][kind]):
        line = valid_session(rng, f"fuzz/{i}")
        r = rng.random()
        if r < 0.6:
            line = mutate_doc(line, rng, int(rng.integers(1, 3)))
        text = json.dumps(line).encode()
        if 0.6 <= r < 0.8:
            text = mutate_text(text, rng).replace(b"\n", b" ")  # one line stays one line
        path = tmp_path / f"case{i}.jsonl"
        path.write_bytes(text + b"\n")
        ok, obj = strict_json(text, strip_bom=False)
        want = session_oracle(obj) if ok else None
        try:
            got = read_sessions_jsonl(path)
        except Exception as exc:  # noqa: BLE001
            if want is not None:
                tally.wrong.append(f"case {i}: the oracle reads a valid line, the reader says {exc}")
            else:
                tally.error(exc, path, f"case {i}")
            continue
        tally.result(want is not None and [_session_content(s) for s in got] == [want], f"case {i}",
                     "read differs from the oracle's reading" if want else f"accepted a line the oracle refuses: {text[:300]!r}")
    tally.check(kind)


def test_fuzz_sessions_files(tmp_path: Path) -> None:
    """Whole files, read strictly (an error on the first bad line) and as the replay reads them (bad lines named and
    skipped): both agree with the oracle."""
    kind = "sessions JSONL"
    rng, tally = rng_for(kind), Tally()
    for i in range(CASES["cases"][kind]):
        lines = [json.dumps(valid_session(rng, f"fuzz/{i}/{j}")).encode() for j in range(int(rng.integers(0, 5)))]
        op = int(rng.integers(8))
        if op == 0 and lines:
            lines.insert(int(rng.integers(len(lines) + 1)), lines[int(rng.integers(len(lines)))])  # a repeated id
        elif op == 1:
            lines.insert(int(rng.integers(len(lines) + 1)), pick(rng, [b"", b"  ", b"\r", b"{", b"[]", b"\xff"]))
        elif op == 2 and lines:
            j = int(rng.integers(len(lines)))
            lines[j] = json.dumps(mutate_doc(json.loads(lines[j]), rng, 1)).encode()
        elif op == 3 and len(lines) > 1:
            rng.shuffle(lines)
        eol = b"\r\n" if op == 4 else b"\n"
        data = eol.join(lines) + (eol if rng.random() < 0.8 else b"")
        if op == 5:
            data = data[: int(rng.integers(len(data) + 1))]
        elif op == 6:
            data = mutate_bytes(data, rng, 1)
        path = tmp_path / f"case{i}.jsonl"
        path.write_bytes(data)
        good, n_bad = sessions_file_oracle(data)
        skipped: list[InputError] = []
        lenient = read_sessions_jsonl(path, on_bad=skipped.append)
        if [_session_content(s) for s in lenient] != good or len(skipped) != n_bad \
                or not all(str(path) in str(e) for e in skipped):
            tally.wrong.append(f"case {i}: skipping bad lines, {len(lenient)} sessions and {len(skipped)} bad lines, "
                               f"the oracle {len(good)} and {n_bad}")
            continue
        try:
            got = read_sessions_jsonl(path)
        except Exception as exc:  # noqa: BLE001
            if not n_bad:
                tally.wrong.append(f"case {i}: the oracle reads a valid file, the reader says {exc}")
            else:
                tally.error(exc, path, f"case {i}")
            continue
        tally.result(not n_bad and [_session_content(s) for s in got] == good, f"case {i}", "read differs")
    tally.check(kind)


# --- agent traces: tau2-bench files and mini-swe-agent trajectories -------------------------------------------------

OTHER_FORMATS: list[object] = [
    {"trajectory": [{"thought": "t", "action": "ls", "observation": "x", "response": "r"}],
     "history": [{"role": "system", "content": "s", "agent": "main", "message_type": "system_prompt"}], "info": {}},
    {"instance_id": "i", "history": [{"id": 0, "source": "user", "action": "message", "args": {"content": "hi"}}]},
    [{"id": 1, "source": "agent", "observation": "run", "content": "ok"}],
    {"id": "adp-1", "content": [{"class_": "text_observation", "content": "hi", "source": "user"},
                                {"class_": "message_action", "content": "hello"}]},
]


def _objects(doc: object) -> list[object]:
    """Every object (dict) in a document, the root included, but a tool call's arguments (content, rendered into
    the request)."""
    found = [doc] if isinstance(doc, dict) else []
    for p in json_paths(doc):
        v = _parent(doc, p)[p[-1]]
        if isinstance(v, dict) and "arguments" not in p:
            found.append(v)
    return found


def keep_meaning(doc: object, rng: np.random.Generator) -> bytes:
    """The same document another way: an unknown key added somewhere, keys reordered, another layout."""
    doc = copy.deepcopy(doc)
    objs = _objects(doc)
    for _ in range(int(rng.integers(1, 3))):
        target = objs[int(rng.integers(len(objs)))]
        target[f"x_unknown_{int(rng.integers(1000))}"] = copy.deepcopy(VALUES[int(rng.integers(len(VALUES)))])
    if rng.random() < 0.5:
        for o in _objects(doc):
            items = list(o.items())
            rng.shuffle(items)
            o.clear()
            o.update(items)
    return json.dumps(doc, indent=int(rng.integers(0, 3)), ensure_ascii=bool(rng.integers(2))).encode()


def _break_text(text: bytes, rng: np.random.Generator) -> bytes:
    """Damage every reader must refuse: cut short, a byte no UTF-8 has, a NaN."""
    op = int(rng.integers(3))
    if op == 0:
        return text[: int(rng.integers(len(text.rstrip())))]
    if op == 1:
        i = int(rng.integers(len(text)))
        return text[:i] + b"\xff" + text[i + 1:]
    return text.replace(b"[", b"[NaN, ", 1) if b"[" in text else b"NaN"


def _messages_of(doc: object) -> list[list[dict]]:
    """The message lists of a tau2 file or a mini-swe-agent trajectory."""
    if isinstance(doc, dict) and "messages" in doc:
        return [doc["messages"]]
    sims = doc if isinstance(doc, list) else doc.get("simulations") or [doc.get("simulation_run")]
    return [s["messages"] for s in sims]


def break_tau2(doc: object, rng: np.random.Generator) -> object:
    """A change that makes a tau2 file something else (`tau2.schema.json`, or the file's own shape)."""
    doc = copy.deepcopy(doc)
    sims = doc if isinstance(doc, list) else doc.get("simulations") or [doc.get("simulation_run")]
    sim = sims[int(rng.integers(len(sims)))]
    msgs = sim["messages"]
    m = msgs[int(rng.integers(len(msgs)))]
    tools = [x for s in sims for x in s["messages"] if x["role"] == "tool"]
    calls = [c for s in sims for x in s["messages"] for c in (x.get("tool_calls") or [])]
    op = int(rng.integers(12))
    if op == 0:
        del sim[pick(rng, ["task_id", "messages"])]
    elif op == 1:
        sim["messages"] = [{"role": "user"}, "messages", 3, None][int(rng.integers(4))]
    elif op == 2:
        del m["role"]
    elif op == 3:
        m["role"] = ["system", "ai", "human", "Assistant", "", 7, None][int(rng.integers(7))]
    elif op == 4:
        m["content"] = [3, ["part"], {"text": "x"}, True][int(rng.integers(4))]
    elif op == 5:
        m["tool_calls"] = ["call", 1, {"name": "x"}][int(rng.integers(3))]
    elif op == 6 and calls:
        c = calls[int(rng.integers(len(calls)))]
        key = pick(rng, ["name", "arguments"])
        c[key] = {"name": ["", 5, None], "arguments": ["{}", [], None, 1]}[key][int(rng.integers(3))]
    elif op == 7 and tools:
        del tools[int(rng.integers(len(tools)))][pick(rng, ["id", "requestor"])]
    elif op == 8 and tools:
        tools[int(rng.integers(len(tools)))]["requestor"] = "environment"
    elif op == 9 and isinstance(doc, dict) and "simulations" in doc:
        doc["simulations"] = [{"a": 1}, "sims", 3, None][int(rng.integers(4))]
    elif op == 10:
        return copy.deepcopy(OTHER_FORMATS[int(rng.integers(len(OTHER_FORMATS)))])
    else:
        msgs[int(rng.integers(len(msgs)))] = ["text", 3, None, []][int(rng.integers(4))]
    return doc


def break_mini(doc: dict, rng: np.random.Generator) -> object:
    """A change that makes a mini-swe-agent trajectory something else."""
    doc = copy.deepcopy(doc)
    msgs = doc["messages"]
    m = msgs[int(rng.integers(len(msgs)))]
    op = int(rng.integers(7))
    if op == 0:
        del doc["messages"]
    elif op == 1:
        doc["messages"] = [{"role": "user"}, "messages", 3, None][int(rng.integers(4))]
    elif op == 2:
        msgs[int(rng.integers(len(msgs)))] = ["text", 3, None, []][int(rng.integers(4))]
    elif op == 3:
        del m["role"]
    elif op == 4:
        m["role"] = ["ai", "human", "bot", "System", "", 7, None, ["user"]][int(rng.integers(8))]
    elif op == 5:
        return copy.deepcopy(OTHER_FORMATS[int(rng.integers(len(OTHER_FORMATS)))])
    else:
        return [[doc], "text", 3, None][int(rng.integers(4))]
    return doc


def _agent_fuzz(tmp_path: Path, kind: str, source: str, name: str, bases: list[object],
                breaker: Callable[[object, np.random.Generator], object]) -> None:
    """Each case: a base file changed so that it keeps its meaning (the reader gives the base's sessions) or so that
    it is no longer one (a clear error)."""
    rng, tally = rng_for(kind), Tally()
    base_dir = tmp_path / "base" / source
    for i in range(CASES["cases"][kind]):
        base = bases[int(rng.integers(len(bases)))]
        base_dir.mkdir(parents=True, exist_ok=True)
        (base_dir / name).write_text(json.dumps(base), encoding="utf-8")
        expected = list(iter_source(source, base_dir.parent))
        case_dir = tmp_path / f"case{i}" / source
        case_dir.mkdir(parents=True)
        path = case_dir / name
        r = rng.random()
        if r < 0.35:
            path.write_bytes(keep_meaning(base, rng))
            keeps = True
        else:
            text = json.dumps(breaker(base, rng)).encode() if r < 0.85 else _break_text(json.dumps(base).encode(), rng)
            path.write_bytes(text)
            keeps = False
        try:
            got = list(iter_source(source, case_dir.parent))
        except Exception as exc:  # noqa: BLE001
            if keeps:
                tally.wrong.append(f"case {i}: a file that keeps its meaning is refused: {exc}")
            else:
                tally.error(exc, path, f"case {i}")
            continue
        tally.result(keeps and got == expected, f"case {i}",
                     "sessions differ from the unchanged file's" if keeps else "a broken file was read")
    tally.check(kind)


def test_fuzz_tau2_files(tmp_path: Path) -> None:
    bases = [json.loads(p.read_text()) for p in sorted((FIXTURES / "sessions" / "tau2").glob("*.json"))]
    bases.append({"task": {"id": "3"}, "simulation_run": bases[1][0]})  # the third shape
    _agent_fuzz(tmp_path, "tau2 file", "tau2", "fuzz_airline.json", bases, break_tau2)


def test_fuzz_mini_swe_agent_trajectories(tmp_path: Path) -> None:
    _agent_fuzz(tmp_path, "mini-swe-agent trajectory", "swe-mini", "fuzz__case-1.traj.json",
                list(TRAJECTORIES.values()), break_mini)


def test_fuzz_cases_file_declares_every_input_type() -> None:
    types = {"routing trace", "residency plan", "session line", "sessions JSONL", "tau2 file",
             "mini-swe-agent trajectory"}
    assert set(CASES["cases"]) == types == set(CASES["outcomes"])
    assert all(sum(CASES["outcomes"][t].values()) == CASES["cases"][t] for t in types)


# --- the issue's examples -------------------------------------------------------------------------------------------

def _trace(tmp_path: Path, ids: np.ndarray, shape: TraceShape, name: str = "t.route") -> Path:
    path = tmp_path / name
    path.write_bytes(pack_header(shape, ids.shape[0]) + ids.astype(shape.id_dtype).tobytes())
    return path


def _raises(call: Callable[[], object], path: Path, match: str) -> None:
    with pytest.raises((InputError, FileNotFoundError)) as err:
        call()
    assert str(path) in str(err.value) and match in str(err.value), str(err.value)


@pytest.mark.parametrize("n_pos", [2**40, 2**63, 2**64 - 1, 2**64 // 12 + 1])
def test_issue17_trace_header_claiming_more_positions_than_the_file(tmp_path: Path, n_pos: int) -> None:
    """A huge count (bad_alloc in the engine) or one whose size wraps in 64 bits (a segfault): refused before any
    allocation."""
    shape = TraceShape(2, 16, 6)
    path = _trace(tmp_path, np.tile(np.arange(6), (3, 2, 1)), shape)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<Q", raw, 32, n_pos)
    path.write_bytes(raw)
    _raises(lambda: read_trace(path), path, f"the header says {n_pos} positions of 12 bytes, the file holds 36")


def test_issue17_trace_row_with_a_valid_first_id_and_a_bad_later_one(tmp_path: Path) -> None:
    shape = TraceShape(2, 16, 3)
    ids = np.tile(np.array([0, 1, 2]), (4, 2, 1))
    ids[3, 1] = [5, 6, 200]
    path = _trace(tmp_path, ids, shape)
    _raises(lambda: read_trace(path), path, "position 3, layer 1: expert id 200 is out of range (n_expert = 16)")


def test_issue17_duplicate_experts_in_a_row_are_an_error_not_counted_twice(tmp_path: Path) -> None:
    shape = TraceShape(1, 16, 2)
    ids = np.array([[[3, 4]], [[7, 7]]])
    path = _trace(tmp_path, ids, shape)
    _raises(lambda: read_trace(path), path, "position 1, layer 0: expert 7 appears twice")
    assert main(["residency", "profile", "--trace", str(path), "--out", str(tmp_path / "p.json")]) == 2


def test_issue17_a_fifo_as_a_trace_or_plan_is_refused_unread(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes it: opening it to read would block
    _raises(lambda: read_trace(fifo), fifo, "not a regular file")
    _raises(lambda: read_plan(fifo), fifo, "not a regular file")


def _stats(tmp_path: Path, trace_ids: np.ndarray, capsys) -> tuple[int, str]:
    from ostinato.routing.commands import MANIFEST
    from ostinato.routing.layout import layout_from_counts

    shape = TraceShape(2, 8, 2)
    lay = layout_from_counts("s/0", [("first", max(len(trace_ids) - 1, 0), 1 if len(trace_ids) else 0)])
    for d in ("dev", "held"):
        (tmp_path / d).mkdir(exist_ok=True)
        write_trace(tmp_path / d / "s__0.route", RoutingTrace(shape, trace_ids.astype(np.uint8)))
        (tmp_path / d / MANIFEST).write_text(json.dumps({"sessions": [dict(lay.to_json(), n_pos=lay.n_pos)]}))
    rc = main(["routing", "stats", "--dev", str(tmp_path / "dev"), "--heldout", str(tmp_path / "held"),
               "--n-resident-decode", "4", "--n-resident-prefill", "4", "--out", str(tmp_path / "stats.json")])
    return rc, capsys.readouterr().err


def test_issue17_routing_stats_on_all_none_or_zero_position_traces(tmp_path: Path, capsys) -> None:
    rc, err = _stats(tmp_path, np.full((4, 2, 2), 255), capsys)
    assert rc == 2 and 's__0.route: no routing to count: 4 positions, every row "no expert"' in err
    rc, err = _stats(tmp_path, np.zeros((0, 2, 2)), capsys)
    assert rc == 2 and "no routing to count: 0 positions" in err
    assert not (tmp_path / "stats.json").exists()


def test_issue17_routing_stats_without_data_for_a_fact_is_an_error_not_nan(tmp_path: Path, capsys) -> None:
    ids = np.tile(np.array([0, 1]), (6, 2, 1))  # one 5-token prefill: no request of 128-511 new tokens
    rc, err = _stats(tmp_path, ids, capsys)
    assert rc == 2 and "routing stats: no data for prefill_cold_per_token" in err


def test_issue17_trace_shorter_than_its_manifest(tmp_path: Path, capsys) -> None:
    from ostinato.routing.commands import MANIFEST

    _stats(tmp_path, np.tile(np.array([0, 1]), (6, 2, 1)), capsys)
    man = json.loads((tmp_path / "held" / MANIFEST).read_text())
    man["sessions"][0]["requests"][0]["n_new"] += 3
    man["sessions"][0]["n_pos"] += 3
    (tmp_path / "held" / MANIFEST).write_text(json.dumps(man))
    rc = main(["routing", "stats", "--dev", str(tmp_path / "dev"), "--heldout", str(tmp_path / "held"),
               "--out", str(tmp_path / "stats.json")])
    assert rc == 2 and "s__0.route: 6 positions, the 9 of session s/0 expected" in capsys.readouterr().err


def test_issue17_residency_profile_of_a_trace_with_the_wrong_layer_count(tmp_path: Path, capsys) -> None:
    shape = TraceShape(4, 16, 2)
    path = _trace(tmp_path, np.tile(np.array([0, 1]), (6, 4, 1)), shape)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, 12, 3)  # the body has 4 layers per position, the header says 3
    path.write_bytes(raw)
    assert main(["residency", "profile", "--trace", str(path), "--out", str(tmp_path / "p.json")]) == 2
    assert "the header says 6 positions of 6 bytes, the file holds 48" in capsys.readouterr().err


def _plan_doc(tmp_path: Path) -> dict:
    p = PlanFile("m", 3, 4, 2, [10, 10, 10], [[0, 1], [2]], [30, 20],
                 [np.array([[0, 0], [0, 1], [1, 3]]), np.array([[2, 2]])])
    write_plan(tmp_path / "good.json", p)
    return json.loads((tmp_path / "good.json").read_text())


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(gpus={str(g["gpu"]): g for g in d["gpus"]}), "key 'gpus': expected array, got object"),
    (lambda d: d["gpus"][0].update(pool_bytes=-1), "key 'gpus[0].pool_bytes': -1 is less than the minimum of 0"),
    (lambda d: d["model"].pop("n_expert"), "key 'model': 'n_expert' is a required property"),  # was a KeyError
    (lambda d: d["gpus"][0]["slots"].append([2**33, 0]), "(8589934592, 0) is outside the model"),  # struct.error
    (lambda d: d["gpus"][1].update(slots=None), "key 'gpus[1].slots': expected array, got null"),  # TypeError
    (lambda d: d["gpus"][0].update(slots=[[0, 0, 5]]), "key 'gpus[0].slots[0]'"),
    (lambda d: d["gpus"][0].update(layers=[0, 1, 2]), "key 'gpus[1].layers': layer 2 is also on GPU 0"),
    (lambda d: d["gpus"][0]["slots"].reverse(), "slots are sorted by layer, then expert"),
    (lambda d: d["model"].update(n_layer=3.0), "key 'model.n_layer': expected integer, got number 3.0"),
])
def test_issue17_plans_python_and_the_engine_disagreed_on(tmp_path: Path, change, message) -> None:
    doc = _plan_doc(tmp_path)
    change(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    _raises(lambda: read_plan(path), path, message)
    assert plan_oracle(path.read_bytes()) is None


def test_issue17_swe_agent_trajectory_with_ai_roles_is_an_error_not_zero_sessions(tmp_path: Path, capsys) -> None:
    rows = tmp_path / "swe-rebench" / "swe-agent.jsonl"
    rows.parent.mkdir()
    rows.write_text(json.dumps({"instance_id": "a", "trajectory": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "task"}, {"role": "ai", "content": "ls"}]}) + "\n")
    rc = main(["sessions", "build", "--source", "swe-rebench", "--mirror", str(tmp_path), "--no-progress",
               "--out", str(tmp_path / "out.jsonl")])
    assert rc == 2 and "message 2: role 'ai' is not one of system, user, assistant, tool" in capsys.readouterr().err
    traj = tmp_path / "swe-mini" / "x.traj.json"
    traj.parent.mkdir()
    traj.write_text(json.dumps(OTHER_FORMATS[0]))
    rc = main(["sessions", "build", "--source", "swe-mini", "--mirror", str(tmp_path), "--no-progress",
               "--out", str(tmp_path / "out.jsonl")])
    assert rc == 2 and "this is a SWE-agent trajectory, not a mini-swe-agent trajectory" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_issue17_tau2_reader_refuses_chat_style_swe_data(tmp_path: Path, capsys) -> None:
    chat = [{"messages": [{"role": "system", "content": "You are a coder.", "tool_calls": None},
                          {"role": "user", "content": "Fix the bug.", "tool_calls": None},
                          {"role": "user", "content": "<output>ok</output>", "tool_calls": None}]}]
    path = tmp_path / "tau2" / "swe_chat.json"
    path.parent.mkdir()
    path.write_text(json.dumps(chat))
    rc = main(["sessions", "build", "--source", "tau2", "--mirror", str(tmp_path), "--no-progress",
               "--out", str(tmp_path / "out.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2 and f"{path}: session tau2/swe_chat/000: not a tau2-bench simulation" in err
    chat[0]["task_id"] = "1"
    path.write_text(json.dumps(chat))
    assert main(["sessions", "build", "--source", "tau2", "--mirror", str(tmp_path), "--no-progress",
                 "--out", str(tmp_path / "out.jsonl")]) == 2
    assert "key 'messages[0].role': 'system' is not one of ['assistant', 'user', 'tool']" in capsys.readouterr().err
