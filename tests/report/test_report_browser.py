"""The generated report, opened the way a person opens it: in a real (headless) browser.

Allure 3's report is a single-page app that fetches its data over HTTP, so it is served
from a loopback HTTP server and driven by Debian's chromium through the DevTools
protocol: open the report, click the chaos test, check its metrics (parameters), expand
its timeline attachment and check the picture actually loaded.  A screenshot is left in
reports/ for a person to look at.
"""

from __future__ import annotations

import base64
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from matplotlib.image import imread

import chaos

websocket = pytest.importorskip("websocket", reason="websocket-client (a dependency of kubernetes) is not installed")

REPO_ROOT = Path(chaos.__file__).resolve().parents[1]
SCREENSHOT = REPO_ROOT / "reports" / "browser-test-report.png"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    # Resolve no name but the loopback address: the browser sends nothing, DNS included, off
    # this machine (Allure's own pages load Google Tag Manager; chaos.allure_site strips it).
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--window-size=1400,1000",
]
START_TIMEOUT_S = 30
PAGE_TIMEOUT_S = 30


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's chromium; installed with apt-get when missing, skipped where apt is unavailable."""
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and apt-get is unavailable: install Debian's chromium package")
    if os.geteuid() != 0:
        pytest.skip("chromium is not installed and installing it needs root: apt-get install -y chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
    return shutil.which("chromium") or pytest.fail("apt-get installed chromium but it is not on PATH")


def read_line_matching(proc: subprocess.Popen, stream, pattern: str, timeout: float, what: str) -> re.Match:
    """Read ``stream`` until a line matches ``pattern``; fail naming what was seen instead.

    Reads the raw pipe (os.read), so no line can hide in a Python buffer while select waits.
    """
    deadline = time.monotonic() + timeout
    fd = stream.fileno()
    text = ""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            if not selector.select(remaining):
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                pytest.fail(f"{what}: process {proc.pid} exited ({proc.wait()}) first; it printed:\n{text[-3000:]}")
            text += chunk.decode(errors="replace")
            for line in text.splitlines():
                if match := re.search(pattern, line):
                    return match
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last output:\n{text[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """Stop a process this test started (and its process group, for chromium's helpers) by PID."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    try:  # helpers that outlived the browser
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def served_report(allure_report, tmp_path):
    """``http://127.0.0.1:<free port>/`` serving the report, for as long as the test runs."""
    log = open(tmp_path / "http.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", str(allure_report)],
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    try:
        match = read_line_matching(proc, proc.stdout, r"port (\d+)", START_TIMEOUT_S, "the HTTP server to listen")
        yield f"http://127.0.0.1:{match.group(1)}/"
        if proc.poll() is not None:  # a fetch that failed in the browser may be this
            log.flush()
            pytest.fail(f"the report's HTTP server (pid {proc.pid}) exited ({proc.returncode}) during the test; "
                        f"its log ends:\n{(tmp_path / 'http.log').read_text()[-3000:]}")
    finally:
        stop(proc)
        log.close()


class DevTools:
    """Just enough of the Chrome DevTools protocol: commands on one page, in order."""

    def __init__(self, ws_url: str):
        self.ws = websocket.create_connection(ws_url, timeout=PAGE_TIMEOUT_S, suppress_origin=True)
        self.next_id = 0
        self.session = None
        self.urls: dict[str, str] = {}  # Network request id -> URL
        self.failed_loads: list[str] = []  # Network.loadingFailed: why a fetch failed, for failure messages

    def call(self, method: str, timeout: float = PAGE_TIMEOUT_S, **params):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while True:
            self.ws.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                reply = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                pytest.fail(f"no answer to {method} within {timeout:.0f}s")
            event, params = reply.get("method"), reply.get("params", {})
            if event == "Network.requestWillBeSent":
                self.urls[params["requestId"]] = params["request"]["url"]
            elif event == "Network.loadingFailed":
                url = self.urls.get(params["requestId"], f"request {params['requestId']}")
                self.failed_loads.append(f"{url}: {params.get('errorText')}")
            if reply.get("id") == self.next_id:  # any other event is not needed
                if "error" in reply:
                    pytest.fail(f"{method} failed: {reply['error']}")
                return reply["result"]

    def open_page(self, url: str) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
        self.call("Network.enable")  # loadingFailed names a failed fetch's network error (refused, reset, changed...)
        self.call("Page.navigate", url=url)

    def wait_for(self, condition_js: str, what: str, timeout: float = PAGE_TIMEOUT_S):
        """Resolve when ``condition_js`` (an expression) is truthy, re-checked on every DOM change or load.

        The waiting happens in the page, driven by its own mutation and load events.
        """
        script = f"""new Promise((resolve, reject) => {{
            const check = () => {{
                let value;
                try {{ value = ({condition_js}); }} catch (e) {{ value = null; }}
                if (value) {{ observer.disconnect(); clearTimeout(timer); resolve(value); }}
            }};
            const observer = new MutationObserver(check);
            observer.observe(document, {{subtree: true, childList: true, characterData: true, attributes: true}});
            document.addEventListener("load", check, true);
            const timer = setTimeout(() => {{
                observer.disconnect();
                reject(new Error("timed out: " + {json.dumps(what)} + "; page shows: "
                    + (document.body ? document.body.innerText.slice(0, 600) : "nothing")));
            }}, {int(timeout * 1000)});
            check();
        }})"""
        result = self.call("Runtime.evaluate", timeout=timeout + 5, expression=script, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result and self._network_changed():
            # Chromium cancels every fetch in flight when this machine's interfaces change (the
            # test-host tests beside this one add and remove veths and bridges); the page is
            # loaded again once, and waited on with the same condition.
            self.failed_loads.clear()
            self.call("Page.reload", ignoreCache=True)
            result = self.call("Runtime.evaluate", timeout=timeout + 5, expression=script, awaitPromise=True,
                               returnByValue=True)
        if "exceptionDetails" in result:
            failed = "; ".join(self.failed_loads) or "none"
            pytest.fail(f"waiting for {what}: {result['exceptionDetails'].get('exception', {}).get('description')}\n"
                        f"requests that failed in the browser: {failed}")
        return result["result"].get("value")

    def _network_changed(self) -> bool:
        return any(load.endswith(": net::ERR_NETWORK_CHANGED") for load in self.failed_loads)

    def click_text(self, text: str, what: str) -> None:
        """Click the innermost element showing exactly ``text`` (as a person would click the label)."""
        finder = (
            "[...document.querySelectorAll('#app *')]"
            f".find(e => e.children.length === 0 && e.textContent.trim() === {json.dumps(text)})"
        )
        self.wait_for(f"{finder} && true", what)
        self.call("Runtime.evaluate", expression=f"{finder}.click()")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


@pytest.fixture
def browser(chromium_path, tmp_path):
    """A headless chromium with a throw-away profile, driven over DevTools."""
    log = open(tmp_path / "chromium.log", "wb")
    drain = threading.Thread(target=lambda: shutil.copyfileobj(proc.stderr, log), daemon=True)
    proc = subprocess.Popen(
        [chromium_path, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        match = read_line_matching(proc, proc.stderr, r"DevTools listening on (ws://\S+)", START_TIMEOUT_S, "chromium's DevTools endpoint")
        drain.start()  # keep draining chromium's log (into chromium.log) so a full pipe never stalls it
        devtools = DevTools(match.group(1))
        yield devtools
        devtools.ws.close()
    finally:
        stop(proc)
        if drain.is_alive():
            drain.join(timeout=10)
        log.close()


def test_report_shows_chaos_test_with_metrics_and_timeline(served_report, browser, allure_results):
    browser.open_page(served_report)
    browser.wait_for("document.body.innerText.includes('test_chaos_older_checkpoint')", "the test tree")
    browser.click_text("test_chaos_recovery", "the chaos test in the tree")

    # the test case page: its metrics are Allure parameters
    page = browser.wait_for(
        "document.body.innerText.includes('time_to_recover') && document.body.innerText", "the test case's parameters"
    )
    assert re.search(r"time_to_detect\s+2\.5", page), page[:1500]
    assert re.search(r"time_to_recover\s+6\.5", page), page[:1500]

    # the timeline attachment: expand it and check the picture really loaded
    browser.click_text("timeline", "the timeline attachment")
    width, height = browser.wait_for(
        "[...document.querySelectorAll('img')].filter(i => i.complete && i.naturalWidth > 0)"
        ".map(i => [i.naturalWidth, i.naturalHeight])[0]",
        "the timeline image to load",
    )
    attached = next(allure_results.glob("*-attachment.png"))
    assert (height, width) == imread(attached).shape[:2]
    assert browser.screenshot(SCREENSHOT).stat().st_size > 10_000


def test_report_shows_recovery_metrics(served_report, browser):
    browser.open_page(served_report + "#metrics")
    page = browser.wait_for(
        "document.body.innerText.includes('raylet_kill: median time to recover') && document.body.innerText",
        "the metrics section",
    )
    assert "raylet_kill: median time to detect" in page and "6.5 s" in page, page[:1500]
