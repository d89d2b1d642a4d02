"""Debian's headless chromium, driven by Playwright, on pages served from this machine.

One way to open a local page, read its state off the loaded document and keep every URL the
browser asked for, shared by the browser tests (tests/browser_page.py) and the screenshot
script (fedinit/scripts/screenshots.py), so what the tests check is what the pictures show.
Playwright
(pyproject's dev extras) is imported only when a page is opened; no browser is downloaded:
the system's chromium is used.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
"""No sandbox (containers, root) and none of chromium's own calls home."""
CONTENT_HEIGHT = "() => Math.ceil(document.body.getBoundingClientRect().bottom) + 16"
"""Where the page's content ends (its body's bottom and a margin), in CSS pixels."""
LOCAL_HOST = "127.0.0.1"
LOCAL_SCHEMES = ("data", "blob", "about")
"""URLs that never leave the browser (an inline image, a worker's blob)."""


class BrowserError(RuntimeError):
    """No browser to drive: chromium or Playwright is missing."""


def chromium_path() -> str:
    """The system chromium, or a one-line error saying how to install it."""
    if not Path(CHROMIUM).exists():
        raise BrowserError(f"{CHROMIUM} is missing: apt-get install chromium (as root)")
    return CHROMIUM


def off_host(urls: list[str], host: str = LOCAL_HOST) -> list[str]:
    """The URLs that went to any host but ``host`` (data:, blob: and about: stay local)."""
    return [
        u for u in urls if urlsplit(u).scheme not in LOCAL_SCHEMES and urlsplit(u).hostname != host
    ]


@dataclass
class LocalPage:
    """A chromium tab and every URL it requested so far."""

    page: Page
    reloading: type[Exception]
    """Playwright's error when an evaluation meets a navigation (the meta refresh)."""
    requests: list[str] = field(default_factory=list)

    def looks(
        self,
        script: str,
        timeout: float,
        every: float = 0.25,
        before: Callable[[], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Each look ``script`` (a JS function returning ``{loaded: bool, ...}``) takes at one
        loaded document, one every ``every`` seconds, until ``timeout`` seconds passed (the
        caller breaks when it saw enough). ``before`` runs before each evaluation: what the
        caller reads from files there is never newer than the look that follows."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if before is not None:
                before()
            try:  # one look at one document: a reload in between cannot mix two
                look = self.page.evaluate(script)
            except self.reloading:  # the page is being reloaded (meta refresh)
                continue
            if not look.get("loaded"):
                self.page.wait_for_timeout(100)
                continue
            yield look
            self.page.wait_for_timeout(every * 1000)

    def off_host(self) -> list[str]:
        return off_host(self.requests)

    def shoot(self, path: Path) -> None:
        """A PNG of the page down to its last line: the whole page when it is longer than
        the window, not padded to the window's height when it is shorter."""
        width = (self.page.viewport_size or {"width": 1400})["width"]
        height = self.page.evaluate(CONTENT_HEIGHT)
        self.page.screenshot(
            path=str(path), full_page=True, clip={"x": 0, "y": 0, "width": width, "height": height}
        )


@contextmanager
def open_browser(width: int = 1500, height: int = 900) -> Iterator[LocalPage]:
    """A headless chromium tab (closed afterwards) that records every request it makes."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError as err:
        raise BrowserError(
            "playwright is missing: pip install playwright (pyproject's dev "
            "extras; no browser download: the system chromium is used)"
        ) from err
    exe = chromium_path()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            tab = LocalPage(page, Error)
            page.on("request", lambda r: tab.requests.append(r.url))
            yield tab
        finally:
            browser.close()
