"""Carry a built engine to another machine of the same kind: its variants' binaries and manifests, and the files of
the pinned tree that the pipeline reads (gguf-py, the chat templates), as xz parts of bounded size with an index.

Why: on the GPU machine a CUDA build of two variants takes most of a ten-minute call, and the machine is given back
30 s after a call, so a measurement call that must find the build's machine still warm often finds a bare one. A
build call packs what it built; a later call carries the parts, unpacks them and measures at once. The parts are
checked (sha256) and the variants must have been built from this checkout's engine sources (the manifest's `sources`
fingerprint), so a carried build never stands in for other engine code.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import shutil
import tarfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ostinato.atomic import atomic_open, sha256_file
from ostinato.engine.gitutil import git
from ostinato.engine.stages import (DEFAULT_TARGETS, VariantManifest, read_manifest,
                                    sources_fingerprint)

INDEX_FORMAT = 1
# the tree's files the pipeline reads with --llama-tree (gguf-py writes and reads models; the templates go into them)
TREE_PATHS = ("gguf-py", "models/templates")
# one dictionary over the whole stream: llama-server and llama-bench of a static build share their ggml code, and
# two variants share most of it, so a window as large as the input stores it about once (up to liblzma's largest,
# 1.5 GiB, about 11 GiB of encoder memory at that size); preset 1 keeps it fast
MAX_DICT = 1536 << 20


@dataclass
class PackPart:
    name: str
    bytes: int
    sha256: str


@dataclass
class PackIndex:
    """`engine-<backend>.json`: what the parts hold and how to check them."""

    backend: str
    variants: dict[str, dict[str, str]]  # variant -> {"sources", "fingerprint"} of its manifest
    parts: list[PackPart] = field(default_factory=list)
    raw_bytes: int = 0
    commit: str = ""
    packed_at: str = ""
    format: int = INDEX_FORMAT

    @staticmethod
    def load(path: Path) -> "PackIndex":
        try:
            data = json.loads(path.read_text())
            if data.get("format") != INDEX_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {INDEX_FORMAT}")
            parts = [PackPart(**p) for p in data.pop("parts")]
            return PackIndex(parts=parts, **data)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path}: not an engine pack index ({e})") from e

    def save(self, path: Path) -> Path:
        with atomic_open(path) as f:
            f.write(json.dumps(asdict(self), indent=2) + "\n")
        return path


class _PartWriter(io.RawIOBase):
    """A write-only stream cut into files of at most `limit` bytes: <prefix>.00, <prefix>.01, ..."""

    def __init__(self, prefix: Path, limit: int):
        self.prefix, self.limit, self.paths = prefix, limit, []
        self._f = None
        self._n = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view):
            if self._f is None or self._n == self.limit:
                self._next()
            k = min(len(view) - done, self.limit - self._n)
            self._f.write(view[done:done + k])
            self._n += k
            done += k
        return done

    def _next(self) -> None:
        if self._f is not None:
            self._f.close()
        path = self.prefix.with_name(f"{self.prefix.name}.{len(self.paths):02d}")
        self.paths.append(path)
        self._f, self._n = open(path, "wb"), 0

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        super().close()


class _PartReader(io.RawIOBase):
    """The parts read back as one stream."""

    def __init__(self, paths: list[Path]):
        self._paths = list(paths)
        self._f = None

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while True:
            if self._f is None:
                if not self._paths:
                    return 0
                self._f = open(self._paths.pop(0), "rb")
            n = self._f.readinto(b)
            if n:
                return n
            self._f.close()
            self._f = None

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        super().close()


def _current_variant(engine_dir: Path, variant: str, engine_src: Path) -> VariantManifest:
    """The variant's manifest, refusing a missing build, missing targets or other engine sources than engine_src's."""
    m = read_manifest(engine_dir, variant)
    if m is None:
        raise FileNotFoundError(f"{engine_dir / variant / 'manifest.json'}: no build of the {variant} variant to pack "
                                f"(run `ostinato engine build` first)")
    missing = [t for t in m.targets if not (engine_dir / variant / "bin" / t).is_file()]
    if missing:
        raise FileNotFoundError(f"{engine_dir / variant / 'bin'}: missing {', '.join(missing)} of the manifest's "
                                f"targets")
    here = sources_fingerprint(engine_src, variant)
    if m.sources != here:
        raise ValueError(f"{engine_dir / variant}: built from other engine sources than this checkout's "
                         f"(manifest sources {m.sources[:12] or 'unrecorded'}, engine/ {here[:12]}); rebuild first")
    return m


def _members(engine_dir: Path, manifests: dict[str, VariantManifest],
             op_tests: bool) -> tuple[list[tuple[Path, str]], dict[str, str]]:
    """The files to pack, and each variant's manifest as packed: its targets only those packed (the fingerprint is
    the same with or without the op tests, so the unpacked build is current for the pipeline either way)."""
    files, texts = [], {}
    for v, m in manifests.items():
        targets = [t for t in m.targets if op_tests or t in DEFAULT_TARGETS]
        files += [(engine_dir / v / "bin" / t, f"{v}/bin/{t}") for t in targets]
        texts[f"{v}/manifest.json"] = json.dumps({**asdict(m), "targets": targets}, indent=2) + "\n"
    files += [(engine_dir / "tree" / p, f"tree/{p}") for p in TREE_PATHS if (engine_dir / "tree" / p).is_dir()]
    return files, texts


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _check_part_size(part_bytes: int) -> None:
    if part_bytes < 1 << 20:
        raise ValueError(f"part size of {part_bytes} bytes: expected at least 1 MiB (--part-size)")


def _write_parts(dest: Path, backend: str, part_bytes: int, fill) -> list[PackPart]:
    """dest's `engine-<backend>.tar.xz.NN` parts of at most part_bytes, written by fill(stream), after removing the
    folder's old parts and index (an interrupted write then leaves no index naming parts it did not finish)."""
    dest.mkdir(parents=True, exist_ok=True)
    prefix = dest / f"engine-{backend}.tar.xz"
    for old in [*dest.glob(f"{prefix.name}.*"), dest / f"engine-{backend}.json"]:
        old.unlink(missing_ok=True)
    writer = _PartWriter(prefix, part_bytes)
    with writer:
        fill(writer)
    return [PackPart(p.name, p.stat().st_size, sha256_file(p)) for p in writer.paths]


