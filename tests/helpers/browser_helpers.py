"""Selenium helpers of the gallery's browser tests (the `browser` fixture is in conftest.py)."""

from __future__ import annotations

import json


def wait_ready(driver, state: dict | None = None, timeout: float = 60) -> dict:
    """Wait until the page has rendered (`state`, when given: that view)."""
    from selenium.webdriver.support.ui import WebDriverWait

    def ready(d):
        raw = d.execute_script("return document.body.dataset.ready || null")
        return raw and (state is None or json.loads(raw) == state) and json.loads(raw)

    return WebDriverWait(driver, timeout).until(ready)


def assert_images_load(driver) -> int:
    """Scroll every image into view (they are lazy) and wait until each has decoded pixels."""
    from selenium.webdriver.support.ui import WebDriverWait

    images = driver.find_elements("css selector", "main img")
    for img in images:
        driver.execute_script("arguments[0].scrollIntoView()", img)
        WebDriverWait(driver, 30).until(
            lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img),
            img.get_attribute("src"),
        )
    return len(images)


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
