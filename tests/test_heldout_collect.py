"""data/reference/h200/heldout/collect.sh makes a shipped run folder of whole held-out sessions from the replay.tar.gz a
device call brought back: run on the shipped tarballs, it gives the shipped files again; on a tarball made from them,
an engine under way gets its partial sessions and Ostinato's comparison on them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
COLLECT = REPO / "data" / "reference" / "h200" / "heldout" / "collect.sh"
POOL = REPO / "data" / "reference" / "h200" / "heldout" / "pool.sh"
BIN = str(Path(sys.executable).parent)


def collect(tarball: Path, dest: Path, *extra: str, run: int | str | None = None) -> subprocess.CompletedProcess:
    env = {"BIN": BIN, "PATH": f"{BIN}:/usr/bin:/bin", **({"RUN": str(run)} if run is not None else {})}
    return subprocess.run(["bash", str(COLLECT), str(tarball), str(dest), *extra], cwd=REPO, capture_output=True,
                          text=True, env=env)


def pool(tarball: Path, dest: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {"BIN": BIN, "PATH": f"{BIN}:/usr/bin:/bin"}
    return subprocess.run(["bash", str(POOL), str(tarball), str(dest), *extra], cwd=REPO, capture_output=True,
                          text=True, env=env)


def files(root: Path) -> list[str]:
    """The files under `root`, relative to it, but a README (the shipped folders' own text, which collect.sh does not
    make)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != "README.md")


def assert_as_shipped(made: Path, shipped: Path) -> list[str]:
    """Every file collect.sh made in `made` is byte for byte the shipped one of that name; the names made."""
    names = files(made)
    for name in names:
        assert (made / name).read_bytes() == (shipped / name).read_bytes(), name
    return names


def test_the_h100_run_is_what_collect_makes_of_its_tarball(tmp_path):
    shipped = REPO / "data" / "reference" / "h100" / "heldout" / "run1"
    out = collect(shipped / "replay.tar.gz", tmp_path / "run1")
    assert out.returncode == 0, out.stderr
    made = assert_as_shipped(tmp_path / "run1", shipped)
    assert "partial.sessions.csv" not in made  # every engine finished the τ² set
    assert "swe-heldout/sessions.csv" in made  # and the SWE set is collected beside it


def test_the_h100_run_2_is_what_collect_makes_of_run_1s_tarball(tmp_path):
    """Run 2 (the engine order reversed) is in the tarball run 1 ships: its engines' tables."""
    shipped = REPO / "data" / "reference" / "h100" / "heldout"
    out = collect(shipped / "run1" / "replay.tar.gz", tmp_path / "run2", run=2)
    assert out.returncode == 0, out.stderr
    assert assert_as_shipped(tmp_path / "run2", shipped / "run2") == files(shipped / "run2")


@pytest.mark.parametrize("set_, sub, engines, n", [
    ("tau2-heldout", "", "buun ktransformers-placement llama.cpp-expert-cache llama.cpp-layers ostinato", 20),
    ("swe-heldout", "swe-heldout", "buun ktransformers-placement llama.cpp-expert-cache llama.cpp-layers ostinato", 4)])
def test_the_h100_runs_pooled_are_what_pool_makes_of_the_tarball(tmp_path, set_, sub, engines, n):
    """pooled/ takes a set's two runs as one comparison, every session run a session (#run1, #run2); pooled/swe-heldout/
    the SWE set's."""
    shipped = REPO / "data" / "reference" / "h100" / "heldout"
    out = pool(shipped / "run1" / "replay.tar.gz", tmp_path / "pooled", *([set_] if sub else []))
    assert out.returncode == 0, out.stderr
    assert f"{set_}: 2 runs; pooled: {engines}" in out.stdout
    want = shipped / "pooled" / sub
    assert assert_as_shipped(tmp_path / "pooled", want) == [f for f in files(want) if sub or "/" not in f]
    sessions = pd.read_csv(tmp_path / "pooled" / "sessions.csv")
    assert sorted(sessions.session.str.rsplit("#", n=1).str[1].unique()) == ["run1", "run2"]
    assert (sessions.groupby("engine").size() == n).all()
    assert sorted(sessions.engine.unique()) == engines.split()


