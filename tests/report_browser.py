"""Open a Snakemake report in a headless Chromium and read back what the page shows.

`probe(page)` copies the page, appends a script that waits for the report's app to render, loads the data of every
image result of the report (its `results` variable), shows each in the app's own image view (an `<img>`), and
checks that every `<img>` of the page loaded (an image whose data does not decode fires `error`); the script writes what it found into a `<pre>` that Chromium's
`--dump-dom` returns. A page whose image data does not decode reports `ok: false` for it.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

PROBE = r"""
<script id="ostinato-probe-script">
(async () => {
  const out = {verdict_rows: 0, images: [], shown: [], broken_img: [], errors: []};
  const wait = (ms) => new Promise((r) => setTimeout(r, ms));
  // an image's load or error event (its fetch holds Chromium's virtual time, so the budget waits for it)
  const loaded = (img) => new Promise((resolve) => {
    const ok = () => resolve(img.naturalWidth > 0 && img.naturalHeight > 0);
    if (img.complete) return ok();
    img.addEventListener("load", ok, {once: true});
    img.addEventListener("error", () => resolve(false), {once: true});
  });
  try {
    for (let i = 0; i < 100 && !document.querySelector("#app nav"); i++) await wait(100);
    out.verdict_rows = document.querySelectorAll("table.ostinato-verdict tr.claim").length;
    const entries = typeof results === "undefined" ? [] : Object.entries(results);
    for (const [path, entry] of entries) {
      if (!String(entry.mime_type).startsWith("image/")) continue;
      const img = new Image();
      img.src = entry.data_uri;
      const ok = await loaded(img);
      out.images.push({path: path, ok: ok, width: img.naturalWidth, height: img.naturalHeight});
      if (typeof app !== "undefined" && typeof app.setView === "function") {  // the report's own view of the result: an <img> in its content pane
        app.setView({content: "img", contentPath: entry.data_uri, resultPath: path});
        let shown = null;
        for (let i = 0; i < 50 && !shown; i++) {
          await wait(50);
          shown = Array.from(document.querySelectorAll("#app img")).find((x) => x.src === entry.data_uri);
        }
        out.shown.push({path: path, ok: shown ? await loaded(shown) : false});
      }
    }
    for (const img of Array.from(document.images)) {
      if (!(await loaded(img))) out.broken_img.push(img.src.slice(0, 80));
    }
  } catch (e) {
    out.errors.push(String(e));
  }
  const pre = document.createElement("pre");
  pre.id = "ostinato-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


@dataclass(frozen=True)
class Probe:
    """What the page showed: rows of the verdict table, every image result decoded and shown, broken images."""

    verdict_rows: int
    images: list[dict]
    shown: list[dict]
    broken_img: list[str]
    errors: list[str]

    @property
    def images_ok(self) -> bool:
        return bool(self.images) and all(i["ok"] for i in self.images + self.shown) and not self.broken_img


def chromium() -> str | None:
    """Debian's chromium (or another Chromium on PATH), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def probe(page: Path, workdir: Path, budget_ms: int = 60000, timeout_s: float = 300) -> Probe:
    """Open a copy of `page` with the probe script in headless Chromium and return what it found."""
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed")
    text = page.read_text(encoding="utf-8")
    probed = workdir / f"{page.stem}.probe.html"
    head, sep, tail = text.rpartition("</body>")  # the page's own end (scripts may hold the string too)
    probed.write_text(head + PROBE + sep + tail if sep else text + PROBE, encoding="utf-8")
    for attempt in range(3):  # the page's scripts may outlast the virtual time once in a while on a loaded machine
        cmd = [exe, *FLAGS, f"--user-data-dir={workdir / f'chromium-profile-{attempt}'}",
               f"--virtual-time-budget={budget_ms * (attempt + 1)}", "--run-all-compositor-stages-before-draw",
               "--dump-dom", probed.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        m = re.search(r'<pre id="ostinato-probe">(.*?)</pre>', proc.stdout, re.S)
        if m:
            return Probe(**json.loads(html.unescape(m.group(1))))
    raise RuntimeError(f"chromium returned no probe in 3 attempts (exit {proc.returncode}): {proc.stderr[-2000:]}")


def screenshot(page: Path, workdir: Path, size: tuple[int, int] = (1400, 1000), timeout_s: float = 300) -> Path:
    """A PNG of the page as Chromium renders it after its scripts ran."""
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed")
    out = workdir / f"{page.stem}.png"
    cmd = [exe, *FLAGS, f"--user-data-dir={workdir / 'chromium-profile-shot'}", "--virtual-time-budget=20000",
           f"--window-size={size[0]},{size[1]}", f"--screenshot={out}", page.resolve().as_uri()]
    subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if not out.is_file():
        raise RuntimeError(f"chromium wrote no screenshot of {page}")
    return out
