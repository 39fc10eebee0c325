"""llama-server lifecycle: start with a log file, wait for /health, warm up, detect crashes, stop."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ostinato.server.client import LLAMA_APIS, RequestInput, erase_slot, send_completion


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on `host` right now (bound to port 0 and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM the server when the runner dies (even by SIGKILL)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ServerError(RuntimeError):
    """The server failed to start, exited, or stopped answering."""


@dataclass
class ServerConfig:
    """How to start one llama-server: binary, model, extra args, environment, log file."""

    binary: Path
    model: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port at each start
    log_path: Path | None = None
    slot_save_path: Path | None = None  # None: a temporary directory (needed by the slot erase action)
    startup_timeout_s: float = 300.0
    single_slot: bool = True  # add `-np 1 --cache-ram 0` unless args set them: one slot, no host prompt cache
    routing_dir: Path | None = None  # --routing-dir: the only directory requests may name routing traces in

    def command(self, port: int, slot_save_path: Path) -> list[str]:
        """Return the full command line for a start on `port`."""
        cmd = [str(self.binary), "-m", str(self.model), "--host", self.host, "--port", str(port)]
        if "--slot-save-path" not in self.args:
            cmd += ["--slot-save-path", str(slot_save_path)]
        if self.routing_dir is not None and "--routing-dir" not in self.args:
            cmd += ["--routing-dir", str(Path(self.routing_dir).resolve())]
        if self.single_slot:
            if not {"-np", "--parallel"} & set(self.args):
                cmd += ["-np", "1"]
            if not {"-cram", "--cache-ram"} & set(self.args):
                cmd += ["--cache-ram", "0"]
        return cmd + list(self.args)


class LlamaServer:
    """A running llama-server subprocess; use as a context manager or call start()/stop()."""

    def __init__(self, config: ServerConfig):
        """Keep the configuration; nothing starts until `start()`."""
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.n_starts = 0
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        self._log_fh = None
        # a fresh connection per request: llama-server may drop an idle kept-alive connection
        self.client = httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0),
                                   limits=httpx.Limits(max_keepalive_connections=0))

    @property
    def base_url(self) -> str:
        """Return the server's base URL (valid after start)."""
        return f"http://{self.config.host}:{self.port}"

    def _slot_dir(self) -> Path:
        """Return the slot-save directory, creating a temporary one if none was configured."""
        if self.config.slot_save_path is not None:
            self.config.slot_save_path.mkdir(parents=True, exist_ok=True)
            return self.config.slot_save_path
        if self._tmpdir is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="ostinato-slots-")
        return Path(self._tmpdir.name)

    def start(self) -> None:
        """Start the process (log appended to the log file) and wait until /health says ok."""
        if self.is_alive():
            return
        binary = Path(self.config.binary)
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise FileNotFoundError(f"--server-bin {binary} is not an executable file (expected llama-server)")
        if not Path(self.config.model).is_file():
            raise FileNotFoundError(f"--model {self.config.model} does not exist (expected a GGUF file)")
        self.port = self.config.port or free_port(self.config.host)
        cmd = self.config.command(self.port, self._slot_dir())
        log = self.config.log_path
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            self._log_fh = open(log, "ab")
            self._log_fh.write(f"\n### ostinato: start #{self.n_starts + 1}: {' '.join(cmd)}\n".encode())
            self._log_fh.flush()
        env = {**os.environ, **self.config.env}
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self.n_starts += 1
        try:
            self.wait_healthy(self.config.startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self, timeout_s: float) -> None:
        """Poll /health until it answers ok; raise ServerError on early exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.proc.poll() if self.proc else None
            if code is not None:
                raise ServerError(f"llama-server exited with code {code} while starting; see {self.log_hint()}")
            try:
                r = self.client.get(f"{self.base_url}/health", timeout=2.0)
                if r.status_code == 200 and r.json().get("status") == "ok":
                    return
            except (httpx.TransportError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ServerError(f"llama-server not healthy after {timeout_s:.0f} s; see {self.log_hint()}")
            time.sleep(0.1)

    def log_hint(self) -> str:
        """Return where the server log is, for error messages."""
        return str(self.config.log_path) if self.config.log_path else "(no log file configured)"

    def log_tail(self, n_bytes: int = 2000) -> str:
        """Return the last bytes of the server log (for failure reasons)."""
        if self.config.log_path is None or not self.config.log_path.is_file():
            return ""
        if self._log_fh is not None:
            self._log_fh.flush()
        with open(self.config.log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - n_bytes))
            return fh.read().decode("utf-8", "replace")

    def log_has(self, text: str, timeout_s: float = 10.0, n_bytes: int = 200000) -> bool:
        """Whether `text` shows up in the log's last bytes within `timeout_s` (llama.cpp writes its log from a thread of
        its own, so a line may come a moment after the answer it explains)."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log_tail(n_bytes):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def is_alive(self) -> bool:
        """Return True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        """Return the exit code if the process has ended."""
        return None if self.proc is None else self.proc.poll()

    def healthy(self) -> bool:
        """Return True if the process runs and /health answers ok now."""
        if not self.is_alive():
            return False
        try:
            r = self.client.get(f"{self.base_url}/health", timeout=5.0)
            return r.status_code == 200
        except httpx.TransportError:
            return False

    def warmup(self, prompt_token_ids: list[int], n_predict: int = 4) -> None:
        """Send one small completion, then erase the slot so it leaves no cached prefix."""
        out = send_completion(self.client, self.base_url, RequestInput(tuple(prompt_token_ids), n_predict))
        if not out.success:
            raise ServerError(f"warm-up request failed: {out.error}")
        erase_slot(self.client, self.base_url, 0)

    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate the process, then kill it if it has not exited within `grace_s`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(grace_s)
        self.proc = None
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def restart(self) -> None:
        """Stop (if needed) and start again on a fresh port."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and release the HTTP client and temporary directory."""
        self.stop()
        self.client.close()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> "LlamaServer":
        """Start the server."""
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        """Stop the server and release resources."""
        self.close()


