"""GET /docs in headless Chromium (Debian's chromium + chromium-driver, driven by Selenium):
the page loads from the server alone (assets from the swagger-ui-bundle package), lists the
routes of /openapi.json, and a request sent from it gets a prediction."""

from __future__ import annotations

import pytest
from browser import chromium
from conftest import TFS
from server_process import ServerProcess

M = "saved_model_half_plus_two_cpu"


@pytest.fixture(scope="module")
def browser():
    with chromium() as chrome:
        yield chrome


@pytest.fixture(scope="module")
def server():
    with ServerProcess([str(TFS / M)]) as proc:
        yield proc


def test_the_page_lists_the_routes_and_sends_a_prediction(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 60)
    browser.get(f"{server.url}/docs")
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".opblock")))
    paths = {e.get_attribute("data-path") for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    for route in ("/ping", "/invocations", f"/v1/models/{M}:predict", f"/v2/models/{M}/infer", "/openapi.json"):
        assert route in paths, f"{route} not listed; the page lists {sorted(paths)}"
    predict = browser.find_element(By.XPATH, f"//*[@data-path='/v1/models/{M}:predict']/ancestor::div[contains(@class,'opblock ')]")
    predict.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    execute = wait.until(lambda _: predict.find_element(By.CSS_SELECTOR, "button.execute"))
    execute.click()
    status = wait.until(lambda _: predict.find_element(By.CSS_SELECTOR, ".live-responses-table tbody .response-col_status"))
    body = predict.find_element(By.CSS_SELECTOR, ".live-responses-table .response-col_description pre").text
    assert status.text.strip().startswith("200"), body
    assert '"predictions"' in body
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
