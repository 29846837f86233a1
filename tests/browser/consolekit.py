"""What the console's browser tests share: a broker with users, rules and its management server
(the console at `/`), logging in through the page, and waiting on the page's DOM."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from management.conftest import Managed, start_managed
from server.test_auth import PASSWORDS, _write_users

# alice is in ops (everything), bob in shop (reads and writes /queue/shop.>, nothing else).
ACL: list[dict[str, Any]] = [
    {
        "destination": "/queue/shop.>",
        "read": ["ops", "shop"],
        "write": ["ops", "shop"],
        "admin": ["ops"],
    },
    {"destination": "/queue/>", "read": ["ops"], "write": ["ops"], "admin": ["ops"]},
    {"destination": "/topic/>", "read": ["ops"], "write": ["ops"], "admin": ["ops"]},
]
WAIT_S = 20.0
# Screenshots of the console for the docs, overwritten by each run.
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"


def start_console(tmp_path: Path, **overrides: Any) -> Managed:
    """A broker on the memory store with alice, bob and carol, the rules above, and no delay
    after a refused login."""
    users = tmp_path / "users.toml"
    _write_users(users)
    limits = {"login_failure_delay_s": 0, **overrides.pop("limits", {})}
    return start_managed(auth={"users_file": str(users)}, acl=ACL, limits=limits, **overrides)


def base_url(managed: Managed) -> str:
    return f"http://127.0.0.1:{managed.server.port}"


def wait_for(driver: webdriver.Chrome, check: Callable[[webdriver.Chrome], Any], what: str) -> Any:
    """Wait (on the page, polling the DOM) until `check` gives something true; return it."""

    def probe(d: webdriver.Chrome) -> Any:
        try:
            return check(d)
        except StaleElementReferenceException:
            return False  # redrawn between finding and reading: look again

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(probe, f"waiting for {what}")


def element(driver: webdriver.Chrome, css: str) -> WebElement:
    """The element `css` finds, once it is there and shown."""
    return wait_for(
        driver,
        lambda d: next(
            (e for e in d.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()), None
        ),
        css,
    )


def text_of(driver: webdriver.Chrome, css: str) -> str:
    return element(driver, css).text


def wait_text(
    driver: webdriver.Chrome, css: str, predicate: Callable[[str], bool], what: str
) -> str:
    """Wait until the text of `css` passes `predicate`; return it."""

    def check(d: webdriver.Chrome) -> str | None:
        found = d.find_elements(By.CSS_SELECTOR, css)
        text = found[0].text if found else None
        return text if text is not None and predicate(text) else None

    return wait_for(driver, check, what)


def login(
    driver: webdriver.Chrome, managed: Managed, user: str, password: str | None = None
) -> None:
    """Open the console and log in through its form."""
    driver.get(base_url(managed) + "/")
    element(driver, "#login-user").send_keys(user)
    element(driver, "#login-password").send_keys(password or PASSWORDS[user])
    element(driver, "#login-submit").click()
    wait_text(driver, "#who-user", lambda t: t == user, f"{user} logged in")


def go(driver: webdriver.Chrome, hash_path: str) -> None:
    """Show a page of the console (`#/...`) in the page already open."""
    driver.execute_script("location.hash = arguments[0]", hash_path)


def click(driver: webdriver.Chrome, css: str) -> None:
    element(driver, css).click()


def confirm(driver: webdriver.Chrome, css: str) -> None:
    """Click a button that asks for a second click."""
    button = element(driver, css)
    button.click()
    wait_for(driver, lambda d: "armed" in (button.get_attribute("class") or ""), f"{css} armed")
    button.click()


def screenshot(driver: webdriver.Chrome, name: str) -> None:
    """Save the page as docs/console/NAME.png (overwritten by each run)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """What the page logged at level SEVERE (script errors, CSP violations)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
