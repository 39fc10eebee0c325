"""The error of a malformed input file, shared by every reader so the CLI reports all of them the same way."""

from __future__ import annotations


class InputError(ValueError):
    """A file that does not have its format's shape: the message names the file (and its line, key, session or
    position) and what was expected. A ValueError, so `ostinato` reports it as `ostinato: error: ...` with exit 2."""
