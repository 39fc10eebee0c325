"""The GPU machine's side of scripts/peers/probe_gpu.sh (standard library only: it runs under the machine's python3).

Steps, each recorded in OUT/probe.json as it ends (command, exit code, seconds, output tail), so a probe stopped
by its deadline still leaves what it found:
  env         Python, torch, CUDA, the GPU, nvcc and the versions of the packages the peers pin
  wheels      the carried wheels against engine/peers.json (size and sha256)
  install     pip install --no-index --no-deps --target TMP/site of the carried wheels
  imports     freetoken, its compiled extensions and its server module, under the machine's torch
  rebuild     only when freetoken.kernel._pinned_tensor fails to load: rebuilt from the wheel's own source
              (kernel/csrc/pinned_tensor.cpp) against the machine's torch with torch.utils.cpp_extension
  serve       `ft serve` (python3 -m freetoken.cli serve) on the tiny qwen3moe GGUF (MXFP4, then F32), /health,
              /v1/models and one /v1/completions; the server is stopped after
  ktransformers  what KTransformers 0.7.2 would need here (its wheels are not carried): torch 2.9.1 and
              CUDA 12's libcudart.so.12 / libcublas.so.12
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TAIL = 3000


class Probe:
    """Runs the steps and keeps probe.json current."""

    def __init__(self, out: Path, deadline: float):
        self.out, self.deadline = out, deadline
        self.result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "steps": []}
        self.log = open(out / "probe.log", "a")

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self) -> None:
        tmp = self.out / "probe.json.tmp"
        tmp.write_text(json.dumps(self.result, indent=2) + "\n")
        tmp.replace(self.out / "probe.json")

    def step(self, name: str, **fields) -> dict:
        rec = {"step": name, **fields}
        self.result["steps"].append(rec)
        self.save()
        return rec

    def run(self, name: str, cmd: list[str], timeout: float, env: dict | None = None, **fields) -> dict:
        """Run a command with a timeout (never past the deadline); record and return its step."""
        timeout = max(1.0, min(timeout, self.left() - 5))
        t0 = time.time()
        self.log.write(f"\n### {name}: {' '.join(cmd)}\n")
        self.log.flush()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc = "timeout"
            out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        except OSError as exc:
            rc, out, err = "oserror", "", str(exc)
        self.log.write(out + err)
        self.log.flush()
        return self.step(name, cmd=cmd, rc=rc, seconds=round(time.time() - t0, 1), stdout_tail=out[-TAIL:],
                         stderr_tail=err[-TAIL:], **fields)


ENV_SNIPPET = r"""
import json, platform, sys
info = {"python": sys.version, "executable": sys.executable, "glibc": platform.libc_ver()}
try:
    import torch
    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
                cxx11_abi=torch.compiled_with_cxx11_abi(), torch_lib=str(__import__("pathlib").Path(torch.__file__).parent / "lib"))
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(0), capability=torch.cuda.get_device_capability(0))
except Exception as exc:
    info["torch_error"] = repr(exc)
from importlib import metadata
pkgs = {}
for n in ("torch", "torchvision", "transformers", "triton", "tokenizers", "huggingface-hub", "numpy", "safetensors",
          "einops", "msgpack", "pillow", "tqdm", "fastapi", "uvicorn", "pydantic", "pyzmq", "openai", "typing-extensions",
          "regex", "gguf", "flashinfer-python", "sgl-kernel", "nvidia-cuda-runtime", "nvidia-cublas", "cuda-toolkit"):
    try:
        pkgs[n] = metadata.version(n)
    except metadata.PackageNotFoundError:
        pkgs[n] = None
info["packages"] = pkgs
print(json.dumps(info))
"""

IMPORT_SNIPPET = r"""
import importlib, json, sys, traceback
out, mods = sys.argv[1], sys.argv[2:]
res = {}
try:
    import torch  # first, as freetoken does: its extensions resolve libtorch and libcudart from torch's libraries
except BaseException as exc:
    res["torch"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1500]}
for m in mods:
    try:
        mod = importlib.import_module(m)
        res[m] = {"ok": True, "file": getattr(mod, "__file__", None), "version": getattr(mod, "__version__", None)}
    except BaseException as exc:
        res[m] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1500],
                  "traceback_tail": traceback.format_exc()[-1200:]}
    open(out, "w").write(json.dumps(res))  # after each module: a crash in the next keeps the earlier ones
