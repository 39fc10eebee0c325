"""A peer's source: the listing of a git commit or of a directory (mode, git blob id, path), and an export of a
commit into a plain directory that tolerates the blobs a repository snapshot left out (declared in the pin)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

SYMLINK, EXEC, FILE = "120000", "100755", "100644"


@dataclass(frozen=True)
class Entry:
    """One file of a tree: git mode (100644, 100755 or 120000), git blob id (sha1) and path."""

    mode: str
    blob: str
    path: str


def listing_text(entries: list[Entry]) -> str:
    """The canonical listing: one `mode blob path` line per file, sorted by path bytes (git's order)."""
    return "".join(f"{e.mode} {e.blob} {e.path}\n" for e in sorted(entries, key=lambda e: e.path.encode()))


def listing_sha256(entries: list[Entry]) -> str:
    """sha256 of the canonical listing (the pin's `listing_sha256`)."""
    return hashlib.sha256(listing_text(entries).encode()).hexdigest()


def blob_id(data: bytes) -> str:
    """Git's blob id of these bytes: sha1 of `blob <size>\\0` and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_git_repo(path: Path) -> bool:
    """True for a bare repository or the top of a work tree at `path` itself (not a directory inside one)."""
    def ask(*flags: str) -> list[str] | None:
        proc = subprocess.run(["git", "-C", str(path), "rev-parse", *flags], capture_output=True, text=True)
        return proc.stdout.splitlines() if proc.returncode == 0 else None

    here = Path(path).resolve()
    bare = ask("--is-bare-repository", "--absolute-git-dir")
    if bare is None:
        return False
    if bare[0] == "true":
        return Path(bare[1]).resolve() == here
    top = ask("--show-toplevel")
    return bool(top) and Path(top[0]).resolve() == here


def _git(repo: Path, *args: str, text: bool = True) -> str | bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=text)
    if proc.returncode != 0:
        err = proc.stderr if text else proc.stderr.decode(errors="replace")
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {err.strip()}")
    return proc.stdout


def git_head(repo: Path) -> str:
    """The full commit id of the repository's HEAD."""
    return str(_git(repo, "rev-parse", "--verify", "HEAD^{commit}")).strip()


def git_tree_id(repo: Path, commit: str) -> str:
    """The tree id of a commit."""
    return str(_git(repo, "rev-parse", "--verify", f"{commit}^{{tree}}")).strip()


def git_listing(repo: Path, commit: str) -> list[Entry]:
    """Every file of the commit (submodule entries are refused: no pinned peer has one)."""
    out = bytes(_git(repo, "ls-tree", "-r", "-z", "--full-tree", commit, text=False))
    entries = []
    for rec in out.split(b"\0"):
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        mode, kind, blob = meta.decode().split()
        if kind != "blob":
            raise RuntimeError(f"{repo}: {path.decode()} at {commit[:12]} is a {kind}, not a file (submodules are not "
                               f"supported)")
        entries.append(Entry(mode, blob, path.decode()))
    return entries


def missing_blobs(repo: Path, entries: list[Entry]) -> list[str]:
    """Paths whose blob the repository does not hold (a snapshot may leave its largest files out)."""
    proc = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-check"], capture_output=True, text=True,
                          input="".join(f"{e.blob}\n" for e in entries))
    if proc.returncode != 0:
        raise RuntimeError(f"git cat-file --batch-check failed in {repo}: {proc.stderr.strip()}")
    gone = {line.split()[0] for line in proc.stdout.splitlines() if line.endswith(" missing")}
    return [e.path for e in entries if e.blob in gone]


def export_commit(repo: Path, entries: list[Entry], dest: Path, skip: set[str]) -> None:
    """Write every entry but `skip` under `dest` (files with their exec bit, symlinks as links), reading all
    blobs through one `git cat-file --batch`; `dest` must not exist yet."""
    dest.mkdir(parents=True)
    todo = [e for e in entries if e.path not in skip]
    proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for e in todo:
            proc.stdin.write(f"{e.blob}\n".encode())
            proc.stdin.flush()
            header = proc.stdout.readline().decode().split()
            if len(header) != 3:
                raise RuntimeError(f"{repo}: blob {e.blob} of {e.path} is missing ({' '.join(header)})")
            data = proc.stdout.read(int(header[2]))
            proc.stdout.read(1)  # the newline after each object
            target = dest / e.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if e.mode == SYMLINK:
                os.symlink(data.decode(), target)
            else:
                target.write_bytes(data)
                if e.mode == EXEC:
                    target.chmod(0o755)
    finally:
        proc.stdin.close()
        proc.wait()


def dir_listing(root: Path, ignore: set[str] = frozenset()) -> list[Entry]:
    """The listing of a plain directory as git would record it (`.git` and the `ignore` paths left out)."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        rel_dir = Path(dirpath).relative_to(root)
        for name in list(filenames) + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            p = Path(dirpath) / name
            rel = (rel_dir / name).as_posix()
            if rel in ignore:
                continue
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                entries.append(Entry(SYMLINK, blob_id(os.readlink(p).encode()), rel))
            elif stat.S_ISREG(st.st_mode):
                mode = EXEC if st.st_mode & stat.S_IXUSR else FILE
                entries.append(Entry(mode, blob_id(p.read_bytes()), rel))
    return entries


def compare_listings(expected: list[Entry], found: list[Entry], absent_ok: set[str]) -> list[str]:
    """Differences between a pinned listing and a directory's: files that differ, are missing (unless allowed to
    be absent) or are extra; an empty list when they agree."""
    want = {e.path: e for e in expected}
    have = {e.path: e for e in found}
    diffs = []
    for path, e in want.items():
        got = have.get(path)
        if got is None:
            if path not in absent_ok:
                diffs.append(f"missing {path}")
        elif (got.mode, got.blob) != (e.mode, e.blob):
            diffs.append(f"differs {path}")
    diffs += [f"extra {p}" for p in have if p not in want]
    return sorted(diffs)
