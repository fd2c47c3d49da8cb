"""The browser page of ``asrkit serve`` in a real browser: Debian's Chromium, headless, driven by Selenium, with a
fake microphone that plays an espeak-ng recording. The page's transcript must be what the stream API (``transcribe
--streaming``) gives for the very audio the page sent (read back from the page's own player), and an uploaded
file's (sent by POST /v1/transcribe) what ``transcribe`` gives.
Skipped, with the reason, where Chromium, its driver or Selenium is missing (tools/install/install_system_deps.sh
installs them)."""
from __future__ import annotations

import base64
import io
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import correlate, resample_poly

import asrkit
from asrkit.config import ServeConfig
from asrkit.pipeline.formats import result_to_dict
from tests.serve.live_server import serving

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
STATIC = Path(__file__).resolve().parents[2] / "asrkit" / "serve" / "static"
TOKEN = "page-test-token"
MODEL_NAME = "page-model"
SENTENCE = "The cat sat on the mat. A dog ran in the park."
WAIT = 20.0  # seconds any one thing on the page may take (a loaded 2-core machine)


def _missing() -> str:
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is not installed (tools/install/install_system_deps.sh installs chromium, chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return ""


MISSING = _missing()
pytestmark = pytest.mark.skipif(bool(MISSING), reason=MISSING or "installed")


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Path:
    """An espeak-ng recording at 44.1 kHz: Chromium's fake microphone plays a file's samples at 44.1 kHz whatever
    rate its header says (espeak-ng's 22.05 kHz would play twice as fast); the page resamples to 16 kHz."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (make test installs it)")
    root = tmp_path_factory.mktemp("page")
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(root / "espeak.wav"), SENTENCE], check=True)
    x, rate = sf.read(root / "espeak.wav", dtype="float32")
    assert rate == 22050
    sf.write(root / "speech.wav", 0.9 * resample_poly(x, 2, 1), 44100, subtype="PCM_16")
    return root / "speech.wav"


@pytest.fixture(scope="module")
def server(serve_exp):
    """The served model (``.model``, greedy search) and the page's address (``.url``); every request needs TOKEN."""
    model = asrkit.load_model(serve_exp)
    with serving(model, ServeConfig(token=TOKEN), name=MODEL_NAME) as address:
        yield SimpleNamespace(model=model, url=f"http://{address}/")


@pytest.fixture(scope="module")
def browser(speech):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={speech}",
                "--autoplay-policy=no-user-gesture-required", "--window-size=900,1000"):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


def _wait(driver, what, message: str, timeout: float = WAIT):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(what, message=message)


def _page_words(driver) -> list:
    return driver.execute_script(
        "return [...document.querySelectorAll('#transcript button.word')]"
        ".map(b => [b.textContent, parseFloat(b.dataset.start)])")


def _player_bytes(driver) -> bytes:
    """The audio the page's player holds (its blob), as the page keeps it."""
    b64 = driver.execute_async_script(
        "const done = arguments[0];"
        "fetch(document.getElementById('player').src).then(r => r.arrayBuffer()).then(buf => {"
        "  let s = ''; const u = new Uint8Array(buf);"
        "  for (let i = 0; i < u.length; i += 8192) s += String.fromCharCode(...u.subarray(i, i + 8192));"
        "  done(btoa(s)); });")
    return base64.b64decode(b64)


def _open(driver, server) -> None:
    """The page, with the server's token in its address (the page passes it on to every request), once it shows
    the model's name (from GET /v1/info)."""
    driver.get(f"{server.url}?token={TOKEN}")
    _wait(driver, lambda d: d.find_element("id", "model").text == MODEL_NAME, "the model's name never showed")


def test_the_resampler_keeps_speech_band_and_removes_what_16k_cannot_hold(browser):
    """worklet.js's Resampler at 44.1 kHz -> 16 kHz, fed in pieces of any size: a 440 Hz sine comes out as the same
    sine at 16 kHz (the analytic reference) and a 12 kHz one (above 8 kHz: it would alias to 4 kHz) is removed."""
    rate, seconds = 44100, 0.5
    t = np.arange(int(rate * seconds)) / rate
    pieces = [128, 1, 7, 3000, 128, 44100]  # sizes, cycled
    script = STATIC.joinpath("worklet.js").read_text() + """
        const [x, sizes] = arguments; const r = new AsrkitResampler(44100, 16000); const out = [];
        for (let i = 0, k = 0; i < x.length; k++) {
          const n = sizes[k % sizes.length]; out.push(...r.push(Float32Array.from(x.slice(i, i + n)))); i += n; }
        out.push(...r.flush()); return out;"""
    low = np.array(browser.execute_script(script, np.sin(2 * np.pi * 440 * t).tolist(), pieces))
    high = np.array(browser.execute_script(script, np.sin(2 * np.pi * 12000 * t).tolist(), pieces))
    n = int(16000 * seconds)
    assert len(low) == len(high) == n
    inner = slice(200, n - 200)  # the edges see the zeros before and after the signal
    ref = np.sin(2 * np.pi * 440 * np.arange(n) / 16000)
    np.testing.assert_allclose(low[inner], ref[inner], atol=1e-3)
    assert np.sqrt(np.mean(high[inner] ** 2)) < 1e-3  # > 57 dB down from the sine's 0.707


