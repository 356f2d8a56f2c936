"""`trinity studio` in a real browser: headless Chromium (system package) driven by Selenium
builds a GRPO config from scratch, sees a bad value flagged, saves, and loads it back."""

from __future__ import annotations

import os
import shutil
import socket
import threading

import pytest
import uvicorn

from trinity.common.config import load_config
from trinity.preflight.before_start import check_before_start
from trinity.studio.app import create_app

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs chromium and chromedriver (.ci/run installs them)",
)
# Set to a path to keep a screenshot of the finished page (docs/results/studio.png).
SCREENSHOT = os.environ.get("TRINITY_STUDIO_SCREENSHOT")


@pytest.fixture
def studio_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        thread.join(0.05)
    yield f"http://127.0.0.1:{port}/"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1500,1100",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _open(driver, section: str) -> None:
    block = driver.find_element(By.CSS_SELECTOR, f'details[data-section="{section}"]')
    if block.get_attribute("open") is None:
        block.find_element(By.TAG_NAME, "summary").click()


def _type(driver, path: str, text: str) -> None:
    # A section renders its fields on the `toggle` event, which fires after the click returns.
    field = WebDriverWait(driver, 30).until(lambda d: d.find_element(By.NAME, path))
    field.clear()
    field.send_keys(text)


def _problems(driver) -> str:
    return driver.find_element(By.ID, "problems").text


def test_build_a_grpo_config_from_scratch_save_and_load(
    studio_url, browser, micro_model, arithmetic_data, tmp_path
):
    wait = WebDriverWait(browser, 60)
    browser.get(studio_url)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'details[data-section="model"]'))
    # the first paint shows the defaults' check, which came with the form: no "checking..."
    assert "model.model_path is required" in _problems(browser)
    # a value the schema names but this build cannot run is shown, and cannot be picked
    _open(browser, "trainer")
    option = 'select[name="trainer.trainer_strategy"] option[value=\'"megatron"\']'
    megatron = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, option))
    assert megatron.text == "megatron (not supported yet)" and not megatron.is_enabled()
    _type(browser, "checkpoint_root_dir", str(tmp_path / "checkpoints"))
    _open(browser, "model")
    _type(browser, "model.model_path", micro_model)
    _type(browser, "model.max_prompt_tokens", "32")
    _type(browser, "model.max_response_tokens", "8")
    _open(browser, "algorithm")
    _type(browser, "algorithm.algorithm_type", "grpo")
    _type(browser, "algorithm.repeat_times", "4")
    _open(browser, "buffer")
    _type(browser, "buffer.total_steps", "2")
    _type(browser, "buffer.batch_size", "0")  # a bad value: flagged, with the key named
    wait.until(lambda d: "buffer.batch_size" in _problems(d))
    row = browser.find_element(By.CSS_SELECTOR, '[data-field="buffer.batch_size"]')
    assert "bad" in row.get_attribute("class").split()
    _type(browser, "buffer.batch_size", "8")

    _open(browser, "buffer.explorer_input")
    _type(browser, "buffer.explorer_input.default_workflow_type", "math_workflow")
    _open(browser, "buffer.explorer_input.tasksets")
    browser.find_element(By.CSS_SELECTOR, '[data-add="buffer.explorer_input.tasksets"]').click()
    taskset = "buffer.explorer_input.tasksets.0"
    # storage_type takes any registered storage: the ones that run here are suggested
    kinds = browser.find_elements(
        By.CSS_SELECTOR, f'datalist[id="runs-{taskset}.storage_type"] option'
    )
    assert sorted(k.get_attribute("value") for k in kinds) == ["file", "reasoning_gym", "sql"]
    _type(browser, f"{taskset}.name", "arithmetic")
    _type(browser, f"{taskset}.path", arithmetic_data["rl"])
    _type(browser, f"{taskset}.split", "train")
    _open(browser, f"{taskset}.format")
    _type(browser, f"{taskset}.format.prompt_key", "question")
    _type(browser, f"{taskset}.format.response_key", "answer")

    wait.until(lambda d: _problems(d).startswith("No problems"))
    assert "bad" not in row.get_attribute("class").split()
    derived = browser.find_element(By.ID, "derived").text
    assert "buffer.train_batch_size = 32" in derived  # batch_size 8 x repeat_times 4
    assert "model.max_model_len = 40" in derived

    saved = tmp_path / "grpo.yaml"
    _type(browser, "file", str(saved))
    browser.find_element(By.ID, "save").click()
    wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("saved"))
    if SCREENSHOT:
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(SCREENSHOT)
    config = load_config(str(saved))
    assert (config.algorithm.algorithm_type, config.buffer.batch_size) == ("grpo", 8)
    [stage] = check_before_start(config)
    assert stage.buffer.train_batch_size == 32

    browser.get(studio_url)  # a fresh page loads the saved file back into the form
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'details[data-section="model"]'))
    _type(browser, "file", str(saved))
    browser.find_element(By.ID, "load").click()
    wait.until(lambda d: d.find_element(By.NAME, "model.model_path").get_attribute("value"))
    assert browser.find_element(By.NAME, "buffer.batch_size").get_attribute("value") == "8"
    wait.until(lambda d: _problems(d).startswith("No problems"))
