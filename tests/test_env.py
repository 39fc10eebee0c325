"""environment.yml mirrors pyproject.toml's pins, so conda users get the same environment."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_environment_yml_has_the_same_pins():
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert sorted(p for p in pip if "==" in p) == sorted(pins)
    assert all("==" in p for p in pins), "every dependency is pinned"