@pytest.mark.parametrize("case", ["one-run", "no-ostinato-in-every-run"])
def test_pool_refuses_what_it_cannot_pool(tmp_path, case):
    if case == "one-run":
        # the H200's tarball holds run 1 only
        out = pool(REPO / "data" / "reference" / "h200" / "heldout" / "run1-borrow" / "replay.tar.gz", tmp_path / "x")
        assert out.returncode == 2 and "holds 1 run(s) of tau2-heldout" in out.stderr
    else:
        # the H100's tarball as if Ostinato had not finished run 2's τ² set
        tau2, _, tarball = with_swe_set(tmp_path, "no-ostinato")
        (tau2.parent / "run2" / "tau2-heldout" / "ostinato.sessions.csv").unlink()
        out = pool(repack(tau2.parent.parent, tarball), tmp_path / "x")
        assert out.returncode == 2
        assert "(buun ktransformers-placement llama.cpp-expert-cache llama.cpp-layers) do not include ostinato" \
            in out.stderr
    assert not (tmp_path / "x").exists()


def test_the_h200_run_is_what_collect_makes_of_its_tarball_and_an_earlier_partial_goes(tmp_path):
    shipped = REPO / "data" / "reference" / "h200" / "heldout" / "run1-borrow"
    dest = tmp_path / "run"
    # an earlier collect's summary of an engine then under way is removed; files collect does not make are kept
    dest.mkdir()
    (dest / "README.md").write_text("mine")
    (dest / "partial.sessions.csv").write_text("stale")
    out = collect(shipped / "replay.tar.gz", dest)
    assert out.returncode == 0, out.stderr
    assert "tau2-heldout: finished: buun ktransformers-placement llama.cpp-expert-cache llama.cpp-layers ostinato; " \
        "under way: none" in out.stdout
    assert (dest / "README.md").read_text() == "mine"
    assert not (dest / "partial.sessions.csv").exists()
    made = assert_as_shipped(dest, shipped)
    assert "swe-heldout/sessions.csv" in made and "swe-heldout/compare.csv" not in made  # no Ostinato there yet


def with_swe_set(tmp_path: Path, name: str) -> tuple[Path, Path, Path]:
    """The shipped H100 run's tarball unpacked with an empty `swe-heldout` set, to fill in and `repack`: the τ² set's
    directory, the SWE set's, and the tarball to write."""
    shipped = REPO / "data" / "reference" / "h100" / "heldout" / "run1" / "replay.tar.gz"
    root = tmp_path / f"{name}.unpacked"
    with tarfile.open(shipped) as t:
        t.extractall(root, filter="data")
    swe = root / "results" / "replay" / "swe-heldout"
    shutil.rmtree(swe)
    swe.mkdir()
    return root / "results" / "replay" / "tau2-heldout", swe, tmp_path / f"{name}.tar.gz"


def repack(results_dir: Path, tarball: Path) -> Path:
    with tarfile.open(tarball, "w:gz") as t:
        t.add(results_dir, arcname="results")
    return tarball


def two_set_tarball(tmp_path: Path) -> Path:
    """The shipped H100 tarball with a second set, `swe-heldout`: ostinato and buun finished (the τ² replays under
    that name), llama.cpp-layers under way with two of their sessions, and an engine under way with none."""
    tau, swe, out = with_swe_set(tmp_path, "two")
    for e in ("ostinato", "buun"):
        shutil.copytree(tau / e, swe / e)
        for ext in ("sessions.csv", "requests.csv"):
            shutil.copy(tau / f"{e}.{ext}", swe / f"{e}.{ext}")
    part = swe / ".partial" / "llama.cpp-layers"
    shutil.copytree(tau / "llama.cpp-layers", part)
    for f in sorted((part / "sessions").glob("*.jsonl"))[2:]:
        f.unlink()
    (swe / ".partial" / "ktransformers-placement" / "sessions").mkdir(parents=True)
    return repack(swe.parent.parent, out)


