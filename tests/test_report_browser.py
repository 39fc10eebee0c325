"""The browser probe of the report test (tests/report_browser.py) on hand-made pages: a page whose images decode
passes, one whose image data does not decode fails. Skips where Chromium is not installed (`make test` installs
Debian's chromium where it runs as root)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from report_browser import chromium, probe

PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
       "RU5ErkJggg==")
BROKEN = "data:image/png;base64,AAAAAAAAAAAAAAAA"

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed (Debian: apt-get install "
                                                          "chromium; `make test` does it as root)")


def _page(tmp_path: Path, uri: str) -> Path:
    results = {"figures/a.png": {"mime_type": "image/png", "data_uri": uri}}
    page = tmp_path / "page.html"
    page.write_text(f'<html><body><div id="app"><nav></nav></div><table class="ostinato-verdict"><tr class="claim">'
                    f'<td>A1</td></tr></table><img src="{uri}"><script>var results = {json.dumps(results)};</script>'
                    f"</body></html>")
    return page


def test_a_page_whose_images_decode(tmp_path: Path) -> None:
    found = probe(_page(tmp_path, PNG), tmp_path)
    assert found.verdict_rows == 1 and found.images == [{"path": "figures/a.png", "ok": True, "width": 1, "height": 1}]
    assert found.images_ok and not found.errors


def test_an_image_that_does_not_decode_fails(tmp_path: Path) -> None:
    found = probe(_page(tmp_path, BROKEN), tmp_path)
    assert not found.images_ok
    assert found.images[0]["ok"] is False and found.broken_img == [BROKEN[:80]]