def test_microphone_partials_then_word_buttons_equal_to_the_stream_api_on_the_audio_sent(browser, server, speech):
    from selenium.webdriver.common.keys import Keys

    _open(browser, server)
    record = browser.find_element("id", "record")
    record.send_keys(Keys.SPACE)  # the keyboard works the page
    _wait(browser, lambda d: record.text == "Stop", "recording never started")
    _wait(browser, lambda d: d.find_element("id", "partial").text.strip(), "no partial text came")
    time.sleep(0.5)
    record.send_keys(Keys.SPACE)
    _wait(browser, lambda d: "Done" in d.find_element("id", "status").text, "no done message")
    assert not browser.find_element("id", "error").is_displayed(), browser.find_element("id", "error").text
    assert browser.switch_to.active_element == record  # the keyboard focus stayed on the button through it all
    shown = _page_words(browser)
    assert shown, "no words"

    # the page kept the audio it sent (its player plays it): 16 kHz mono 16-bit, speech from the fake microphone
    wav = _player_bytes(browser)
    info = sf.info(io.BytesIO(wav))
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
    recorded, _ = sf.read(io.BytesIO(wav), dtype="float32")
    source, rate = sf.read(speech, dtype="float32")
    assert rate == 44100 and len(recorded) > 16000
    # it is the source, resampled: its best match in the (looped) source correlates almost perfectly
    ref = np.tile(resample_poly(source, 160, 441), 2)
    piece = recorded[len(recorded) // 2 - 8000: len(recorded) // 2 + 8000]
    corr = correlate(ref, piece, mode="valid")
    power = np.concatenate([[0.0], np.cumsum(ref.astype(np.float64) ** 2)])
    energy = np.sqrt((power[len(piece):] - power[:-len(piece)]) * np.sum(piece ** 2))  # per window of ref
    assert np.max(corr / np.maximum(energy, 1e-9)) > 0.95

    # the transcript is what the stream API (transcribe --streaming) gives for that very audio, words and times
    stream = server.model.stream()
    stream.accept_waveform(recorded, 16000)
    result = result_to_dict(stream.finish())
    assert result["text"] and [w[0] for w in shown] == [w["word"] for w in result["words"]]
    np.testing.assert_allclose([w[1] for w in shown], [w["start"] for w in result["words"]], atol=1e-3)

    # a word (by keyboard) plays the audio from its start
    word = browser.find_elements("css selector", "#transcript button.word")[-1]
    word.send_keys(Keys.ENTER)
    _wait(browser, lambda d: d.execute_script("const p = document.getElementById('player');"
                                              "return !p.paused && p.currentTime >= arguments[0] - 0.05;",
                                              shown[-1][1]), "the word did not play")


def test_an_uploaded_file_shows_what_transcribe_gives(browser, server, speech):
    _open(browser, server)
    browser.find_element("id", "file").send_keys(str(speech))
    browser.find_element("id", "upload").click()
    _wait(browser, lambda d: "Done" in d.find_element("id", "status").text, "the upload never finished")
    expected = result_to_dict(server.model.transcribe(speech))  # what asrkit transcribe gives for the file
    shown = _page_words(browser)
    assert expected["text"] and [w[0] for w in shown] == [w["word"] for w in expected["words"]]
    np.testing.assert_allclose([w[1] for w in shown], [w["start"] for w in expected["words"]], atol=1e-3)
    assert _player_bytes(browser) == speech.read_bytes()  # the file itself plays
    assert float(browser.find_element("id", "rtf").text) > 0


def test_the_page_fits_a_phone_screen(browser, server):
    """On a 360-pixel-wide phone (emulated) nothing scrolls sideways and the buttons stay a finger's size."""
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 360, "height": 740, "deviceScaleFactor": 2, "mobile": True})
    try:
        _open(browser, server)
        inner, scroll, record_height = browser.execute_script(
            "return [window.innerWidth, document.documentElement.scrollWidth,"
            " document.getElementById('record').getBoundingClientRect().height]")
        assert inner == 360 and scroll <= inner
        assert record_height >= 40  # CSS pixels: a comfortable touch target
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
