"""The chat page of hubrt serve in headless Chromium (Debian's chromium and
chromium-driver, through selenium): a question typed and sent, the answer
streams into the page and equals the API's answer to the same
conversation; a second question continues the conversation. The page's
screenshot is kept in build/test-artifacts/."""
import os
import shutil
from pathlib import Path

import pytest

from hubrt_cli_util import make_tiny_fixtures
from serve_util import Server

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "fixtures" / "tiny-qwen3-tok"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

webdriver = pytest.importorskip("selenium.webdriver")
if not Path(CHROMEDRIVER).exists():  # make test-deps installs it; a bare pytest run may lack it
    pytest.skip("chromium-driver is not installed (make test-deps installs it)", allow_module_level=True)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def tiny_fixtures():
    make_tiny_fixtures()


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=900,700"):
        opts.add_argument(arg)
    from selenium.webdriver.chrome.service import Service
    # not the sanitizer runtimes the ASan run preloads into Python
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER, env=env), options=opts)
    yield drv
    drv.quit()


def ask(browser, text, turn):
    box = browser.find_element(By.ID, "input")
    box.send_keys(text)
    browser.find_element(By.ID, "send").click()
    done = WebDriverWait(browser, 120).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, f"#answer-{turn}.done"))
    return done[0].text


def test_page_streams_an_answer(browser):
    with Server(MODEL, "--slots", 2, "--ctx", 256) as s:
        browser.get(s.url + "/")
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "title").text == str(MODEL))
        browser.find_element(By.ID, "max").send_keys("12")
        q1, q2 = "What is the sea?", "And a river?"
        a1 = ask(browser, q1, 1)
        conv = [{"role": "user", "content": q1}]
        want1 = s.post("/v1/chat/completions", {"messages": conv, "max_tokens": 12}).json()["choices"][0]["message"]["content"]
        assert a1 == want1.strip() and a1
        a2 = ask(browser, q2, 3)
        conv += [{"role": "assistant", "content": want1}, {"role": "user", "content": q2}]
        want2 = s.post("/v1/chat/completions", {"messages": conv, "max_tokens": 12}).json()["choices"][0]["message"]["content"]
        assert a2 == want2.strip()
        stats = browser.find_elements(By.CSS_SELECTOR, ".stats")
        assert "tok/s" in stats[0].text and "tokens" in stats[0].text
        out = ROOT / "build" / "test-artifacts"
        out.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(out / "serve_page.png"))
