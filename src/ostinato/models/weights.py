"""Random tensor data, generated chunk by chunk so that no whole large tensor is ever held in memory.

Each chunk is a group of whole rows (ne0 elements each) seeded by (seed, tensor name, group index), so the
bytes depend only on the seed and the spec. Quantized experts are drawn directly in their block formats
(random 4-bit / 8-bit codes with a scale that gives the target standard deviation); this is as fast as
writing random bytes and gives the same distribution a quantized random-normal matrix would roughly have.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np

from ostinato.models.layout import BLOCK_BYTES, TensorPlan
from ostinato.models.router import draw_hash_rows

# Upper bound on the elements of one generated group (4 Mi elements: 16 MiB as float32).
GROUP_ELEMENTS = 1 << 22

# MXFP4 (ggml): 32 values share an E8M0 exponent e; value = 2^(e-128) * k, k in the doubled e2m1 table.
_MXFP4_K = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float64)
_MXFP4_RMS = float(np.sqrt(np.mean(_MXFP4_K**2)))  # rms of k for uniform random codes
_Q8_RMS = float(np.sqrt(np.mean(np.arange(-127, 128, dtype=np.float64) ** 2)))


def _rng(seed: int, name: str, group: int) -> np.random.Generator:
    """A generator seeded by the model seed, the tensor name and the group index."""
    return np.random.default_rng([seed, zlib.crc32(name.encode()), group])


def rows_per_group(plan: TensorPlan) -> int:
    """How many rows (of ne0 elements) one generated group holds."""
    width = plan.n_expert if plan.init == "hash_route" else plan.ne[0]
    return max(1, GROUP_ELEMENTS // max(1, width))


def _normal(rng: np.random.Generator, n: int, std: float) -> np.ndarray:
    """n float32 values drawn N(0, std^2)."""
    out = rng.standard_normal(n, dtype=np.float32)
    out *= np.float32(std)
    return out


def _mxfp4(rng: np.random.Generator, n: int, std: float) -> np.ndarray:
    """n values as MXFP4 blocks (uint8, 17 bytes per 32 values) with rms `std`.

    The exponent is e or e+1 per block, mixed so that the mean square hits std^2 exactly in expectation.
    """
    n_blocks = n // 32
    target = std / _MXFP4_RMS  # wanted 2^(e-128) in rms terms
    e_lo = math.floor(math.log2(target)) + 128
    lo = 2.0 ** (e_lo - 128)
    p_hi = (target**2 / lo**2 - 1.0) / 3.0  # fraction of blocks at e_lo+1 (4x the mean square)
    blocks = np.frombuffer(rng.bytes(n_blocks * 17), dtype=np.uint8).reshape(n_blocks, 17).copy()
    hi = rng.random(n_blocks) < p_hi
    blocks[:, 0] = np.where(hi, e_lo + 1, e_lo).astype(np.uint8)
    return blocks.reshape(-1)


def _q8_0(rng: np.random.Generator, n: int, std: float) -> np.ndarray:
    """n values as Q8_0 blocks (uint8, 34 bytes per 32 values: f16 scale + 32 int8) with rms `std`."""
    n_blocks = n // 32
    blocks = np.empty(n_blocks, dtype=np.dtype([("d", "<f2"), ("qs", "i1", (32,))]))
    blocks["d"] = np.float16(std / _Q8_RMS)
    blocks["qs"] = rng.integers(-127, 128, size=(n_blocks, 32), dtype=np.int8)
    return blocks.view(np.uint8)


def _hash_route(rng: np.random.Generator, rows: int, k: int, n_expert: int) -> np.ndarray:
    """For each of `rows` token ids, k distinct experts drawn uniformly (int32, k per row)."""
    keys = rng.random((rows, n_expert), dtype=np.float32)
    return np.argpartition(keys, k - 1, axis=1)[:, :k].astype(np.int32).reshape(-1)


def _hc_base(plan: TensorPlan) -> np.ndarray:
    """Hyper-connection biases: pre and post 0 (gates 0.5 and 1), comb a strong identity (streams kept apart)."""
    hc = int(round(math.sqrt(plan.ne[0] + 1) - 1))  # ne0 = (2 + hc) * hc
    comb = np.where(np.eye(hc, dtype=bool), 4.0, 0.0).astype(np.float32).reshape(-1)
    return np.concatenate([np.zeros(2 * hc, dtype=np.float32), comb])


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values stored as f32 or f16."""
    return values.astype(np.float16) if dtype == "f16" else values


def iter_chunks(plan: TensorPlan, seed: int) -> Iterator[np.ndarray]:
    """Yield the tensor's stored bytes (as numpy arrays) group by group, in file order."""
    for job in chunk_jobs(plan, seed):
        yield job()


