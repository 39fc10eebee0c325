"""The memory model's terms against what llama-server reports: log parsing, the linear fit, a real CPU-build check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ostinato.residency.capacity import capacity_test, load_memory_model
from ostinato.residency.memory_check import MIB, fit_linear, gguf_weights, parse_buffers

LOG = """0.00.062.117 I load_tensors:   CPU_Mapped model buffer size =     4.80 MiB
0.00.062.938 I llama_context:        CPU  output buffer size =     0.00 MiB
0.00.067.337 I llama_kv_cache:        CPU KV buffer size =     1.00 MiB
0.00.068.292 I llama_kv_cache:        CPU KV buffer size =     0.50 MiB
0.00.069.935 I llama_dsv4_comp_state:        CPU DSV4 csa state buffer size =     0.06 MiB
0.00.100.066 I sched_reserve:        CPU compute buffer size =     3.67 MiB
0.00.100.067 I sched_reserve:  CUDA_Host compute buffer size =     1.00 MiB
"""


def test_parse_buffers_by_kind_and_device() -> None:
    b = parse_buffers(LOG)
    assert b.model == {"CPU_Mapped": 4.80 * MIB}
    assert b.context == {"CPU": pytest.approx((0.0 + 1.0 + 0.5 + 0.06) * MIB)}
    assert b.compute == {"CPU": 3.67 * MIB, "CUDA_Host": 1.0 * MIB} and b.lines["context"] == 4
    assert b.total("compute") == pytest.approx(4.67 * MIB)
    with pytest.raises(ValueError, match="-lv 4"):
        parse_buffers("nothing here")


def test_fit_linear_checks_the_third_size() -> None:
    t = fit_linear((1000, 2000, 4000), (300.0, 500.0, 900.0), lines=0, rel_tol=0.0)
    assert (t.fixed_bytes, t.per_unit_bytes, t.predicted_bytes) == (100.0, 0.2, 900.0) and t.ok
    bad = fit_linear((1000, 2000, 4000), (300.0, 500.0, 950.0), lines=0, rel_tol=0.01)
    assert not bad.ok and bad.tolerance_bytes == pytest.approx(9.5)
    # 0.005 MiB of rounding per reported line, on each side
    assert fit_linear((1, 2, 3), (0.0, 0.0, 0.0), lines=2, rel_tol=0.0).tolerance_bytes == pytest.approx(0.02 * MIB)
    with pytest.raises(ValueError, match="two different sizes"):
        fit_linear((5, 5, 6), (1.0, 1.0, 1.0), 1)


def test_gguf_weights_add_up_to_the_file(tiny_v4_model: Path, llama_tree: Path) -> None:
    w = gguf_weights(tiny_v4_model, llama_tree)
    assert w.n_layer == 4 and w.n_expert == 16 and all(b > 0 for b in w.expert_bytes)
    # tiny-v4: F32 experts of 64 x 64 (gate, up, down) -> 3 x 64 x 64 x 4 bytes per expert
    assert w.expert_bytes[0] == 3 * 64 * 64 * 4
    assert w.token_embd_bytes > 0 and w.output_bytes > 0
    assert 0 < tiny_v4_model.stat().st_size - w.total < 0.05 * tiny_v4_model.stat().st_size  # plus metadata


def test_memory_cli_checks_the_cpu_build(engine_variants: dict[str, Path], tiny_v4_model: Path, llama_tree: Path,
                                         tmp_path: Path) -> None:
    from ostinato.cli import main

    rc = main(["residency", "memory", "--model", str(tiny_v4_model), "--llama-tree", str(llama_tree),
               "--server-bin", str(engine_variants["stock"] / "llama-server"), "--ctx-sizes", "1024,2048,4096",
               "--ubatch", "256", "--gpu-total-bytes", str(2**30), "--log-dir", str(tmp_path / "logs"),
               "--out", str(tmp_path / "m.yaml"), "--report", str(tmp_path / "r.json")])
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and rep["ok"] and rep["weights"]["ok"] and rep["context"]["ok"], rep
    assert rep["context"]["per_unit_bytes"] > 0 and rep["compute"]["used_bytes"] > 0
    m = load_memory_model(tmp_path / "m.yaml")
    assert m.n_layer == 4 and m.zero_slots == 8 and m.staging_experts == 16 and m.n_ubatch == 256
    assert yaml.safe_load((tmp_path / "m.yaml").read_text())["compute_bytes_per_token"] == 0
    cap = capacity_test(m)
    assert cap.slots[0] > 0 and cap.terms[0]["compute"] == m.compute_fixed_bytes[0]
