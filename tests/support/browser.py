"""A real browser for pages the project writes: Debian's Chromium, headless. `rendered_dom` is the page's DOM once its
scripts ran, as a reader's browser would show it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

VIRTUAL_TIME_BUDGET_MS = 10_000  # the page's scripts run to completion within this much virtual time


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise RuntimeError("Chromium is not installed (apt-get install chromium): the HTML report tests need it")
    return found


def rendered_dom(page: Path, timeout_s: float = 120) -> str:
    result = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                             f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}", "--dump-dom", page.resolve().as_uri()],
                            capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
