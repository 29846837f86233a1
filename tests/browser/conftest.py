"""Browser tests in real Chromium: Debian's `chromium` and `chromium-driver` (installed by
`make test`), driven headless by Selenium. Every driver the tests start is quit."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def _driver() -> webdriver.Chrome:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip("needs Debian's chromium and chromium-driver (make test installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--password-store=basic",
        "--lang=en-US",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture
def chromium() -> Iterator[webdriver.Chrome]:
    """A headless Chromium under Selenium, quit at the end of the test."""
    driver = _driver()
    try:
        yield driver
    finally:
        driver.quit()
