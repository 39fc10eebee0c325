"""Peer engines: the pin file, the source check and export of `ostinato peers build`, and a replay of a tiny session
against ik_llama.cpp's llama-server by URL (when a build of it is at hand)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from ostinato.peers.build import check_source, prepare_tree, tree_matches
from ostinato.peers.pin import PEERS_FILE, SourcePin, load_peers
from ostinato.peers.source import blob_id, dir_listing, git_listing, listing_sha256
from ostinato.server.client import RequestOutput, consume_stream

REPO = Path(__file__).resolve().parents[1]
IK_BIN = REPO / "build" / "peers" / "ik_llama.cpp" / "cpu" / "bin" / "llama-server"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def small_repo(tmp_path: Path) -> tuple[Path, SourcePin]:
    """A two-commit repository with a file, an executable and a symlink, and a pin of its second commit."""
    repo = tmp_path / "peer"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "sub").mkdir()
    (repo / "sub" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "sub" / "run.sh").chmod(0o755)
    (repo / "big.bin").write_bytes(b"x" * 1000)
    os.symlink("a.txt", repo / "link")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "second")
    head = _git(repo, "rev-parse", "HEAD")
    entries = git_listing(repo, head)
    big = next(e for e in entries if e.path == "big.bin")
    pin = SourcePin(name="peer", repository="file://peer", snapshot="today", commit=head,
                    tree=_git(repo, "rev-parse", "HEAD^{tree}"), n_files=len(entries),
                    listing_sha256=listing_sha256(entries), absent_ok={"big.bin": f"{big.mode} {big.blob}"},
                    generated=("gen.cpp",), cmake_args=("-DX=1",))
    return repo, pin


def test_the_shipped_pin_reads():
    peers = load_peers(REPO / PEERS_FILE)
    ik = peers.engine("ik_llama.cpp")
    assert len(ik.commit) == 40 and len(ik.listing_sha256) == 64 and ik.targets == ("llama-server",)
    assert all(len(v.split()[1]) == 40 for v in ik.absent_ok.values())
    with pytest.raises(ValueError, match="known: ik_llama.cpp"):
        peers.engine("nope")


def test_listing_equals_gits_own(small_repo):
    repo, pin = small_repo
    assert blob_id(b"one\n") == _git(repo, "hash-object", "a.txt")
    assert listing_sha256(dir_listing(repo)) == pin.listing_sha256  # the work tree as git records it
    assert {e.path: e.mode for e in dir_listing(repo)} == {"a.txt": "100644", "sub/run.sh": "100755",
                                                           "big.bin": "100644", "link": "120000"}


def test_source_at_another_commit_or_changed_is_refused(small_repo, tmp_path):
    repo, pin = small_repo
    assert check_source(pin, repo).kind == "git"
    _git(repo, "checkout", "-q", "HEAD~1")
    with pytest.raises(ValueError, match=f"is at commit .* pins commit {pin.commit}"):
        check_source(pin, repo)
    with pytest.raises(FileNotFoundError, match="--src .*not a directory"):
        check_source(pin, tmp_path / "missing")


def test_export_skips_allowed_absent_blobs_and_is_reused(small_repo, tmp_path):
    repo, pin = small_repo
    checked = check_source(pin, repo)
    tree = tmp_path / "out" / "tree"
    prepare_tree(pin, repo, replace(checked, absent=["big.bin"]), tree)  # as if the snapshot lacked big.bin
    assert (tree / "sub" / "run.sh").stat().st_mode & 0o100 and os.readlink(tree / "link") == "a.txt"
    assert not (tree / "big.bin").exists() and tree_matches(pin, tree)
    (tree / "gen.cpp").write_text("// written by the build\n")  # a generated file does not count
    assert tree_matches(pin, tree)
    (tree / "a.txt").write_text("changed\n")
    assert not tree_matches(pin, tree)
    # a plain copy of the files is a source too, and a changed one is refused
    copy = tmp_path / "copy"
    prepare_tree(pin, repo, check_source(pin, repo), copy)
    assert check_source(pin, copy).kind == "dir"
    (copy / "a.txt").write_text("changed\n")
    with pytest.raises(ValueError, match="do not match"):
        check_source(pin, copy)


def test_peers_build_names_the_flag(tmp_path, capsys):
    from ostinato.cli import main

    assert main(["peers", "build", "ik_llama.cpp", "--src", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "--src" in capsys.readouterr().err
    assert main(["peers", "build", "ik_llama.cpp", "--src", str(tmp_path), "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err


def test_stream_without_token_ids_times_text_chunks():
    """ik_llama.cpp's /completion streams text without token ids: each non-final chunk with text is a token chunk."""
    ticks = iter([1.0, 1.5, 2.0, 2.5, 3.0])
    lines = ['data: {"content": "a", "stop": false}', 'data: {"content": "", "stop": false}',
             'data: {"content": "b", "stop": false}',
             'data: {"content": "", "stop": true, "tokens_predicted": 3, "timings": {"predicted_n": 3}}']
    out = consume_stream(lines, RequestOutput(t_send=0.5), clock=lambda: next(ticks), text_chunks=True)
    assert out.success and out.n_output == 3 and out.n_chunks == 2 and out.ttft == 0.5 and out.itl == [1.0]
    assert out.token_ids == []
    forced = consume_stream(lines, RequestOutput(), clock=lambda: 1.0)  # api llama: forced outputs need the ids
    assert not forced.success and "use --api llama-generate" in forced.error