def chunk_jobs(plan: TensorPlan, seed: int) -> Iterator[Callable[[], np.ndarray]]:
    """The tensor's chunks as independent jobs, in file order: each draws its own group from its own seed, so jobs
    can run in any order or at once (numpy's generators release the GIL) and give the bytes of `iter_chunks`."""
    if plan.init == "const":
        total = plan.n_elements
        step = GROUP_ELEMENTS
        for start in range(0, total, step):
            yield partial(_const_chunk, plan, min(step, total - start))
        return
    if plan.init == "hc_base":
        yield partial(_hc_base, plan)
        return
    if plan.init == "values":
        yield partial(_encode, np.asarray(plan.values, dtype=np.float32), plan.dtype)
        return
    ne0 = plan.ne[0]
    n_rows = plan.n_elements // ne0
    per_group = rows_per_group(plan)
    for group, row in enumerate(range(0, n_rows, per_group)):
        yield partial(_group_chunk, plan, seed, group, row, min(per_group, n_rows - row))


def _const_chunk(plan: TensorPlan, n: int) -> np.ndarray:
    return _encode(np.full(n, plan.value, dtype=np.float32), plan.dtype)


def _group_chunk(plan: TensorPlan, seed: int, group: int, row: int, rows: int) -> np.ndarray:
    """Rows [row, row + rows) of the tensor: group `group`, drawn from its own generator."""
    ne0 = plan.ne[0]
    rng = _rng(seed, plan.name, group)
    if plan.init == "hash_route" and plan.values:
        return draw_hash_rows(rng, rows, ne0, np.asarray(plan.values),
                              np.asarray(plan.mix_rows) if plan.mix_rows else None)
    if plan.init == "hash_route":
        return _hash_route(rng, rows, ne0, plan.n_expert)
    if plan.dtype == "mxfp4":
        return _zero_rows(_mxfp4(rng, rows * ne0, plan.std), plan, row, rows, 1)
    if plan.dtype == "q8_0":
        return _zero_rows(_q8_0(rng, rows * ne0, plan.std), plan, row, rows, 2)
    values = _pin(_mix(_normal(rng, rows * ne0, plan.std), plan, seed, row, rows), plan, row, rows)
    return _zero_rows(_encode(values, plan.dtype), plan, row, rows, 0)


def _row_ids(plan: TensorPlan, row: int, rows: int) -> np.ndarray:
    """Indices (within the group) of the rows that `plan.zero_rows` zeroes."""
    period, index = plan.zero_rows
    if not period:
        return np.zeros(0, dtype=np.int64)
    r = np.arange(row, row + rows)
    return np.flatnonzero(r % period == index)


def _zero_rows(data: np.ndarray, plan: TensorPlan, row: int, rows: int, header: int) -> np.ndarray:
    """Zero the selected rows of a group: every value (f32/f16), or every code after a block's `header` scale bytes
    (MXFP4: code 0 is 0; Q8_0: int8 0)."""
    hit = _row_ids(plan, row, rows)
    if not hit.size:
        return data
    view = data.reshape(rows, -1)
    if header:
        block = BLOCK_BYTES[plan.dtype][1]
        view.reshape(rows, -1, block)[hit, :, header:] = 0
    else:
        view[hit] = 0
    return data


def _mix(values: np.ndarray, plan: TensorPlan, seed: int, row: int, rows: int) -> np.ndarray:
    """Rows r of a dense group become sqrt(1 - w_r^2) row_r + w_r v (`plan.mix_rows`), v one row of the tensor's
    std drawn once per tensor: a logit every row shares, weighted by w_r."""
    if not plan.mix_rows:
        return values
    if len(plan.mix_rows) != plan.n_elements // plan.ne[0]:
        raise ValueError(f"tensor {plan.name}: {len(plan.mix_rows)} mixing weights for "
                         f"{plan.n_elements // plan.ne[0]} rows")
    v = _normal(np.random.default_rng([seed, zlib.crc32(plan.name.encode()), 0x5EED]), plan.ne[0], plan.std)
    w = np.asarray(plan.mix_rows[row:row + rows], dtype=np.float32)[:, None]
    view = values.reshape(rows, plan.ne[0])
    view[:] = np.sqrt(1.0 - w * w) * view + w * v[None, :]
    return values


def _pin(values: np.ndarray, plan: TensorPlan, row: int, rows: int) -> np.ndarray:
    """Set element `plan.pin_col` of each row of a dense group to its pinned value."""
    if plan.pin_col < 0:
        return values
    pins = np.asarray(plan.pin_values, dtype=np.float32)
    view = values.reshape(rows, plan.ne[0])
    view[:, plan.pin_col] = pins[np.arange(row, row + rows) % pins.size]
    return values


def max_chunk_bytes(plan: TensorPlan) -> int:
    """Upper bound on the bytes of one chunk of `plan` (what the writer holds at a time)."""
    block, size = BLOCK_BYTES[plan.dtype]
    return rows_per_group(plan) * plan.ne[0] // block * size