"""

REBUILD_SNIPPET = r"""
import sys, torch
from torch.utils.cpp_extension import load
site, build = sys.argv[1], sys.argv[2]
csrc = f"{site}/freetoken/kernel/csrc"
m = load(name="_pinned_tensor", sources=[f"{csrc}/pinned_tensor.cpp"], extra_include_paths=[f"{csrc}/include"],
         extra_cflags=["-O2", "-std=c++20"], with_cuda=True, build_directory=build, verbose=True)
print("built", m.__file__)
"""

FT_MODULES = ["freetoken", "tvm_ffi", "flashlib", "transformers", "fastapi", "freetoken.kernel._row_store",
              "freetoken.kernel._cpu_moe", "freetoken.kernel._pinned_tensor", "freetoken.kernel.ggml_cpu",
              "freetoken.server"]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int | str, str]:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")[:TAIL]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:TAIL]
    except Exception as exc:  # connection refused, timeout
        return type(exc).__name__, str(exc)[:500]


def probe_env(p: Probe) -> dict:
    p.run("env.nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"], 20)
    p.run("env.nvcc", ["nvcc", "--version"], 20)
    rec = p.run("env.python", [sys.executable, "-c", ENV_SNIPPET], 60)
    try:
        return json.loads(rec["stdout_tail"].strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {}


def probe_wheels(p: Probe, carry: Path) -> list[Path]:
    pins = json.loads((REPO / "engine" / "peers.json").read_text())
    rows, paths = [], []
    for w in pins["wheels"]["freetoken"]:
        path = carry / "wheels" / w["file"]
        ok = path.is_file() and path.stat().st_size == w["size"] and _sha256(path) == w["sha256"]
        rows.append({"file": w["file"], "present": path.is_file(), "sha256_ok": ok})
        if ok:
            paths.append(path)
    p.step("wheels", wheels=rows, all_ok=all(r["sha256_ok"] for r in rows))
    return paths


def probe_ktransformers(p: Probe, env: dict) -> None:
    """KTransformers' wheels are not carried (three of about 97 MiB each); record what they would meet here."""
    pins = json.loads((REPO / "engine" / "peers.json").read_text())
    libs = {}
    proc = subprocess.run(["bash", "-c", "ldconfig -p 2>/dev/null | grep -E 'libcudart.so.1[23]|libcublas.so.1[23]'"],
                          capture_output=True, text=True)
    libs["ldconfig"] = proc.stdout.strip().splitlines()
    found = []
    for root in {Path(x) for x in sys.path if x and Path(x).is_dir()}:
        for pat in ("nvidia/*/lib/libcudart.so.*", "nvidia/*/lib/libcublas.so.*", "nvidia/cu*/lib/libcudart.so.*",
                    "nvidia/cu*/lib/libcublas.so.*"):
            found += [str(x) for x in root.glob(pat)]
    libs["python_nvidia_libs"] = sorted(set(found))
    p.step("ktransformers", carried=False,
           wheels=[{k: w[k] for k in ("file", "size", "sha256")} for w in pins["wheels"]["ktransformers"]],
           needs={"torch": "==2.9.1 (kt-kernel and sglang-kt Requires-Dist)",
                  "cuda_libs": "libcudart.so.12, libcublas.so.12, libcublasLt.so.12 (sgl_kernel/sm90/common_ops.abi3.so)"},
           here={"torch": env.get("torch"), "torch_cuda": env.get("torch_cuda"), **libs})


