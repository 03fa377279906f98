"""A real headless Chromium (Debian's package: the build Playwright downloads for itself cannot
be fetched here), driven through Playwright's Python API."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser

# Without the background-networking flags Chromium dials Google's hosts at every start, and
# this machine's closed network refuses them, many at a time.
FLAGS = [
    "--no-sandbox",  # root in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    """Chromium's path, or skip with the reason (`make test` installs it where it can)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium on this machine (`apt-get install chromium`; `make test` tries)")


@contextmanager
def browser() -> Iterator[Browser]:
    path = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (`make install`)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=path, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()
