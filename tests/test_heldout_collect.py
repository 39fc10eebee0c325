"""data/reference/h200/heldout/collect.sh makes a shipped run folder of whole held-out sessions from the replay.tar.gz a
device call brought back: run on the shipped tarballs, it gives the shipped files again (finished engines, and an
engine under way with its partial sessions and Ostinato's comparison on them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
COLLECT = REPO / "data" / "reference" / "h200" / "heldout" / "collect.sh"
BIN = str(Path(sys.executable).parent)


def collect(tarball: Path, dest: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(COLLECT), str(tarball), str(dest), *extra], cwd=REPO, capture_output=True,
                          text=True, env={"BIN": BIN, "PATH": f"{BIN}:/usr/bin:/bin"})


def frame(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    return df.sort_values(list(df.columns[:3])).reset_index(drop=True)


def test_the_h100_run_is_what_collect_makes_of_its_tarball(tmp_path):
    shipped = REPO / "data" / "reference" / "h100" / "heldout" / "run1"
    out = collect(shipped / "replay.tar.gz", tmp_path / "run1")
    assert out.returncode == 0, out.stderr
    made = sorted(p.name for p in (tmp_path / "run1").iterdir())
    assert "partial.sessions.csv" not in made  # every engine finished the τ² set
    for name in made:
        assert (tmp_path / "run1" / name).read_bytes() == (shipped / name).read_bytes(), name


def test_an_engine_under_way_gets_its_partial_sessions_and_a_comparison_on_them(tmp_path):
    shipped = REPO / "data" / "reference" / "h200" / "heldout" / "run1-borrow"
    dest = tmp_path / "run"
    # a partial summary left from an earlier collect is replaced, files it does not make are kept
    dest.mkdir()
    (dest / "README.md").write_text("mine")
    out = collect(shipped / "replay.tar.gz", dest)
    assert out.returncode == 0, out.stderr
    assert "under way: ktransformers-placement" in out.stdout
    assert (dest / "README.md").read_text() == "mine"
    for made, ship in (("sessions.csv", "sessions.csv"), ("partial.sessions.csv", "partial.sessions.csv"),
                       ("compare.csv", "compare.csv"),
                       ("compare-ktransformers-placement.csv", "compare-ktransformers.csv")):
        pd.testing.assert_frame_equal(frame(dest / made), frame(shipped / ship))
    assert (dest / "runs-ktransformers-placement.json").exists()


@pytest.mark.parametrize("case", ["no-set", "no-tarball"])
def test_bad_input_names_what_is_missing(tmp_path, case):
    shipped = REPO / "data" / "reference" / "h100" / "heldout" / "run1" / "replay.tar.gz"
    if case == "no-set":
        out = collect(shipped, tmp_path / "x", "swe-heldout")
        assert out.returncode == 2 and "no engine finished swe-heldout" in out.stderr
    else:
        out = collect(tmp_path / "missing.tar.gz", tmp_path / "x")
        assert out.returncode != 0 and "missing.tar.gz" in out.stderr
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())