class ExternalServer:
    """An engine that runs elsewhere, reached by URL: the replay checks that it answers, but cannot start,
    stop or restart it (after a crash the replay waits for it to answer again, then replays the session again)."""

    def __init__(self, base_url: str, api: str = "openai", model: str = "", health_path: str | None = None,
                 startup_timeout_s: float = 60.0):
        """Keep the address; `health_path` defaults to /health (llama, llama-generate) or /v1/models (openai)."""
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"--server-url {base_url!r}: expected an http:// or https:// URL")
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.model = model
        self.health_path = health_path or ("/health" if api in LLAMA_APIS else "/v1/models")
        self.startup_timeout_s = startup_timeout_s
        self.n_starts = 0
        self.client = httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0),
                                   limits=httpx.Limits(max_keepalive_connections=0))

    def healthy(self) -> bool:
        """Return True if the health path answers 200 now."""
        try:
            return self.client.get(f"{self.base_url}{self.health_path}", timeout=5.0).status_code == 200
        except httpx.TransportError:
            return False

    def is_alive(self) -> bool:
        """An external engine counts as alive while it answers."""
        return self.healthy()

    def exit_code(self) -> int | None:
        """Unknown: the process is not ours."""
        return None

    def log_tail(self, n_bytes: int = 2000) -> str:
        """No log: the process is not ours."""
        return ""

    def start(self) -> None:
        """Wait until the engine answers (it must already be running)."""
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.healthy():
            if time.monotonic() > deadline:
                raise ServerError(f"--server-url {self.base_url}: no answer from {self.health_path} within "
                                  f"{self.startup_timeout_s:.0f} s (start the engine first)")
            time.sleep(0.5)
        self.n_starts += 1

    def restart(self) -> None:
        """It cannot be restarted from here: wait until it answers again."""
        self.start()

    def warmup(self, prompt_token_ids: list[int], n_predict: int = 4) -> None:
        """Send one small completion."""
        out = send_completion(self.client, self.base_url, RequestInput(tuple(prompt_token_ids), n_predict),
                              api=self.api, model=self.model)
        if not out.success:
            raise ServerError(f"warm-up request to {self.base_url} failed: {out.error}")

    def close(self) -> None:
        """Release the HTTP client."""
        self.client.close()
