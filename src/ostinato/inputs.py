"""Reading input files that may be malformed or hostile: regular files only, text that must be UTF-8, JSON as
strict as the engine's parser; every failure is an `InputError` (or FileNotFoundError) naming the file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import BinaryIO

from ostinato.errors import InputError


def open_regular(path: str | os.PathLike, what: str) -> BinaryIO:
    """Open a regular file for binary reading; a FIFO, device or directory is refused before it can block or never
    end (opened without blocking, then checked)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (expected {what})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot open {what}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path}: not a regular file (expected {what})")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | os.PathLike, what: str) -> bytes:
    """The bytes of a regular file (see `open_regular`)."""
    with open_regular(path, what) as fh:
        try:
            return fh.read()
        except OSError as exc:
            raise InputError(f"{path}: cannot read {what}: {exc.strerror}") from None


def read_text(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of a regular file (a leading byte-order mark dropped, as JSON parsers do)."""
    try:
        return read_bytes(path, what).decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}), expected {what}") from None


def _no_constant(name: str) -> float:
    """JSON has no NaN or Infinity (Python's parser accepts them, the engine's does not)."""
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str, where: str, what: str) -> object:
    """One JSON document, strictly: no NaN/Infinity, no trailing data; nesting or number size beyond the parser's
    limits is an error too. `where` names the file (and line) in the message."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg}), expected {what}") from None
    except (ValueError, RecursionError) as exc:  # a constant, an integer of over 4300 digits, deep nesting
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InputError(f"{where}: not JSON ({reason}), expected {what}") from None


def load_json(path: str | os.PathLike, what: str) -> object:
    """The JSON document of a regular file, strictly parsed; errors name the file and what it should hold."""
    return parse_json(read_text(path, what), str(path), what)