def probe_freetoken(p: Probe, carry: Path, tmp: Path, wheels: list[Path]) -> None:
    site = tmp / "site"
    if not wheels:
        p.step("install", skipped="no carried wheel matched its pin")
        return
    rec = p.run("install", [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--no-cache-dir", "--target", str(site), *map(str, wheels)], 90)
    if rec["rc"] != 0:
        return
    env = {**os.environ, "PYTHONPATH": str(site) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    imports = _imports(p, "imports", env, FT_MODULES)
    if not imports.get("freetoken.kernel._pinned_tensor", {}).get("ok", False) and p.left() > 60:
        build = tmp / "ext"
        build.mkdir()
        rb = p.run("rebuild._pinned_tensor", [sys.executable, "-c", REBUILD_SNIPPET, str(site), str(build)],
                   min(75, p.left() - 50), env=env)
        built = sorted(build.glob("_pinned_tensor*.so"))
        if rb["rc"] == 0 and built:
            kernel = site / "freetoken" / "kernel"
            for old in kernel.glob("_pinned_tensor*.so"):
                old.rename(old.with_name(old.name + ".shipped"))
            shutil.copy2(built[0], kernel / built[0].name)
            imports.update(_imports(p, "imports.after_rebuild", env, ["freetoken.kernel._pinned_tensor",
                                                                        "freetoken.server"]))
    if not imports.get("freetoken.server", {}).get("ok", False):
        p.step("serve", skipped="freetoken.server does not import")
        return
    for model in ("tiny-qwen3moe-mxfp4.gguf", "tiny-qwen3moe-f32.gguf"):
        if p.left() < 25:
            p.step(f"serve.{model}", skipped=f"{p.left():.0f} s left of the probe's budget")
            break
        if _serve(p, carry / "models" / model, env, tmp):
            break


def _imports(p: Probe, name: str, env: dict, modules: list[str]) -> dict:
    """Import each module in one fresh interpreter (torch first); the result per module, also in the step."""
    result_file = p.out / f"{name}.tmp.json"
    rec = p.run(name, [sys.executable, "-c", IMPORT_SNIPPET, str(result_file), *modules], 90, env=env)
    try:
        res = json.loads(result_file.read_text())
    except (OSError, ValueError):
        res = {}
    result_file.unlink(missing_ok=True)
    rec["result"] = res
    p.save()
    return res


def _serve(p: Probe, model: Path, env: dict, tmp: Path) -> bool:
    """Start `ft serve` (`python3 -m freetoken.cli serve`) on `model`, ask it for completions, stop it; True if it
    answered."""
    port = _free_port()
    cmd = [sys.executable, "-m", "freetoken.cli", "serve", "--model-path", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--max-running-requests", "1", "--max-seq-len-override", "2048",
           "--memory-ratio", "0.2"]
    log_path = p.out / "freetoken_serve.log"
    t0 = time.time()
    with open(log_path, "a") as log:
        log.write(f"\n### {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True)
    rec = {"cmd": cmd, "model": model.name, "health": [], "answered": False}
    base = f"http://127.0.0.1:{port}"
    try:
        while p.left() > 12 and proc.poll() is None:
            code, body = _http(f"{base}/health", timeout=3)
            if not rec["health"] or rec["health"][-1][1:] != [code, body[:200]]:
                rec["health"].append([round(time.time() - t0, 1), code, body[:200]])
            if code == 200 and '"ok"' in body.replace(" ", ""):
                rec["models"] = _http(f"{base}/v1/models")
                name = model.name
                try:
                    name = json.loads(rec["models"][1])["data"][0]["id"]
                except (ValueError, KeyError, IndexError, TypeError):
                    pass
                rec["completion_ids"] = _http(f"{base}/v1/completions", {"model": name, "prompt": list(range(10, 40)),
                                                                         "max_tokens": 8, "temperature": 0}, 60)
                rec["completion_text"] = _http(f"{base}/v1/completions", {"model": name, "prompt": "hello world",
                                                                          "max_tokens": 8, "temperature": 0}, 60)
                rec["answered"] = rec["completion_ids"][0] == 200 or rec["completion_text"][0] == 200
                break
            time.sleep(1)
    finally:
        rec["exit_code_before_stop"] = proc.poll()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(8)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        rec["seconds"] = round(time.time() - t0, 1)
        rec["log_tail"] = log_path.read_text(errors="replace")[-TAIL:]
        p.step(f"serve.{model.name}", **rec)
    return rec["answered"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--carry", type=Path, required=True)
    ap.add_argument("--tmp", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--deadline", type=float, required=True)
    args = ap.parse_args()
    # the wrapper's `timeout` sends SIGTERM: unwind, so a started server's process group is stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    p = Probe(args.out, args.deadline)
    env = probe_env(p)
    p.result["env"] = env
    p.save()
    probe_ktransformers(p, env)
    wheels = probe_wheels(p, args.carry)
    probe_freetoken(p, args.carry, args.tmp, wheels)
    p.result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    p.result["seconds_left"] = round(p.left(), 1)
    p.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
