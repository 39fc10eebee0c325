"""Which engine build a replay ran: recorded in its runs.json, compared with the build its server binary is now.

A replay resumed across machines (the H200 runs of `data/reference/h200/heldout/`, carried from one device session to
the next) may keep its finished sessions only if the engine it would run now is the one it ran then; `replay run`
refuses or restarts a partial replay whose build changed (`engine_build` is one of its setup keys), and
`same_engine` makes the same check for a finished one, `same_sessions` checks that it replayed the session file
that is there now (a GPU machine without the trace mirror builds other sets from the committed tables), and
`same_gpus` that it ran on GPUs of the kind this machine has (a device session may be lent an H100 where the last
one had an H200: timings of the two are not one run's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ostinato.atomic import sha256_file
from ostinato.errors import InputError
from ostinato.inputs import load_json


def engine_build(server_bin: Path | str | None) -> dict | None:
    """What engine build a llama-server binary belongs to, from the manifest.json that `ostinato engine build` writes
    beside its bin/ folder: variant, backend, fingerprint (code and build options) and sources (code alone; "" for
    builds from before it was recorded). None when there is none (another build, an engine reached by URL)."""
    if server_bin is None:
        return None
    manifest = Path(server_bin).resolve().parent.parent / "manifest.json"
    if not manifest.is_file():
        return None
    info = load_json(manifest, "the engine build's manifest")
    if not isinstance(info, dict):
        return None
    return {k: info.get(k, "") for k in ("variant", "backend", "fingerprint", "sources")}


@dataclass(frozen=True)
class ReplayMatch:
    """Whether a finished replay still holds here (its engine build, its sessions), and why (or why not)."""

    same: bool
    why: str


def parse_legacy_sources(items: list[str]) -> dict[str, str]:
    """`VARIANT=SHA256` pairs of --legacy-sources as a dict."""
    out: dict[str, str] = {}
    for item in items:
        variant, sep, sha = item.partition("=")
        if not sep or not variant or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise ValueError(f"--legacy-sources {item!r}: expected VARIANT=SHA256 (64 lowercase hex digits)")
        out[variant] = sha
    return out


def parse_presets(items: list[str]) -> dict[str, str]:
    """`ENGINE=PRESET` pairs of --presets as a dict."""
    out: dict[str, str] = {}
    for item in items:
        engine, sep, name = item.partition("=")
        if not sep or not engine or not name:
            raise ValueError(f"--presets {item!r}: expected ENGINE=PRESET (a replay's engine name and its preset now)")
        out[engine] = name
    return out


def same_preset(replay_dir: Path, presets: dict[str, str]) -> ReplayMatch:
    """Compare the preset a replay ran (its last run's engine_preset) with the one its engine name has now in
    `presets` (its directory's name; an engine not listed is not compared): a config that changes an engine's
    preset keeps the name and the build, not the replay."""
    engine = Path(replay_dir).name
    if engine not in presets:
        return ReplayMatch(True, f"{replay_dir}: no preset given for {engine}")
    ran = _last_run(replay_dir).get("engine_preset")
    then = ran.get("name") if isinstance(ran, dict) else None
    if then != presets[engine]:
        return ReplayMatch(False, f"{replay_dir}: ran preset {then or '(none)'}, {engine} is now preset "
                                  f"{presets[engine]}")
    return ReplayMatch(True, f"{replay_dir}: the same preset ({then})")


def _last_run(replay_dir: Path) -> dict:
    """The last run entry of a replay's runs.json."""
    path = Path(replay_dir) / "runs.json"
    runs = load_json(path, "the replay's run history (a JSON list)")
    if not isinstance(runs, list) or not runs or not isinstance(runs[-1], dict):
        raise InputError(f"{path}: expected a non-empty JSON list of run entries")
    return runs[-1]


def same_sessions(replay_dir: Path) -> ReplayMatch:
    """Compare the session file a replay recorded (its path, relative to where it ran, and sha256) with that file now.
    """
    last = _last_run(replay_dir)
    name, sha = last.get("sessions_file"), last.get("sessions_sha256")
    if not isinstance(name, str) or not name or not isinstance(sha, str) or not sha:
        return ReplayMatch(False, f"{replay_dir}: recorded no session file and sha256")
    if not Path(name).is_file():
        return ReplayMatch(False, f"{replay_dir}: replayed {name}, which is not here")
    now = sha256_file(Path(name))
    if now != sha:
        return ReplayMatch(False, f"{replay_dir}: replayed {name} of sha256 {sha[:12]}, the file here is {now[:12]} "
                                  "(other sessions)")
    return ReplayMatch(True, f"{replay_dir}: the same sessions ({name}, {sha[:12]})")


def gpu_names(gpus: object) -> list[str]:
    """The GPU model names of a machine description's `gpus` list (machine.json, runs.json's machine_info)."""
    if not isinstance(gpus, list):
        return []
    return [str(g.get("name", "")) for g in gpus if isinstance(g, dict)]


def same_gpus(replay_dir: Path, now: list[str]) -> ReplayMatch:
    """Compare the GPU models a replay ran on (its last run's machine_info) with `now`, this machine's."""
    info = _last_run(replay_dir).get("machine_info")
    if not isinstance(info, dict):
        return ReplayMatch(False, f"{replay_dir}: recorded no machine description")
    then = gpu_names(info.get("gpus"))
    if then != now:
        return ReplayMatch(False, f"{replay_dir}: ran on {', '.join(then) or 'no GPU'}, this machine has "
                                  f"{', '.join(now) or 'no GPU'}")
    return ReplayMatch(True, f"{replay_dir}: the same GPUs ({', '.join(now) or 'none'})")


def same_engine(replay_dir: Path, legacy_sources: dict[str, str] | None = None) -> ReplayMatch:
    """Compare the engine build a replay recorded (its last run in runs.json) with the one its server binary is now.

    Both recorded: the same when the fingerprints (code and build options) are. A replay from before the build was
    recorded counts as the same only when `legacy_sources` names, for the binary's variant, the code it ran (the
    sources fingerprint of the engine commit it was built from) and the binary now has that code."""
    last = _last_run(replay_dir)
    command = last.get("server_command") or []
    binary = command[0] if command and isinstance(command[0], str) else ""
    if not binary or "://" in binary:
        return ReplayMatch(False, f"{replay_dir}: an engine reached by URL ({binary or 'no server command'}), no build "
                                  "to compare")
    now = engine_build(binary)
    if now is None:
        return ReplayMatch(False, f"{replay_dir}: no engine build manifest beside {binary}")
    rec = last.get("engine_build")
    if isinstance(rec, dict) and rec.get("fingerprint"):
        if rec["fingerprint"] == now["fingerprint"]:
            return ReplayMatch(True, f"{replay_dir}: the same build of {now['variant']} ({now['fingerprint'][:12]})")
        what = ("the same code built with other options" if rec.get("sources") and rec["sources"] == now["sources"]
                else "other engine code")
        return ReplayMatch(False, f"{replay_dir}: ran {rec.get('variant')} {rec['fingerprint'][:12]}, {binary} is now "
                                  f"{now['variant']} {now['fingerprint'][:12]} ({what})")
    legacy = (legacy_sources or {}).get(now["variant"])
    if legacy is None:
        return ReplayMatch(False, f"{replay_dir}: recorded no engine build (a replay from before it was recorded) and "
                                  f"no --legacy-sources for {now['variant']}")
    if now["sources"] and now["sources"] == legacy:
        return ReplayMatch(True, f"{replay_dir}: recorded no engine build; {binary} has the code of --legacy-sources "
                                 f"{now['variant']} ({legacy[:12]})")
    return ReplayMatch(False, f"{replay_dir}: recorded no engine build; {binary} has code "
                              f"{now['sources'][:12] or '(not recorded)'}, not that of --legacy-sources "
                              f"{now['variant']} ({legacy[:12]})")