def test_llama_generate_refuses_routing_and_a_started_server(tmp_path, capsys):
    from ostinato.cli import main
    from ostinato.sessions.model import TokenizedRequest, TokenizedSession, write_sessions_jsonl

    write_sessions_jsonl([TokenizedSession("t/s0", "t", "byte", "chatml",
                                           (TokenizedRequest(0, "first", (1, 2), (3, 4)),))], tmp_path / "s.jsonl")
    base = ["replay", "run", "--engine-name", "e", "--sessions", str(tmp_path / "s.jsonl"), "--out",
            str(tmp_path / "out"), "--no-progress", "--api", "llama-generate"]
    assert main(base + ["--server-bin", "x", "--model", "m"]) == 2
    assert "--api llama-generate needs --server-url" in capsys.readouterr().err
    assert main(base + ["--server-url", "http://127.0.0.1:9", "--routing-force-dir", "d"]) == 2
    assert "routing traces" in capsys.readouterr().err


# --- ik_llama.cpp's llama-server, replayed by URL -------------------------------------------------------------------

def ik_binary() -> Path | None:
    """OSTINATO_IK_LLAMA_BIN, else the CPU build of `ostinato peers build ik_llama.cpp`, else None."""
    env = os.environ.get("OSTINATO_IK_LLAMA_BIN")
    if env:
        return Path(env)
    return IK_BIN if IK_BIN.is_file() else None


@pytest.fixture(scope="module")
def ik_server(request, tmp_path_factory):
    """ik_llama.cpp's llama-server on the tiny qwen3moe model, started as a user would (one slot, a slot-save path
    so the replay can erase the prompt cache between sessions); skipped without a build."""
    from ostinato.server import free_port
    import httpx
    import time

    binary = ik_binary()
    if binary is None or not binary.is_file():
        pytest.skip("no ik_llama.cpp build: set OSTINATO_IK_LLAMA_BIN to its llama-server, or run `ostinato peers "
                    f"build ik_llama.cpp --src <its git repository>` (which installs {IK_BIN.relative_to(REPO)})")
    model = Path(request.getfixturevalue("tiny_model"))
    tmp = tmp_path_factory.mktemp("ik")
    port = free_port()
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "1024",
                             "-t", "2", "-np", "1", "--slot-save-path", str(tmp / "slots")],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=tmp)  # ik's server writes llama.log into its working directory
    (tmp / "slots").mkdir()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            log.close()
            pytest.fail(f"ik_llama.cpp's llama-server exited with {proc.returncode}: "
                        f"{(tmp / 'server.log').read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("ik_llama.cpp's llama-server not healthy after 120 s")
        time.sleep(0.2)
    yield url, tmp / "server.log"
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def _tiny_sessions(path: Path) -> list:
    from ostinato.sessions.model import TokenizedRequest, TokenizedSession, write_sessions_jsonl

    sessions = []
    for s in range(2):
        reqs = (TokenizedRequest(0, "first", tuple(range(10, 40)) + (40 + s,), (97, 98, 99, 100)),
                TokenizedRequest(1, "tool", (60, 70 + s, 80), (101, 102, 103, 104)))
        sessions.append(TokenizedSession(f"ik/s{s}", "test", "byte", "chatml", reqs))
    write_sessions_jsonl(sessions, path)
    return sessions


@pytest.mark.slow
def test_ik_llama_replay_by_url(ik_server, tmp_path, capsys):
    """The harness drives ik_llama.cpp by URL as a peer: --api llama (forced outputs) is refused at the warm-up,
    since ik's /completion streams no token ids and knows no forced_tokens; --api llama-generate replays every
    request with the recorded prompts, outputs of the recorded length, slot erase and ik's own server timings."""
    from ostinato.cli import main

    url, _ = ik_server
    sessions = _tiny_sessions(tmp_path / "s.jsonl")
    common = ["--sessions", str(tmp_path / "s.jsonl"), "--out", str(tmp_path / "out"), "--server-url", url,
              "--no-progress", "--machine-label", "test", "--strict"]
    assert main(["replay", "run", "--engine-name", "ik-forced", "--api", "llama", *common]) == 2
    assert "no chunk carried a token id" in capsys.readouterr().err
    assert main(["replay", "run", "--engine-name", "ik_llama.cpp", "--api", "llama-generate", *common]) == 0
    recs = [json.loads(line) for p in sorted((tmp_path / "out" / "ik_llama.cpp" / "sessions").glob("*.jsonl"))
            for line in p.read_text().splitlines()]
    assert len(recs) == 4 and all(r["ok"] for r in recs), [r["error"] for r in recs]
    assert all(r["n_output"] == 4 and r["forced_match"] is None and r["n_forced"] == 0 for r in recs)
    assert all(r["ttft_s"] > 0 and r["server"]["predicted_n"] == 4 for r in recs)
    s0 = sessions[0].requests
    assert recs[1]["n_prompt"] == len(s0[0].new_token_ids) + len(s0[0].output_token_ids) + len(s0[1].new_token_ids)
    assert recs[0]["server"]["prompt_n"] == len(s0[0].new_token_ids)  # the slot was erased: nothing cached
    assert recs[2]["server"]["prompt_n"] == len(sessions[1].requests[0].new_token_ids)  # erased between sessions


def test_carried_wheels_fit_a_device_call():
    """The wheels the GPU probe carries, with the working tree, stay well inside a call's 64 MiB."""
    peers = load_peers(REPO / PEERS_FILE)
    carried = [w for w in peers.wheels["freetoken"] if w.carry]
    assert carried[0].name == "freetoken" and carried[0].version == "0.2.1"
    assert sum(w.size for w in carried) < 32 * 2**20
    assert not any(w.carry for w in peers.wheels["ktransformers"])  # each about 97 MiB
    assert all(len(w.sha256) == 64 for ws in peers.wheels.values() for w in ws)
    compile((REPO / "scripts" / "peers" / "probe_gpu.py").read_text(), "probe_gpu.py", "exec")
