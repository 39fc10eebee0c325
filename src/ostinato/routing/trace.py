"""The routing trace file, read and written memory-mapped; the same format the engine records and forces.

Layout (little endian): a 64-byte header, then ids [n_pos][n_layer][k] as uint8 (n_expert < 255) or
uint16, then, if flag bit 0 is set, float16 weights of the same shape. Flag bit 1 marks a synthetic
trace (written by `ostinato.routing.generator`, not recorded from a model); readers ignore other bits.
The all-ones id (255 or 65535) means "no expert": a layer without routing (dense) or a position that
was not computed.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from ostinato.atomic import atomic_open

MAGIC = b"OSTROUTE"
VERSION = 1
HEADER_SIZE = 64
FLAG_WEIGHTS = 1
FLAG_SYNTHETIC = 2
_HEADER = struct.Struct("<8sIIIIIIQ24x")
assert _HEADER.size == HEADER_SIZE


@dataclass(frozen=True)
class TraceShape:
    """The model shape a trace belongs to."""

    n_layer: int
    n_expert: int
    n_expert_used: int

    @property
    def id_dtype(self) -> np.dtype:
        return np.dtype(np.uint8) if self.n_expert < 255 else np.dtype("<u2")

    @property
    def none_id(self) -> int:
        return 0xFF if self.n_expert < 255 else 0xFFFF


@dataclass
class RoutingTrace:
    """A routing trace in memory (ids possibly memory-mapped)."""

    shape: TraceShape
    ids: np.ndarray                 # [n_pos, n_layer, k]
    weights: np.ndarray | None = None  # float16 [n_pos, n_layer, k]
    synthetic: bool = False         # header flag bit 1: made by a generator, not recorded

    @property
    def n_pos(self) -> int:
        return int(self.ids.shape[0])

    def moe_layers(self) -> list[int]:
        """Layers that have routing in at least one position."""
        has = (self.ids != self.shape.none_id).any(axis=(0, 2))
        return [int(i) for i in np.flatnonzero(has)]


def _parse_header(raw: bytes, path: Path) -> tuple[TraceShape, int, int]:
    if len(raw) < HEADER_SIZE:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than the {HEADER_SIZE}-byte routing header")
    magic, version, n_layer, n_expert, k, id_bytes, flags, n_pos = _HEADER.unpack(raw[:HEADER_SIZE])
    if magic != MAGIC:
        raise ValueError(f"{path}: not a routing trace (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ValueError(f"{path}: routing trace version {version}, expected {VERSION}")
    if n_layer < 1 or n_expert < 1 or not 1 <= k <= n_expert:
        raise ValueError(f"{path}: impossible shape n_layer {n_layer}, n_expert {n_expert}, k {k}")
    shape = TraceShape(n_layer, n_expert, k)
    if id_bytes != shape.id_dtype.itemsize:
        raise ValueError(f"{path}: id_bytes {id_bytes} but n_expert {n_expert} needs {shape.id_dtype.itemsize}")
    return shape, flags, n_pos


def read_trace(path: str | os.PathLike, mmap: bool = True) -> RoutingTrace:
    """Open a trace; with mmap the ids stay on disk until touched."""
    path = Path(path)
    with open(path, "rb") as f:
        shape, flags, n_pos = _parse_header(f.read(HEADER_SIZE), path)
    n = n_pos * shape.n_layer * shape.n_expert_used
    need = HEADER_SIZE + n * shape.id_dtype.itemsize + (n * 2 if flags & FLAG_WEIGHTS else 0)
    size = path.stat().st_size
    if size < need:
        raise ValueError(f"{path}: {size} bytes, the header promises {need} ({n_pos} positions)")
    dims = (n_pos, shape.n_layer, shape.n_expert_used)
    if mmap and n > 0:
        ids = np.memmap(path, dtype=shape.id_dtype, mode="r", offset=HEADER_SIZE, shape=dims)
    else:
        ids = np.fromfile(path, dtype=shape.id_dtype, count=n, offset=HEADER_SIZE).reshape(dims)
    weights = None
    if flags & FLAG_WEIGHTS:
        off = HEADER_SIZE + n * shape.id_dtype.itemsize
        weights = np.fromfile(path, dtype="<f2", count=n, offset=off).reshape(dims)
    return RoutingTrace(shape, ids, weights, synthetic=bool(flags & FLAG_SYNTHETIC))


def write_trace(path: str | os.PathLike, trace: RoutingTrace) -> None:
    """Write a trace atomically (temp file in the same directory, then rename)."""
    path = Path(path)
    s = trace.shape
    ids = np.asarray(trace.ids)
    if ids.ndim != 3 or ids.shape[1:] != (s.n_layer, s.n_expert_used):
        raise ValueError(f"ids have shape {ids.shape}, expected (n_pos, {s.n_layer}, {s.n_expert_used})")
    valid = ids[ids != s.none_id]
    if valid.size and (valid.min() < 0 or valid.max() >= s.n_expert):
        raise ValueError(f"expert ids must lie in [0, {s.n_expert}) or be {s.none_id} (none)")
    flags = (FLAG_WEIGHTS if trace.weights is not None else 0) | (FLAG_SYNTHETIC if trace.synthetic else 0)
    header = pack_header(s, ids.shape[0], flags)
    with atomic_open(path, "wb") as f:
        f.write(header)
        f.write(np.ascontiguousarray(ids, dtype=s.id_dtype).tobytes())
        if trace.weights is not None:
            f.write(np.ascontiguousarray(trace.weights, dtype="<f2").tobytes())


def pack_header(shape: TraceShape, n_pos: int, flags: int = 0) -> bytes:
    """The 64-byte header for a trace of `n_pos` positions of `shape` with `flags`."""
    return _HEADER.pack(MAGIC, VERSION, shape.n_layer, shape.n_expert, shape.n_expert_used,
                        shape.id_dtype.itemsize, flags, n_pos)


class TraceStream:
    """Appends id rows to an open trace file, checking shape and count (for traces too large for memory)."""

    def __init__(self, fh: IO[bytes], shape: TraceShape, n_pos: int) -> None:
        self._fh, self.shape, self.n_pos, self.written = fh, shape, n_pos, 0

    def write(self, ids: np.ndarray) -> None:
        """Append rows [n, n_layer, k]; ids must be valid experts or the none id."""
        s = self.shape
        if ids.ndim != 3 or ids.shape[1:] != (s.n_layer, s.n_expert_used):
            raise ValueError(f"ids have shape {ids.shape}, expected (n, {s.n_layer}, {s.n_expert_used})")
        if self.written + ids.shape[0] > self.n_pos:
            raise ValueError(f"writing past the {self.n_pos} positions promised by the header")
        self._fh.write(np.ascontiguousarray(ids, dtype=s.id_dtype).tobytes())
        self.written += ids.shape[0]


@contextmanager
def open_trace_stream(path: str | os.PathLike, shape: TraceShape, n_pos: int,
                      synthetic: bool = False) -> Iterator[TraceStream]:
    """Write a trace chunk by chunk, atomically; fails (leaving no file) unless exactly n_pos rows are written."""
    with atomic_open(path, "wb") as f:
        f.write(pack_header(shape, n_pos, FLAG_SYNTHETIC if synthetic else 0))
        stream = TraceStream(f, shape, n_pos)
        yield stream
        if stream.written != n_pos:
            raise ValueError(f"{path}: wrote {stream.written} positions, the header promises {n_pos}")


def random_trace(shape: TraceShape, n_pos: int, moe_layers: list[int], seed: int = 0) -> RoutingTrace:
    """Uniformly random distinct experts per (position, MoE layer); other layers are "none"."""
    rng = np.random.default_rng(seed)
    ids = np.full((n_pos, shape.n_layer, shape.n_expert_used), shape.none_id, dtype=shape.id_dtype)
    for il in moe_layers:
        if not 0 <= il < shape.n_layer:
            raise ValueError(f"MoE layer {il} is outside [0, {shape.n_layer})")
        keys = rng.random((n_pos, shape.n_expert))
        ids[:, il, :] = np.argsort(keys, axis=1)[:, : shape.n_expert_used]
    return RoutingTrace(shape, ids)


def trace_filename(session: str) -> str:
    """The trace file name of a session id (`/` becomes `__`, as in replay outputs)."""
    return session.replace("/", "__") + ".route"
