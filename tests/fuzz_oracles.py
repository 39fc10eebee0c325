"""Second readings of three input formats, written from their documented rules (engine/README.md "Routing trace
format", docs/planner-and-costmodel.md "Plan file format", docs/sessions-and-replay.md's sessions line), plain
Python with none of the readers' code: the fuzz suite holds each reader to accept exactly what its oracle accepts
and to return exactly what the oracle reads."""

from __future__ import annotations

import json
import re
import struct

# --- routing traces ------------------------------------------------------------------------------------------------


def trace_oracle(data: bytes) -> dict | None:
    """The content of a valid trace file (shape, n_pos, ids per position and layer, synthetic, weight bytes), or None.

    Rules: 64-byte header `OSTROUTE`, version 1, n_layer >= 1, 1 <= k <= n_expert <= 65535, id_bytes 1 below 255
    experts else 2; the file exactly 64 + n_pos*n_layer*k*id_bytes bytes (+ n_pos*n_layer*k*2 with flag bit 0);
    every (position, layer) row all "no expert" (all-ones) or k distinct ids below n_expert."""
    if len(data) < 64 or data[:8] != b"OSTROUTE":
        return None
    version, n_layer, n_expert, k, id_bytes, flags = struct.unpack_from("<6I", data, 8)
    (n_pos,) = struct.unpack_from("<Q", data, 32)
    if version != 1 or n_layer < 1 or not 1 <= n_expert <= 65535 or not 1 <= k <= n_expert:
        return None
    if id_bytes != (1 if n_expert < 255 else 2):
        return None
    cells = n_pos * n_layer * k
    if len(data) != 64 + cells * id_bytes + (cells * 2 if flags & 1 else 0):
        return None
    none = (1 << (8 * id_bytes)) - 1
    ids = []
    off = 64
    for _ in range(n_pos):
        pos = []
        for _ in range(n_layer):
            row = [int.from_bytes(data[off + i * id_bytes: off + (i + 1) * id_bytes], "little") for i in range(k)]
            off += k * id_bytes
            if any(x == none for x in row):
                if not all(x == none for x in row):
                    return None
            elif len(set(row)) != k or max(row) >= n_expert:
                return None
            pos.append(row)
        ids.append(pos)
    return {"shape": (n_layer, n_expert, k), "n_pos": n_pos, "ids": ids, "synthetic": bool(flags & 2),
            "weights": data[off:] if flags & 1 else None}


# --- JSON as the engine parses it ----------------------------------------------------------------------------------

def _no_constant(name: str) -> float:
    raise ValueError(name)


