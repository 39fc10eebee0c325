"""Import the `gguf` package of a pinned llama.cpp tree (its gguf-py knows `deepseek4`; PyPI's does not)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def gguf_py_dir(tree: str | Path) -> Path:
    """Return `<tree>/gguf-py`, raising FileNotFoundError naming --llama-tree when it is not a llama.cpp tree."""
    root = Path(tree).expanduser()
    pkg = root / "gguf-py" / "gguf" / "__init__.py"
    if not pkg.is_file():
        raise FileNotFoundError(
            f"--llama-tree {str(tree)!r}: expected a llama.cpp source tree containing gguf-py/gguf/__init__.py"
        )
    return root / "gguf-py"


def load_gguf(tree: str | Path) -> ModuleType:
    """Import and return `gguf` from `<tree>/gguf-py`; refuse a different `gguf` already imported in this process."""
    base = gguf_py_dir(tree).resolve()
    init = base / "gguf" / "__init__.py"
    loaded = sys.modules.get("gguf")
    if loaded is not None:
        origin = Path(getattr(loaded, "__file__", "") or "").resolve()
        if origin == init:
            return loaded
        raise RuntimeError(
            f"a different gguf package is already imported ({origin}); expected the one of --llama-tree ({init})"
        )
    spec = importlib.util.spec_from_file_location("gguf", init, submodule_search_locations=[str(init.parent)])
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import gguf from {init}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gguf"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("gguf", None)
        raise
    return module
