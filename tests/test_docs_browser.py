"""The built site in a real browser: headless Chromium loads a few pages, none logs an error, all show something.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages ending in a
NUL byte on file descriptors 3 and 4), so no Python package is needed. For each page: the console's errors
(``console.error``, an uncaught exception, a resource that failed to load: ``Runtime`` and ``Log`` events) must
be none, every image must have loaded, and a screenshot (``Page.captureScreenshot``) must not be blank: its
pixels vary. The screenshots are kept in ``docs/_build/screenshots/`` to look at.

Reads the site ``make docs`` built (``docs/_build/html``); skips, saying why, when it is not built or no
Chromium is installed (``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "docs" / "_build" / "html"
SHOTS = ROOT / "docs" / "_build" / "screenshots"
# a lesson's page with a figure: the first such in the built site (course/01_block_matrix_splits.html today)
LESSON = next((p.relative_to(SITE).as_posix() for p in sorted(SITE.glob("course/*.html")) if "<img" in p.read_text()),
              "course/(no lesson page with a figure)")
PAGES = ["index.html", "guide/tracer.html", LESSON, "reference/api/tp.html"]
BROWSER = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)),
               None)
pytestmark = [pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH (.ci/run installs Debian's chromium)"),
              pytest.mark.skipif(not (SITE / "index.html").is_file(),
                                 reason="the site is not built: make docs builds docs/_build/html")]
SETTLE_S = 1.0  # after the load event, for scripts that run late (the theme's search, its navigation)


class DevTools:
    """One headless Chromium, one tab, spoken to over the DevTools pipe."""

    def __init__(self, profile: Path):
        to_browser, self._in = os.pipe()
        self._out, from_browser = os.pipe()

        def fds():  # the browser reads commands on fd 3 and writes answers and events on fd 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]  # clear of 3 and 4
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [BROWSER, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
             "about:blank"], preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._next_id, self.events, self.session = b"", 0, [], None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._out, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium exited: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, timeout: float = 30, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._in, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, event: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == event for e in self.events):
            self.events.append(self._read(deadline))

    def drain(self, seconds: float) -> None:
        """Collect the events of the next ``seconds`` (a script's late error)."""
        self.call("Runtime.evaluate", expression=f"new Promise(r => setTimeout(r, {int(seconds * 1000)}))",
                  awaitPromise=True)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._in)
        os.close(self._out)


def errors(events: list[dict]) -> list[str]:
    """The console errors among DevTools events: console.error/assert, uncaught exceptions, failed loads."""
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            found.append("console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            found.append(f"uncaught: {details.get('exception', {}).get('description', details.get('text'))}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.append(f"{params['entry']['source']}: {params['entry']['text']} {params['entry'].get('url', '')}")
    return found


def pixel_spread(png: bytes) -> float:
    """The standard deviation of a screenshot's grey levels (0 to 1): about 0 for a blank page."""
    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3].mean(axis=-1)
    return float(pixels.std())


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    tools = DevTools(tmp_path_factory.mktemp("chromium-profile"))
    yield tools
    tools.close()


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_page_loads_without_an_error_and_shows_something(browser, page):
    path = SITE / page
    assert path.is_file(), f"{page} is not in the built site"
    browser.events.clear()
    browser.call("Page.navigate", url=path.as_uri())
    browser.wait_for("Page.loadEventFired")
    browser.drain(SETTLE_S)
    problems = errors(browser.events)
    assert not problems, f"{page}: the browser reports\n" + "\n".join(problems)
    broken = browser.call("Runtime.evaluate", returnByValue=True, expression=(
        "Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"))
    assert broken["result"]["value"] == [], f"{page}: images that did not load: {broken['result']['value']}"
    png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / (page.replace("/", "_").removesuffix(".html") + ".png")).write_bytes(png)
    spread = pixel_spread(png)
    assert spread > 0.05, f"{page}: the screenshot is nearly blank (grey-level spread {spread:.3f})"
