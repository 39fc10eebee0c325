"""The foreign-load sampler and flag of the replay (ostinato.replay.load): arithmetic on injected samples, the flag's
threshold, results without samples (unknown, not clean), and what the real probe counts as the replay's own."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest

from ostinato.replay.load import (CLEAN, FOREIGN, FOREIGN_LOAD_THRESHOLD, UNKNOWN, LoadProbe, LoadSample,
                                  foreign_share, listening_pids, load_flag, probe_for, usage_between)
from ostinato.replay.results import session_load


def test_usage_between_takes_the_replays_own_cpu_time_from_the_machines():
    a = LoadSample(t=10.0, busy_cpu_s=100.0, own_cpu_s=5.0, loadavg_1m=0.5)
    b = LoadSample(t=12.0, busy_cpu_s=103.0, own_cpu_s=6.5, loadavg_1m=1.25)
    u = usage_between(a, b, cores=4)
    assert u == {"wall_s": 2.0, "foreign_cpu_s": 1.5, "own_cpu_s": 1.5, "cores": 4, "loadavg_1m": 1.25}
    assert foreign_share(u["foreign_cpu_s"], u["wall_s"], u["cores"]) == pytest.approx(1.5 / 8)


def test_usage_between_never_reports_negative_foreign_time():
    """Clock-tick granularity: the own time may exceed the machine's busy time by a tick on a short interval."""
    a = LoadSample(t=0.0, busy_cpu_s=50.00, own_cpu_s=1.00, loadavg_1m=0.1)
    b = LoadSample(t=0.05, busy_cpu_s=50.02, own_cpu_s=1.03, loadavg_1m=0.1)
    assert usage_between(a, b, 2)["foreign_cpu_s"] == 0.0


@pytest.mark.parametrize("share, threshold, flag", [
    (0.0, 0.1, CLEAN), (0.1, 0.1, CLEAN), (0.1001, 0.1, FOREIGN), (0.6, 0.5, FOREIGN), (0.6, 1.0, CLEAN),
    (float("nan"), 0.1, UNKNOWN), (None, 0.1, UNKNOWN),
])
def test_load_flag_threshold(share, threshold, flag):
    assert load_flag(share, threshold) == flag


def test_load_flag_refuses_a_threshold_that_is_no_share():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        load_flag(0.2, 10)


def test_foreign_share_without_an_interval_is_unknown():
    assert math.isnan(foreign_share(1.0, 0.0, 2)) and math.isnan(foreign_share(float("nan"), 1.0, 2))


def _requests(loads: list[dict | None]) -> pd.DataFrame:
    rows = []
    for turn, load in enumerate(loads):
        row = {"engine": "e", "session": "s", "turn": turn, "wall_send": 1.0 + turn}
        row.update({f"load_{k}": v for k, v in (load or {}).items()})
        rows.append(row)
    df = pd.DataFrame(rows)
    for k in ("wall_s", "foreign_cpu_s", "cores", "loadavg_1m"):
        if f"load_{k}" not in df:
            df[f"load_{k}"] = float("nan")
    return df


def test_session_load_sums_the_requests_and_flags_above_the_threshold():
    loads = [{"wall_s": 2.0, "foreign_cpu_s": 0.2, "cores": 2, "loadavg_1m": 1.0},
             {"wall_s": 3.0, "foreign_cpu_s": 1.3, "cores": 2, "loadavg_1m": 2.5}]
    got = session_load(_requests(loads))
    assert got["foreign_cpu_s"] == pytest.approx(1.5) and got["load_wall_s"] == 5.0
    assert got["foreign_cpu_share"] == pytest.approx(0.15) and got["loadavg_1m_max"] == 2.5
    assert got["load_flag"] == FOREIGN and got["load_threshold"] == FOREIGN_LOAD_THRESHOLD
    assert session_load(_requests(loads), threshold=0.2)["load_flag"] == CLEAN


def test_results_without_samples_are_unknown_not_clean():
    """Results made before the replay sampled the load (the shipped reference runs) have no load columns."""
    got = session_load(_requests([None, None]))
    assert got["load_flag"] == UNKNOWN and math.isnan(got["foreign_cpu_share"])
    # one request of the session without a sample: the session's share is not known either
    partial = _requests([{"wall_s": 2.0, "foreign_cpu_s": 0.0, "cores": 2, "loadavg_1m": 0.1}, None])
    assert session_load(partial)["load_flag"] == UNKNOWN


def test_requests_not_sent_are_left_out():
    """A request skipped after its session failed was never sent (no wall_send) and has no sample."""
    df = _requests([{"wall_s": 2.0, "foreign_cpu_s": 0.0, "cores": 2, "loadavg_1m": 0.1}, None])
    df.loc[1, "wall_send"] = float("nan")
    assert session_load(df)["load_flag"] == CLEAN


# 0.3 s of CPU time from the moment the burn starts (the interpreter's start-up is not counted: a probe that first
# looks after start-up must still see the whole 0.3 s)
_BURN = "import time\nt0 = time.process_time()\nwhile time.process_time() - t0 < 0.3: pass\n"


def test_probe_counts_the_clients_children_as_its_own():
    """A child process's CPU time (an engine the replay started) is the replay's own, not foreign: it is counted
    whatever else runs on the machine, since the child burns a fixed amount of its own CPU time."""
    probe = LoadProbe()
    before = probe.own_cpu_s()
    subprocess.run([sys.executable, "-c", _BURN], check=True)
    assert probe.own_cpu_s() - before >= 0.29  # CPU time in clock ticks
    s = probe.sample()
    assert s.busy_cpu_s > 0 and s.loadavg_1m >= 0 and probe.cores >= 1


def test_probe_counts_an_engine_reached_by_a_local_url_as_the_replays():
    """An engine started elsewhere (not the client's child) but listening on this machine is found by its port; its
    CPU time is the replay's own, while a probe that does not know it counts it as foreign."""
    code = ("import os, socket, sys, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(os.getpid(), s.getsockname()[1], flush=True)\nsys.stdin.readline()\n" + _BURN
            + "print('done', flush=True)\nsys.stdin.readline()\n")
    # started by a process that forks it and exits at once, so the engine is no child of this process
    launch = f"import os, sys\nif os.fork() == 0:\n    os.execv(sys.executable, [sys.executable, '-c', {code!r}])\n"
    shell = subprocess.Popen([sys.executable, "-c", launch], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    shell.wait(timeout=10)
    pid, port = map(int, shell.stdout.readline().split())
    try:
        url = f"http://127.0.0.1:{port}"
        assert listening_pids(url) == [pid]

        class Remote:  # what the probe sees of an ExternalServer: an address, no process of its own
            base_url = url

        probe, alone = probe_for(Remote()), LoadProbe()
        b, b_alone = probe.own_cpu_s(), alone.own_cpu_s()
        shell.stdin.write("go\n")
        shell.stdin.flush()
        assert shell.stdout.readline().strip() == "done"
        assert probe.own_cpu_s() - b >= 0.29
        assert alone.own_cpu_s() - b_alone < 0.3
    finally:
        shell.stdin.close()  # the engine reads end of file and exits
        deadline = time.monotonic() + 10
        while listening_pids(f"http://127.0.0.1:{port}") and time.monotonic() < deadline:
            time.sleep(0.05)


def test_no_engine_is_looked_up_on_another_host():
    assert listening_pids("http://192.0.2.1:8080") == [] and listening_pids(f"http://{socket.gethostname()}x:1") == []
