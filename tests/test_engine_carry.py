"""Carrying a built engine between machines (`ostinato engine pack-build` / `repart-pack` / `unpack-build`): the parts
round-trip, broken or foreign packs are refused with errors that name the file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from ostinato.atomic import sha256_file
from ostinato.cli import main
from ostinato.engine.carry import PackIndex, pack_build, repart_pack, unpack_build
from ostinato.engine.stages import VariantManifest, sources_fingerprint

REPO = Path(__file__).resolve().parents[1]


def _fake_build(root: Path, variants=("stock", "ostinato"), engine: Path = REPO / "engine",
                size: int = 3 << 20) -> Path:
    """A build tree like `ostinato engine build`'s: bin/ with the targets, the manifest, the tree's gguf-py."""
    for i, v in enumerate(variants):
        (root / v / "bin").mkdir(parents=True)
        targets = ["llama-server", "llama-bench"] + (["test-residency-ops"] if v == "ostinato" else [])
        for t in targets:
            # incompressible, so that the small part size gives several parts
            (root / v / "bin" / t).write_bytes(bytes(range(256)) * 4 + os.urandom(size) + bytes([i]))
        m = VariantManifest(variant=v, backend="cuda", backend_reason="test", fingerprint=f"fp-{v}", build_number=1,
                            upstream_commit="c", tree_commit="t", patches=[], cmake_args=[],
                            targets=targets, build_seconds=1.0, built_at="now",
                            sources=sources_fingerprint(engine, v))
        (root / v / "manifest.json").write_text(json.dumps(asdict(m)))
    (root / "tree" / "gguf-py" / "gguf").mkdir(parents=True)
    (root / "tree" / "gguf-py" / "gguf" / "__init__.py").write_text("# gguf\n")
    return root


def test_a_packed_build_unpacks_whole_and_newer_than_the_checkout(tmp_path):
    built = _fake_build(tmp_path / "src" / "cuda")
    index_path, index = pack_build(built, ("stock", "ostinato"), tmp_path / "pack", REPO, part_bytes=4 << 20)
    assert index_path.name == "engine-cuda.json" and len(index.parts) >= 3
    assert all(p.bytes <= 4 << 20 for p in index.parts) and set(index.variants) == {"stock", "ostinato"}
    assert PackIndex.load(index_path) == index
    start = time.time()
    out = tmp_path / "dst"
    assert unpack_build(tmp_path / "pack", out, REPO) == (index, True)
    for v in ("stock", "ostinato"):
        for t in ("llama-server", "llama-bench"):
            a, b = built / v / "bin" / t, out / "cuda" / v / "bin" / t
            assert sha256_file(a) == sha256_file(b)
            assert b.stat().st_mtime >= start - 1
        m = json.loads((out / "cuda" / v / "manifest.json").read_text())
        assert (m["fingerprint"], m["sources"]) == (f"fp-{v}", sources_fingerprint(REPO / "engine", v))
    assert (out / "cuda" / "tree" / "gguf-py" / "gguf" / "__init__.py").read_text() == "# gguf\n"
    # the op tests stay behind unless asked for; the manifest lists what came
    assert not (out / "cuda" / "ostinato" / "bin" / "test-residency-ops").exists()
    assert json.loads((out / "cuda" / "ostinato" / "manifest.json").read_text())["targets"] == [
        "llama-server", "llama-bench"]
    _, with_tests = pack_build(built, ("ostinato",), tmp_path / "pack-tests", REPO, op_tests=True)
    unpack_build(tmp_path / "pack-tests", tmp_path / "dst-tests", REPO)
    ost = tmp_path / "dst-tests" / "cuda" / "ostinato"
    tests_bin = "bin/test-residency-ops"
    assert sha256_file(ost / tests_bin) == sha256_file(built / "ostinato" / tests_bin)
    assert json.loads((ost / "manifest.json").read_text())["targets"][-1] == "test-residency-ops"
    # again on the same machine: the build is there, nothing is touched (what snakemake made from it stays current)
    server = out / "cuda" / "stock" / "bin" / "llama-server"
    os.utime(server, (1e9, 1e9))
    (out / "cuda" / "stock" / "bin" / "stale").write_text("x")
    assert unpack_build(index_path, out, REPO) == (index, False)
    assert server.stat().st_mtime == 1e9 and (out / "cuda" / "stock" / "bin" / "stale").exists()
    # a variant that lost a target is unpacked again, whole; a full tree (a git repository) is left as it is
    (out / "cuda" / "ostinato" / "bin" / "llama-bench").unlink()
    (out / "cuda" / "tree" / ".git").mkdir()
    (out / "cuda" / "tree" / "gguf-py" / "gguf" / "__init__.py").write_text("# full tree\n")
    assert unpack_build(index_path, out, REPO) == (index, True)
    assert not (out / "cuda" / "stock" / "bin" / "stale").exists()
    assert (out / "cuda" / "ostinato" / "bin" / "llama-bench").is_file() and server.stat().st_mtime >= start - 1
    assert (out / "cuda" / "tree" / "gguf-py" / "gguf" / "__init__.py").read_text() == "# full tree\n"
    assert not list(out.glob("*.tmp")) and not list((out / "cuda").glob("*.old"))


def test_broken_or_missing_parts_are_refused_by_name(tmp_path):
    built = _fake_build(tmp_path / "src" / "cuda", variants=("stock",), size=2 << 20)
    _, index = pack_build(built, ("stock",), tmp_path / "pack", REPO, part_bytes=1 << 20)
    part = tmp_path / "pack" / index.parts[1].name
    data = bytearray(part.read_bytes())
    data[100] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{part.name}: size or sha256 differs"):
        unpack_build(tmp_path / "pack", tmp_path / "dst", REPO)
    part.unlink()
    with pytest.raises(FileNotFoundError, match=rf"{part.name}: part of engine-cuda.json missing"):
        unpack_build(tmp_path / "pack", tmp_path / "dst", REPO)
    assert not (tmp_path / "dst" / "cuda" / "stock").exists()
    with pytest.raises(FileNotFoundError, match="expected one engine pack index"):
        unpack_build(tmp_path, tmp_path / "dst", REPO)


def test_a_pack_cut_again_unpacks_the_same_build(tmp_path, capsys):
    """`engine repart-pack`: a pack kept as two carried folders (.prebuilt-parts/ and .prebuilt/) is cut into parts of
    another size, which unpack to the same files; a missing or broken part, or an output folder among the inputs, is
    refused by name."""
    built = _fake_build(tmp_path / "src" / "cuda", size=2 << 20)
    _, index = pack_build(built, ("stock", "ostinato"), tmp_path / "pack", REPO, part_bytes=1 << 20)
    assert len(index.parts) >= 5
    parts, last = tmp_path / ".prebuilt-parts", tmp_path / ".prebuilt"
    parts.mkdir(), last.mkdir()
    for p in index.parts[:-1]:
        shutil.copy(tmp_path / "pack" / p.name, parts)
    shutil.copy(tmp_path / "pack" / index.parts[-1].name, last)
    shutil.copy(tmp_path / "pack" / "engine-cuda.json", last)
    out = tmp_path / "cut"
    out.mkdir()
    (out / "engine-cuda.tar.xz.09").write_bytes(b"stale")
    assert main(["engine", "repart-pack", "--from", str(parts), "--from", str(last), "--out", str(out),
                 "--part-size", "3"]) == 0
    total = sum(p.bytes for p in index.parts)
    n = -(-total // (3 << 20))
    assert f"engine-cuda.json: stock, ostinato (cuda) in {n} part(s)" in capsys.readouterr().out
    cut = PackIndex.load(out / "engine-cuda.json")
    assert [p.name for p in cut.parts] == [f"engine-cuda.tar.xz.{i:02d}" for i in range(n)]
    assert all(p.bytes == 3 << 20 for p in cut.parts[:-1]) and sum(p.bytes for p in cut.parts) == total
    assert (cut.variants, cut.commit, cut.packed_at, cut.raw_bytes) == (
        index.variants, index.commit, index.packed_at, index.raw_bytes)
    assert sorted(p.name for p in out.iterdir()) == ["engine-cuda.json"] + [p.name for p in cut.parts]
    assert unpack_build(out, tmp_path / "dst", REPO) == (cut, True)
    for v in ("stock", "ostinato"):
        for t in ("llama-server", "llama-bench"):
            assert sha256_file(built / v / "bin" / t) == sha256_file(tmp_path / "dst" / "cuda" / v / "bin" / t)
    # refused: the output among the inputs, a part missing from every folder, a broken part
    assert main(["engine", "repart-pack", "--from", str(parts), "--from", str(last), "--out", str(last),
                 "--part-size", "3"]) == 2
    assert "must not be one of the folders the pack is read from" in capsys.readouterr().err
    missing = parts / index.parts[1].name
    data = missing.read_bytes()
    missing.unlink()
    with pytest.raises(FileNotFoundError, match=rf"{missing.name}: part of engine-cuda.json missing \(looked in "):
        repart_pack([parts, last], tmp_path / "cut2", 3 << 20)
    missing.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ValueError, match=rf"{missing.name}: size or sha256 differs"):
        repart_pack([parts, last], tmp_path / "cut2", 3 << 20)
    with pytest.raises(FileNotFoundError, match="expected one engine pack index"):
        repart_pack([parts], tmp_path / "cut2", 3 << 20)


def test_a_build_of_other_engine_sources_is_neither_packed_nor_unpacked(tmp_path):
    # a checkout whose engine/src differs from the one the build was made from
    other = tmp_path / "other"
    shutil.copytree(REPO / "engine", other / "engine")
    header = next((other / "engine" / "src").rglob("*.h"))
    header.write_text(header.read_text() + "\n// changed\n")
    built = _fake_build(tmp_path / "src" / "cuda", variants=("stock",))
    with pytest.raises(ValueError, match=r"stock: built from other engine sources than this checkout's"):
        pack_build(built, ("stock",), tmp_path / "pack", other)
    pack_build(built, ("stock",), tmp_path / "pack", REPO)
    with pytest.raises(ValueError, match=r"engine-cuda.json: its stock build was made from other engine sources"):
        unpack_build(tmp_path / "pack", tmp_path / "dst", other)
    assert not (tmp_path / "dst" / "cuda" / "stock").exists()


def test_pack_build_cli_names_a_missing_build(tmp_path, capsys):
    rc = main(["engine", "pack-build", "--repo", str(REPO), "--engine-dir", str(tmp_path / "none"),
               "--out", str(tmp_path / "pack")])
    assert rc == 2 and "manifest.json: no build of the stock variant to pack" in capsys.readouterr().err
    rc = main(["engine", "pack-build", "--repo", str(REPO), "--engine-dir", str(tmp_path / "none"),
               "--out", str(tmp_path / "pack"), "--part-size", "0"])
    assert rc == 2 and "expected at least 1 MiB (--part-size)" in capsys.readouterr().err


def test_the_cpu_build_runs_after_a_round_trip(engine_variants, tmp_path, capsys):
    cpu = engine_variants["stock"].parent.parent
    assert main(["engine", "pack-build", "--repo", str(REPO), "--engine-dir", str(cpu), "--variants", "stock",
                 "--out", str(tmp_path / "pack")]) == 0
    assert "engine-cpu.json: stock (cpu)" in capsys.readouterr().out
    assert main(["engine", "unpack-build", "--repo", str(REPO), "--from", str(tmp_path / "pack"),
                 "--out", str(tmp_path / "engine")]) == 0
    server = tmp_path / "engine" / "cpu" / "stock" / "bin" / "llama-server"
    proc = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "version" in (proc.stdout + proc.stderr)
    assert (tmp_path / "engine" / "cpu" / "tree" / "gguf-py").is_dir()
    assert main(["engine", "unpack-build", "--repo", str(REPO), "--from", str(tmp_path / "pack"),
                 "--out", str(tmp_path / "engine")]) == 0
    assert "already there, left as it is: stock (cpu)" in capsys.readouterr().out


@pytest.mark.slow
def test_snakemake_takes_an_unpacked_build_as_up_to_date(engine_variants, tmp_path):
    """On a fresh checkout (every input file new), the carried build is not rebuilt: build_engine is not scheduled."""
    cpu = engine_variants["stock"].parent.parent
    pack_build(cpu, ("stock", "ostinato"), tmp_path / "pack", REPO)
    work = tmp_path / "checkout"
    for part in ("Snakefile", "workflow", "config", "engine", "environment.yml", "data/profiles", "data/paper",
                 "artifact"):
        src, dst = REPO / part, work / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    then = time.time() - 5
    for p in work.rglob("*"):
        os.utime(p, (then, then))
    exe = Path(sys.executable).parent / "snakemake"

    def planned() -> str:
        proc = subprocess.run([str(exe), "-n", "--cores", "1", "--config", "engine={backend: cpu}", "--rerun-triggers",
                               "mtime", "--keep-going", "results/sweep/rows.csv"], cwd=work, capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    assert "rule build_engine:" in planned()  # nothing built yet
    unpack_build(tmp_path / "pack", work / "build" / "engine", work)
    out = planned()
    assert "rule build_engine:" not in out and "rule sweep_prefill:" in out


@pytest.mark.parametrize("script", ["heldout/run.sh", "branches/run.sh", "graph/run.sh"])
def test_gpu_scripts_gather_a_pack_carried_in_two_calls(tmp_path, script):
    """`run.sh stage` (the held-out replays' and the sweeps' scripts, data/reference/h200/prebuilt.sh) keeps the parts
    one call carries (.prebuilt-parts/) in build/prebuilt/, where the next call's index (.prebuilt/) joins them, since
    a CUDA pack and the wheels exceed one call's carry together."""
    script = REPO / "data" / "reference" / "h200" / script
    env = {**os.environ, "OUT": str(tmp_path / "out")}

    def call(carried: dict[str, dict[str, bytes]]) -> subprocess.CompletedProcess:
        for d in (".prebuilt-parts", ".prebuilt"):
            shutil.rmtree(tmp_path / d, ignore_errors=True)  # a carried path replaces the one there wholesale
        for d, files in carried.items():
            (tmp_path / d).mkdir()
            for name, data in files.items():
                (tmp_path / d / name).write_bytes(data)
        return subprocess.run(["bash", str(script), "stage"], cwd=tmp_path, env=env, capture_output=True, text=True)

    first = call({".prebuilt-parts": {"engine-cuda.tar.xz.00": b"a", "engine-cuda.tar.xz.01": b"b"}})
    assert first.returncode == 0, first.stderr
    assert "2 file(s)" in first.stdout
    second = call({".prebuilt": {"engine-cuda.json": b"{}"}})
    assert second.returncode == 0, second.stderr
    assert sorted(p.name for p in (tmp_path / "build" / "prebuilt").iterdir()) == [
        "engine-cuda.json", "engine-cuda.tar.xz.00", "engine-cuda.tar.xz.01"]
    assert (tmp_path / "build" / "prebuilt" / "engine-cuda.tar.xz.01").read_bytes() == b"b"