def pack_build(engine_dir: Path, variants: tuple[str, ...], dest: Path, repo: Path,
               part_bytes: int = 15 << 20, op_tests: bool = False) -> tuple[Path, PackIndex]:
    """Pack the variants built under engine_dir (e.g. build/engine/cuda) into dest as
    `engine-<backend>.tar.xz.NN` parts and the index `engine-<backend>.json`; return the index's path and it.
    The op tests go in only with op_tests (the pipeline runs llama-server and llama-bench alone)."""
    _check_part_size(part_bytes)
    engine_dir = Path(engine_dir)
    built = {v: _current_variant(engine_dir, v, Path(repo) / "engine") for v in variants}
    backends = {m.backend for m in built.values()}
    if len(backends) != 1:
        raise ValueError(f"{engine_dir}: variants of more than one backend ({', '.join(sorted(backends))})")
    backend = backends.pop()
    metas = {v: {"sources": m.sources, "fingerprint": m.fingerprint} for v, m in built.items()}
    members, manifests = _members(engine_dir, built, op_tests)
    raw = sum(_size(p) for p, _ in members)
    filters = [{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": 1,
                                          "dict_size": max(1 << 20, min(MAX_DICT, raw))}]

    def fill(writer) -> None:
        with lzma.LZMAFile(writer, "w", format=lzma.FORMAT_XZ, filters=filters) as xz, \
                tarfile.open(fileobj=xz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for arc, text in manifests.items():
                info = tarfile.TarInfo(arc)
                info.size, info.mtime, info.mode = len(text.encode()), int(time.time()), 0o644
                tar.addfile(info, io.BytesIO(text.encode()))
            for path, arc in members:
                tar.add(path, arcname=arc)

    index = PackIndex(backend=backend, variants=metas, raw_bytes=raw,
                      commit=git(Path(repo), "rev-parse", "HEAD", check=False).strip(),
                      packed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      parts=_write_parts(dest, backend, part_bytes, fill))
    return index.save(dest / f"engine-{backend}.json"), index


def find_index(*srcs: Path) -> Path:
    """The one `engine-*.json` in the folders srcs (a file among them is taken as the index itself)."""
    srcs = tuple(Path(s) for s in srcs)
    found = [p for s in srcs for p in ([s] if s.is_file() else sorted(s.glob("engine-*.json")))]
    if len(found) != 1:
        raise FileNotFoundError(f"{', '.join(map(str, srcs))}: expected one engine pack index engine-<backend>.json, "
                                f"found {len(found) or 'none'} (make it with `ostinato engine pack-build`)")
    return found[0]


def _checked_parts(index_path: Path, index: PackIndex, dirs: list[Path]) -> list[Path]:
    """The index's parts in order, each from the first of dirs that holds it, refusing a missing or broken one."""
    parts = []
    for p in index.parts:
        path = next((d / p.name for d in dirs if (d / p.name).is_file()), dirs[0] / p.name)
        if not path.is_file():
            where = ", ".join(str(d) for d in dirs)
            raise FileNotFoundError(f"{path}: part of {index_path.name} missing (looked in {where})")
        if path.stat().st_size != p.bytes or sha256_file(path) != p.sha256:
            raise ValueError(f"{path}: size or sha256 differs from {index_path.name}'s (a broken copy)")
        parts.append(path)
    return parts


def repart_pack(srcs: list[Path], dest: Path, part_bytes: int) -> tuple[Path, PackIndex]:
    """Cut a pack again into parts of at most part_bytes in dest, with its index (the same build, commit and time
    of packing; the parts' names and checksums new); the index is found in one of srcs, its parts in any of them.
    Why: what a device call carries is bounded (64 MiB with the tracked files), so the part size decides how many
    calls a pack takes; an existing pack is cut to fit them without the GPU machine that built it."""
    _check_part_size(part_bytes)
    srcs = [Path(s) for s in srcs]
    index_path = find_index(*srcs)
    index = PackIndex.load(index_path)
    dest = Path(dest)
    if any(dest.resolve() == s.resolve() for s in srcs):
        raise ValueError(f"--out {dest}: must not be one of the folders the pack is read from")
    parts = _checked_parts(index_path, index, srcs)

    def fill(writer) -> None:
        with _PartReader(parts) as reader:
            shutil.copyfileobj(reader, writer, 1 << 20)

    new = replace(index, parts=_write_parts(dest, index.backend, part_bytes, fill))
    return new.save(dest / index_path.name), new


def is_unpacked(index: PackIndex, engine_root: Path) -> bool:
    """The pack's variants are already under engine_root/<backend>/ (same fingerprints and sources, every target)."""
    out = Path(engine_root) / index.backend
    for v, meta in index.variants.items():
        m = read_manifest(out, v)
        if (m is None or (m.fingerprint, m.sources) != (meta["fingerprint"], meta["sources"])
                or not all((out / v / "bin" / t).is_file() for t in m.targets)):
            return False
    return True


def unpack_build(src: Path, engine_root: Path, repo: Path) -> tuple[PackIndex, bool]:
    """Unpack a pack into engine_root/<backend>/ (its variants replaced whole; the tree's files only where no full
    tree is there), after checking every part and that each variant was built from this checkout's engine sources;
    return the index and whether anything was unpacked. Every unpacked file gets the current time, so that snakemake
    (mtime triggers) takes the build as newer than the checkout's engine inputs, which the fingerprint check has just
    shown it was built from. A build already there (a later call on the same machine) is left as it is, so that what
    snakemake made from it stays up to date."""
    index_path = find_index(src)
    index = PackIndex.load(index_path)
    parts = _checked_parts(index_path, index, [index_path.parent])
    for v, meta in index.variants.items():
        here = sources_fingerprint(Path(repo) / "engine", v)
        if meta["sources"] != here:
            raise ValueError(f"{index_path}: its {v} build was made from other engine sources than this checkout's "
                             f"(sources {meta['sources'][:12]}, engine/ {here[:12]}, packed from commit "
                             f"{index.commit[:12] or 'unknown'}); build the engine instead")
    if is_unpacked(index, engine_root):
        return index, False
    out = Path(engine_root) / index.backend
    tmp = out.with_name(out.name + ".unpack.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    with _PartReader(parts) as raw, lzma.LZMAFile(raw) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
        tar.extractall(tmp, filter="data")
    now = time.time()
    for p in tmp.rglob("*"):
        os.utime(p, (now, now), follow_symlinks=False)
    for v in index.variants:
        _replace(tmp / v, out / v)
    tree = out / "tree"
    if not (tree / ".git").exists() and (tmp / "tree").is_dir():
        _replace(tmp / "tree", tree)
    shutil.rmtree(tmp)
    return index, True


def _replace(new: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    old = dest.with_name(dest.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if dest.exists():
        dest.rename(old)
    new.rename(dest)
    if old.exists():
        shutil.rmtree(old)