def test_every_set_of_the_tarball_gets_its_folder_the_tau2_set_the_run_folder(tmp_path):
    tarball = two_set_tarball(tmp_path)
    dest = tmp_path / "run"
    # an earlier collect's comparison with buun while it was under way: buun and Ostinato finished now
    (dest / "swe-heldout").mkdir(parents=True)
    (dest / "swe-heldout" / "compare-buun.csv").write_text("stale")
    out = collect(tarball, dest)
    assert out.returncode == 0, out.stderr
    assert "swe-heldout: finished: buun ostinato; under way: llama.cpp-layers" in out.stdout
    shipped = REPO / "data" / "reference" / "h100" / "heldout" / "run1"
    assert (dest / "compare.csv").read_bytes() == (shipped / "compare.csv").read_bytes()
    swe = dest / "swe-heldout"
    assert not (swe / "replay.tar.gz").exists() and (dest / "replay.tar.gz").exists()
    cmp = pd.read_csv(swe / "compare.csv")
    assert sorted(cmp.engine) == ["buun", "ostinato"]
    assert len(pd.read_csv(swe / "partial.sessions.csv")) == 2
    # Ostinato against the engine under way on the two sessions it finished
    part = pd.read_csv(swe / "compare-llama.cpp-layers.csv")
    assert set(part.sessions.dropna().astype(int)) == {2}
    assert not (swe / "compare-ktransformers-placement.csv").exists()
    assert not (swe / "compare-buun.csv").exists()
    # one set asked for: only its folder
    out = collect(tarball, tmp_path / "one", "swe-heldout")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["replay.tar.gz", "swe-heldout"]


def test_a_later_run_is_collected_into_its_own_folder(tmp_path):
    """replay.repeats' run 2 (results/replay/run2/<set>/, the engine order reversed): RUN=2 collects it, without a
    copy of the tarball; run 1's collect leaves it out."""
    tau2, swe, tarball = with_swe_set(tmp_path, "two-runs")
    shutil.rmtree(swe)
    shutil.rmtree(tau2.parent / "run2", ignore_errors=True)  # the shipped run 2, under way: replaced here
    shutil.copytree(tau2, tau2.parent / "run2" / "tau2-heldout")  # run 2: the τ² replays again, under its prefix
    repack(tau2.parent.parent, tarball)
    out = collect(tarball, tmp_path / "run2", run=2)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "run2").iterdir() if p.is_dir()) == []
    assert not (tmp_path / "run2" / "replay.tar.gz").exists()
    shipped = REPO / "data" / "reference" / "h100" / "heldout" / "run1"
    assert (tmp_path / "run2" / "compare.csv").read_bytes() == (shipped / "compare.csv").read_bytes()
    out = collect(tarball, tmp_path / "run1")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "run1" / "run2").exists() and (tmp_path / "run1" / "replay.tar.gz").exists()
    for run, message in ((3, "holds no results/replay/run3 (RUN=3)"), ("x", "RUN=x: expected a run number")):
        out = collect(tarball, tmp_path / f"bad{run}", run=run)
        assert out.returncode == 2 and message in out.stderr
        assert not (tmp_path / f"bad{run}").exists()


@pytest.mark.parametrize("case", ["no-set", "empty-set", "no-tarball"])
def test_bad_input_names_what_is_missing(tmp_path, case):
    shipped = REPO / "data" / "reference" / "h100" / "heldout" / "run1" / "replay.tar.gz"
    if case == "no-set":
        out = collect(REPO / "data" / "reference" / "h200" / "heldout" / "run1-borrow" / "replay.tar.gz",
                      tmp_path / "x", "tau2-dev")
        assert out.returncode == 2 and "holds no results/replay/tau2-dev" in out.stderr
    elif case == "empty-set":
        # the SWE set with only an engine under way that finished no session of it
        _, swe, tarball = with_swe_set(tmp_path, "empty")
        (swe / ".partial" / "buun" / "sessions").mkdir(parents=True)
        out = collect(repack(swe.parent.parent, tarball), tmp_path / "x", "swe-heldout")
        assert out.returncode == 2 and "no engine finished swe-heldout or has sessions of it under way" in out.stderr
    else:
        out = collect(tmp_path / "missing.tar.gz", tmp_path / "x")
        assert out.returncode != 0 and "missing.tar.gz" in out.stderr
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())
