"""Headless Chromium (Debian's chromium + chromium-driver) driven through Selenium, for the tests that look
at a page as a person would: open it, take a screenshot, check every image loaded and which sections are
there. `.ci/run` installs both packages; where either is missing the tests skip and say so."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = "chromedriver"

# true when the page has finished loading and every <img> decoded (a broken one has naturalWidth 0)
_IMAGES = """return Array.from(document.images).map(
    i => ({src: i.getAttribute('src').slice(0, 80), ok: i.complete && i.naturalWidth > 0}));"""


def _find(names: tuple[str, ...]) -> str | None:
    return next((p for p in map(shutil.which, names) if p), None)


def missing_reason() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (make install: it is in the test group)"
    if _find(CHROMIUM) is None:
        return "Chromium is not installed (apt-get install chromium chromium-driver; .ci/run does it as root)"
    if _find((DRIVER,)) is None:
        return "chromedriver is not installed (apt-get install chromium-driver; .ci/run does it as root)"
    return None


@dataclass
class Browser:
    driver: Any

    def open(self, url: str, wait_s: float = 20.0) -> None:
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver.get(url)
        WebDriverWait(self.driver, wait_s).until(
            lambda d: d.execute_script("return document.readyState") == "complete"
        )

    def images(self) -> list[dict[str, Any]]:
        """Every <img> on the page: its src (cut to 80 characters) and whether it loaded."""
        return list(self.driver.execute_script(_IMAGES))

    def text(self) -> str:
        return str(self.driver.find_element("tag name", "body").text)

    def ids(self) -> set[str]:
        """The ids of the page's elements (sections are found by id)."""
        script = "return Array.from(document.querySelectorAll('[id]'), e => e.id)"
        return set(self.driver.execute_script(script))

    def screenshot(self, path: Path, full_height: bool = True) -> Path:
        """A PNG of the page; with full_height the window is first made as tall as the page."""
        if full_height:
            height = int(self.driver.execute_script("return document.documentElement.scrollHeight"))
            self.driver.set_window_size(1280, min(max(height, 800), 16000))
        self.driver.save_screenshot(str(path))
        return path


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """A headless Chromium, no network beyond what the page asks for; skips, with the reason, without one."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(_find(CHROMIUM))
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(_find((DRIVER,)))), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield Browser(driver)
    finally:
        driver.quit()
