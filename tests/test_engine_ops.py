"""The op tests of the ostinato stage: test-residency-ops (the CPU side) and test-backend-ops' residency cases.

On the CPU build test-backend-ops compares the CPU with itself (it checks that the cases build and run);
on the CUDA build (OSTINATO_ENGINE_BACKEND=cuda, device runs) it compares CUDA with the CPU, and the marked
MUL_MAT_ID_SKIP nodes must be reported unsupported by CUDA.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import BACKEND

CASE_LINE = re.compile(r"^\s+(MUL_MAT_ID_(?:SKIP|POOL))\((.*)\): (.*)$")
N_CASES = 60  # per op: 5 types x 3 cold shares x 4 shapes (tests/test-backend-ops-residency.h)


def _op_test(engine_variants: dict[str, Path], name: str) -> Path:
    """The ostinato stage's op test `name`; skipped where the build left the op tests out (OSTINATO_ENGINE_OP_TESTS=0)."""
    if os.environ.get("OSTINATO_ENGINE_OP_TESTS", "1") == "0":
        pytest.skip("this build has no op tests (OSTINATO_ENGINE_OP_TESTS=0)")
    return engine_variants["ostinato"] / name


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_residency_ops_cpu_side(engine_variants: dict[str, Path]) -> None:
    p = _run([str(_op_test(engine_variants, "test-residency-ops"))])
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    m = re.search(r"^(\d+)/(\d+) tests passed; (\d+) non-CPU", p.stdout, re.M)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) >= 160, p.stdout[-2000:]


@pytest.mark.gpu
def test_residency_ops_schedule_marked_nodes_between_gpu_ops(engine_variants: dict[str, Path]) -> None:
    p = _run([str(_op_test(engine_variants, "test-residency-ops"))])
    m = re.search(r"^(\d+)/(\d+) tests passed; (\d+) non-CPU", p.stdout, re.M)
    assert p.returncode == 0 and m and int(m.group(3)) >= 1, "the CUDA build found no GPU to run the scheduler cases on"


def _case_results(out: str) -> dict[str, list[str]]:
    """Outcome text of every residency case, by op."""
    res: dict[str, list[str]] = {"MUL_MAT_ID_SKIP": [], "MUL_MAT_ID_POOL": []}
    for line in out.splitlines():
        m = CASE_LINE.match(re.sub(r"\x1b\[[0-9;]*m", "", line))
        if m:
            res[m.group(1)].append(m.group(3).strip())
    return res


def test_backend_ops_residency_cases(engine_variants: dict[str, Path]) -> None:
    tbo = str(_op_test(engine_variants, "test-backend-ops"))
    args = [tbo, "test", "-o", "MUL_MAT_ID_SKIP,MUL_MAT_ID_POOL"]
    p = _run(args + (["-b", "CPU"] if BACKEND == "cpu" else []))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    res = _case_results(p.stdout)
    assert len(res["MUL_MAT_ID_POOL"]) == N_CASES, p.stdout[-3000:]
    assert all(r == "OK" for r in res["MUL_MAT_ID_POOL"]), res["MUL_MAT_ID_POOL"]
    assert len(res["MUL_MAT_ID_SKIP"]) == N_CASES, p.stdout[-3000:]
    if BACKEND == "cpu":
        assert all(r == "OK" for r in res["MUL_MAT_ID_SKIP"]), res["MUL_MAT_ID_SKIP"]


@pytest.mark.gpu
def test_cuda_refuses_nodes_marked_to_skip(engine_variants: dict[str, Path]) -> None:
    """A GPU must refuse marked nodes (the scheduler then runs them on the CPU), and compute the pool's cases."""
    p = _run([str(_op_test(engine_variants, "test-backend-ops")), "test", "-o", "MUL_MAT_ID_SKIP,MUL_MAT_ID_POOL"])
    res = _case_results(p.stdout)
    assert len(res["MUL_MAT_ID_SKIP"]) == N_CASES, p.stdout[-3000:]
    assert all(r.startswith("not supported") for r in res["MUL_MAT_ID_SKIP"]), res["MUL_MAT_ID_SKIP"]
    assert all(r == "OK" for r in res["MUL_MAT_ID_POOL"]), res["MUL_MAT_ID_POOL"]