def test_sweep_parts_of_several_sweeps_bring_back_one_tar(tmp_path):
    """`graph/run.sh threads` runs a sweep per thread count, four files each; the device tool brings back at most eight
    files of a call, so each sweep's files go into $OUT/threads.tar as it ends (its config names the thread count)."""
    import tarfile

    graph = tmp_path / "h200" / "graph"
    graph.mkdir(parents=True)
    shutil.copy(REPO / "data" / "reference" / "h200" / "graph" / "run.sh", graph / "run.sh")
    (tmp_path / "h200" / "branches").mkdir()
    # a stand-in for the sweep itself: what branches/run.sh sweep leaves in $OUT
    (tmp_path / "h200" / "branches" / "run.sh").write_text(
        'set -e\ngrep -q residency-worker-threads "$SWEEP_CONFIG"\n'
        'echo tar > "$OUT/sweep.tar.gz"; echo log > "$OUT/snakemake-sweep.log"; echo m > "$OUT/machine-sweep.txt"\n')
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "WORKER_THREADS": "2 4 8", "SIZES": "128"}
    done = subprocess.run(["bash", str(graph / "run.sh"), "threads"], cwd=tmp_path, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["threads.tar"]
    with tarfile.open(out / "threads.tar") as tar:
        names = tar.getnames()
        assert names == [f for n in (2, 4, 8) for f in (f"threads{n}.yaml", f"threads{n}.tar.gz",
                                                         f"snakemake-threads{n}.log", f"threads{n}-machine.txt")]
        assert '"--residency-worker-threads", "4"' in tar.extractfile("threads4.yaml").read().decode()