def strict_json(text: bytes, strip_bom: bool = True) -> tuple[bool, object]:
    """(True, document) for UTF-8 JSON without NaN/Infinity (a leading byte-order mark skipped), else (False, None)."""
    try:
        s = text.decode("utf-8")
        if strip_bom and s.startswith("\ufeff"):
            s = s[1:]
        return True, json.loads(s, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return False, None


def _int(x: object, lo: int = 0, hi: int | None = None) -> bool:
    return type(x) is int and x >= lo and (hi is None or x <= hi)


# --- residency plans -----------------------------------------------------------------------------------------------

def _fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % (1 << 64)
    return h


def plan_oracle(text: bytes) -> dict | None:
    """The content of a valid plan file (by GPU number), or None."""
    ok, doc = strict_json(text)
    if not ok or not isinstance(doc, dict) or doc.get("format") != "ostinato-plan" or not _int(doc.get("version"), 1, 1):
        return None
    m, gpus = doc.get("model"), doc.get("gpus")
    if not isinstance(m, dict) or not isinstance(gpus, list) or not gpus:
        return None
    L, E, k, eb = m.get("n_layer"), m.get("n_expert"), m.get("n_expert_used"), m.get("expert_bytes")
    if not (_int(L, 1, 2**32 - 1) and _int(E, 1, 65535) and _int(k, 1, 2**32 - 1) and k <= E):
        return None
    if "name" in m and not isinstance(m["name"], str):
        return None
    if not isinstance(eb, list) or len(eb) != L or not all(_int(b, 0, 2**64 - 1) for b in eb):
        return None
    for key, kind in (("profile_sha256", str), ("checksum", str), ("extra", dict)):
        if key in doc and not isinstance(doc[key], kind):
            return None
    if not isinstance(doc.get("checksum"), str) or not re.search(r"^fnv1a64:[0-9a-f]{16}$", doc["checksum"]):
        return None
    for g in gpus:
        if not isinstance(g, dict) or not _int(g.get("gpu")) or not isinstance(g.get("layers"), list) \
                or not g["layers"] or not all(_int(x) for x in g["layers"]) or not isinstance(g.get("slots"), list):
            return None
        if "pool_bytes" in g and not _int(g["pool_bytes"], 0, 2**64 - 1):
            return None
        if not all(isinstance(s, list) and len(s) == 2 and _int(s[0]) and _int(s[1]) for s in g["slots"]):
            return None
    if sorted(g["gpu"] for g in gpus) != list(range(len(gpus))):
        return None
    by = {g["gpu"]: g for g in gpus}
    owner: dict[int, int] = {}
    for j in range(len(gpus)):
        for layer in by[j]["layers"]:
            if layer >= L or layer in owner:
                return None
            owner[layer] = j
    words = [L, E, k, len(gpus)]
    for j in range(len(gpus)):
        slots = [tuple(s) for s in by[j]["slots"]]
        if any(layer >= L or e >= E or owner.get(layer) != j or eb[layer] == 0 for layer, e in slots):
            return None
        if any(a >= b for a, b in zip(slots, slots[1:])):  # sorted, never repeated
            return None
        pool = by[j].get("pool_bytes", 0)
        if pool > 0 and sum(eb[layer] for layer, _ in slots) > pool:
            return None
        words += [j, len(slots)] + [x for s in slots for x in s]
    if doc["checksum"] != f"fnv1a64:{_fnv1a64(struct.pack(f'<{len(words)}I', *words)):016x}":
        return None
    return {"name": m.get("name", ""), "shape": (L, E, k), "expert_bytes": eb,
            "gpu_layers": [by[j]["layers"] for j in range(len(gpus))],
            "pool_bytes": [by[j].get("pool_bytes", 0) for j in range(len(gpus))],
            "slots": [[list(s) for s in by[j]["slots"]] for j in range(len(gpus))],
            "profile_sha256": doc.get("profile_sha256", ""), "extra": doc.get("extra", {})}


# --- sessions lines ------------------------------------------------------------------------------------------------

VOCAB = {"byte": 259, "deepseek": 129280, "qwen": 151936}
KINDS = ("first", "tool", "user")


def session_oracle(obj: object, need_ids: bool = True) -> dict | None:
    """The content of a valid sessions line (requests as (turn, kind, new ids, output ids, recorded)), or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("session"), str) or not obj["session"]:
        return None
    for key in ("source", "tokenizer", "template"):
        if key in obj and not isinstance(obj[key], str):
            return None
    if "meta" in obj and not (obj["meta"] is None or isinstance(obj["meta"], dict)):
        return None
    reqs = obj.get("requests")
    if not isinstance(reqs, list):
        return None
    vocab = VOCAB.get(obj.get("tokenizer"))
    out, context = [], 0
    for i, r in enumerate(reqs):
        if not isinstance(r, dict) or r.get("kind") not in KINDS:
            return None
        if "turn" in r and not _int(r["turn"]):
            return None
        if "n_output_recorded" in r and not (r["n_output_recorded"] is None or _int(r["n_output_recorded"])):
            return None
        for key in ("n_new", "n_output"):
            if key in r and not _int(r[key]):
                return None
        for key in ("new_token_ids", "output_token_ids"):
            if key in r and not (isinstance(r[key], list) and all(_int(t) for t in r[key])):
                return None
        has_ids = "new_token_ids" in r and "output_token_ids" in r
        if not has_ids and not ("n_new" in r and "n_output" in r):
            return None
        if need_ids and not has_ids:
            return None
        for ids, count in (("new_token_ids", "n_new"), ("output_token_ids", "n_output")):
            if ids in r and count in r and len(r[ids]) != r[count]:
                return None
            if ids in r and vocab is not None and any(t >= vocab for t in r[ids]):
                return None
        n_new = len(r["new_token_ids"]) if "new_token_ids" in r else r["n_new"]
        n_out = len(r["output_token_ids"]) if "output_token_ids" in r else r["n_output"]
        context += n_new + n_out
        out.append((r.get("turn", i), r["kind"], tuple(r.get("new_token_ids", ())), tuple(r.get("output_token_ids", ())),
                    r.get("n_output_recorded")))
    if "n_requests" in obj and not (_int(obj["n_requests"]) and obj["n_requests"] == len(reqs)):
        return None
    if "n_context" in obj and not (_int(obj["n_context"]) and obj["n_context"] == context):
        return None
    return {"session": obj["session"], "source": obj.get("source", ""), "tokenizer": obj.get("tokenizer", ""),
            "template": obj.get("template", ""), "meta": obj.get("meta") or {}, "requests": out}


def sessions_file_oracle(data: bytes) -> tuple[list[dict], int]:
    """(the valid sessions of a sessions JSONL file, first occurrence of each id, in order; the number of bad lines:
    not UTF-8, not JSON, not a valid line, or an id already seen). Blank lines do not count."""
    good, bad, seen = [], 0, set()
    for raw in data.split(b"\n"):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
            continue
        if not text.strip():
            continue
        ok, obj = strict_json(raw, strip_bom=False)
        sess = session_oracle(obj) if ok else None
        if sess is None or sess["session"] in seen:
            bad += 1
            continue
        seen.add(sess["session"])
        good.append(sess)
    return good, bad
