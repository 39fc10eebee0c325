"""`ostinato figures open`: any notebook opens in JupyterLab with the parameters this run's pipeline gave it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nbformat
import pytest
import yaml

from ostinato.cli import main

REPO = Path(__file__).resolve().parents[1]


def _params(tmp_path: Path) -> Path:
    p = tmp_path / "results" / "figures" / "table3.params.yaml"
    p.parent.mkdir(parents=True)
    p.write_text(yaml.safe_dump({"output_stem": "table3", "params": {"target": "ostinato", "n_resamples": 99}}))
    return p


def test_open_injects_this_runs_parameters_without_running(tmp_path: Path) -> None:
    _params(tmp_path)
    assert main(["figures", "open", "table3", "--prepare-only", "--results", str(tmp_path / "results"),
                 "--notebooks", str(REPO / "notebooks")]) == 0
    nb = nbformat.read(tmp_path / "results" / "figures" / "table3.interactive.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "n_resamples" in injected[0].source and "table3" in injected[0].source
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # prepared, not executed


def test_open_names_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["figures", "open", "table3", "--prepare-only", "--results", str(tmp_path / "results")]) == 2
    assert "results/<stage>/table3.params.yaml" in capsys.readouterr().err
    _params(tmp_path)
    assert main(["figures", "open", "nosuch", "--prepare-only", "--results", str(tmp_path / "results"),
                 "--params", str(tmp_path / "results" / "figures" / "table3.params.yaml")]) == 2
    assert "notebooks/nosuch.ipynb" in capsys.readouterr().err


@pytest.mark.slow  # starts a JupyterLab server
def test_jupyterlab_serves_the_prepared_notebook(tmp_path: Path) -> None:
    _params(tmp_path)
    assert main(["figures", "open", "table3", "--prepare-only", "--results", str(tmp_path / "results"),
                 "--notebooks", str(REPO / "notebooks")]) == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
                             "--IdentityProvider.token=t0k", f"--ServerApp.root_dir={tmp_path}", "--allow-root"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        base, headers = f"http://127.0.0.1:{port}", {"Authorization": "token t0k"}
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"{base}/api/contents/results/figures/table3.interactive.ipynb", headers=headers)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "JupyterLab did not start"
                time.sleep(0.5)
        assert r.status_code == 200 and r.json()["type"] == "notebook"
        assert httpx.get(f"{base}/lab", headers=headers).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
