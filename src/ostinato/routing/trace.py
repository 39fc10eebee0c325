"""The routing trace file, read and written memory-mapped; the same format the engine records and forces.

Layout (little endian): a 64-byte header, then ids [n_pos][n_layer][k] as uint8 (n_expert < 255) or
uint16, then, if flag bit 0 is set, float16 weights of the same shape. Flag bit 1 marks a synthetic
trace (written by `ostinato.routing.generator`, not recorded from a model); readers ignore other bits.
The all-ones id (255 or 65535) means "no expert": a layer without routing (dense) or a position that
was not computed.

`check_header` and `check_rows` are the one definition of a valid trace (engine/README.md, "Routing trace
format"), the rules the engine applies when it forces a trace: every reader goes through `read_trace`.
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
from ostinato.errors import InputError
from ostinato.inputs import open_regular

MAGIC = b"OSTROUTE"
VERSION = 1
HEADER_SIZE = 64
FLAG_WEIGHTS = 1
FLAG_SYNTHETIC = 2
_HEADER = struct.Struct("<8sIIIIIIQ24x")
assert _HEADER.size == HEADER_SIZE
ROWS_PER_STEP = 8192  # positions checked at once (a memory-mapped trace is read in steps)


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


@dataclass(frozen=True)
class TraceHeader:
    """A checked header: the shape, the flags and the positions the file holds."""

    shape: TraceShape
    flags: int
    n_pos: int

    @property
    def position_bytes(self) -> int:
        """Bytes of one position: its ids, and its weights when flag bit 0 says they follow."""
        n = self.shape.n_layer * self.shape.n_expert_used
        return n * self.shape.id_dtype.itemsize + (n * 2 if self.flags & FLAG_WEIGHTS else 0)


def check_header(raw: bytes, size: int, path: str | os.PathLike) -> TraceHeader:
    """The header of a trace file of `size` bytes: magic, version, a possible shape, id_bytes as n_expert needs, and
    n_pos exactly what the file holds (checked before anything is allocated, in Python's unbounded integers)."""
    if len(raw) < HEADER_SIZE:
        raise InputError(f"{path}: {size} bytes, shorter than the {HEADER_SIZE}-byte routing header")
    magic, version, n_layer, n_expert, k, id_bytes, flags, n_pos = _HEADER.unpack(raw[:HEADER_SIZE])
    if magic != MAGIC:
        raise InputError(f"{path}: not a routing trace (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise InputError(f"{path}: routing trace version {version}, expected {VERSION}")
    if n_layer < 1 or not 1 <= n_expert <= 0xFFFF or not 1 <= k <= n_expert:
        raise InputError(f"{path}: impossible shape n_layer {n_layer}, n_expert {n_expert}, k {k} (expected "
                         f"n_layer >= 1, 1 <= k <= n_expert <= 65535)")
    shape = TraceShape(n_layer, n_expert, k)
    if id_bytes != shape.id_dtype.itemsize:
        raise InputError(f"{path}: id_bytes {id_bytes} but n_expert {n_expert} needs {shape.id_dtype.itemsize}")
    header = TraceHeader(shape, flags, n_pos)
    body, per = size - HEADER_SIZE, header.position_bytes
    if body != n_pos * per:
        raise InputError(f"{path}: the header says {n_pos} positions of {per} bytes, the file holds {body} bytes "
                         f"after the header")
    return header


def check_rows(ids: np.ndarray, shape: TraceShape, path: str | os.PathLike, first: int = 0) -> None:
    """Every row (position, layer) is all "no expert" or k distinct ids below n_expert; else an error naming the
    position (counted from `first`) and layer."""
    k, none = shape.n_expert_used, shape.none_id
    for lo in range(0, ids.shape[0], ROWS_PER_STEP):
        block = np.asarray(ids[lo:lo + ROWS_PER_STEP])
        is_none = block == none
        n_none = is_none.sum(axis=2)
        partial = (n_none > 0) & (n_none < k)
        outside = ((block >= shape.n_expert) | (block < 0)) & ~is_none
        out = outside.any(axis=2)
        ordered = np.sort(block, axis=2)
        twice = ((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] != none)).any(axis=2)
        bad = partial | out | twice
        if not bad.any():
            continue
        p, il = (int(x) for x in np.argwhere(bad)[0])
        row = block[p, il]
        where = f"{path}: position {first + lo + p}, layer {il}"
        if out[p, il]:
            e = int(row[outside[p, il]][0])
            raise InputError(f"{where}: expert id {e} is out of range (n_expert = {shape.n_expert})")
        if twice[p, il]:
            vals, counts = np.unique(row, return_counts=True)
            raise InputError(f"{where}: expert {int(vals[counts > 1][0])} appears twice")
        raise InputError(f'{where}: {int(n_none[p, il])} of {k} ids are "no expert" (expected all or none)')


def read_header(path: str | os.PathLike) -> TraceHeader:
    """The checked header of a trace file (a regular file only: a FIFO or device is refused, never read)."""
    with open_regular(path, "a routing trace") as f:
        size = os.fstat(f.fileno()).st_size
        return check_header(f.read(HEADER_SIZE), size, path)


def read_trace(path: str | os.PathLike, mmap: bool = True) -> RoutingTrace:
    """Open a trace: header and size checked first, then every row; with mmap the ids stay on disk."""
    path = Path(path)
    h = read_header(path)
    shape, n_pos = h.shape, h.n_pos
    n = n_pos * shape.n_layer * shape.n_expert_used
    dims = (n_pos, shape.n_layer, shape.n_expert_used)
    if mmap and n > 0:
        ids = np.memmap(path, dtype=shape.id_dtype, mode="r", offset=HEADER_SIZE, shape=dims)
    else:
        ids = np.fromfile(path, dtype=shape.id_dtype, count=n, offset=HEADER_SIZE).reshape(dims)
    check_rows(ids, shape, path)
    weights = None
    if h.flags & FLAG_WEIGHTS:
        off = HEADER_SIZE + n * shape.id_dtype.itemsize
        weights = np.fromfile(path, dtype="<f2", count=n, offset=off).reshape(dims)
    return RoutingTrace(shape, ids, weights, synthetic=bool(h.flags & FLAG_SYNTHETIC))


def write_trace(path: str | os.PathLike, trace: RoutingTrace) -> None:
    """Write a trace atomically (temp file in the same directory, then rename)."""
    path = Path(path)
    s = trace.shape
    ids = np.asarray(trace.ids)
    if ids.ndim != 3 or ids.shape[1:] != (s.n_layer, s.n_expert_used):
        raise ValueError(f"ids have shape {ids.shape}, expected (n_pos, {s.n_layer}, {s.n_expert_used})")
    check_rows(ids, s, path)
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

    def __init__(self, fh: IO[bytes], shape: TraceShape, n_pos: int, path: str | os.PathLike = "") -> None:
        self._fh, self.shape, self.n_pos, self.written, self.path = fh, shape, n_pos, 0, path

    def write(self, ids: np.ndarray) -> None:
        """Append rows [n, n_layer, k]; every row must be valid (`check_rows`)."""
        s = self.shape
        if ids.ndim != 3 or ids.shape[1:] != (s.n_layer, s.n_expert_used):
            raise ValueError(f"ids have shape {ids.shape}, expected (n, {s.n_layer}, {s.n_expert_used})")
        if self.written + ids.shape[0] > self.n_pos:
            raise ValueError(f"writing past the {self.n_pos} positions promised by the header")
        check_rows(ids, s, self.path, first=self.written)
        self._fh.write(np.ascontiguousarray(ids, dtype=s.id_dtype).tobytes())
        self.written += ids.shape[0]


@contextmanager
def open_trace_stream(path: str | os.PathLike, shape: TraceShape, n_pos: int,
                      synthetic: bool = False) -> Iterator[TraceStream]:
    """Write a trace chunk by chunk, atomically; fails (leaving no file) unless exactly n_pos rows are written."""
    with atomic_open(path, "wb") as f:
        f.write(pack_header(shape, n_pos, FLAG_SYNTHETIC if synthetic else 0))
        stream = TraceStream(f, shape, n_pos, path)
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
