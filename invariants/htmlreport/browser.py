"""Headless Chromium driven over the DevTools protocol through a pipe: the standard library only, no driver to install.

    with Browser() as browser:                       # chromium (or $CHROMIUM) from PATH
        page = browser.open("report.html", width=1280, height=900)
        page.click("details.card > summary")          # a real mouse click at the element's centre
        page.evaluate("document.querySelector('details.card').open")
        png = page.screenshot()
        page.problems                                 # console errors, uncaught exceptions, failed or outside requests

Chromium reads commands from file descriptor 3 and writes answers to 4 (--remote-debugging-pipe),
one JSON message each, ended by a NUL byte. Console errors, uncaught exceptions and every request
that is not the page itself or a data:/blob: URL are collected as `problems`: a self-contained
report has none.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
         "--disable-extensions", "--no-default-browser-check", "--font-render-hinting=none")
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """Chromium could not be started, stopped answering, or answered a command with an error."""


def find_chromium():
    """The Chromium executable: $CHROMIUM, else the first of NAMES on PATH; None when there is none."""
    if os.environ.get("CHROMIUM"):
        return shutil.which(os.environ["CHROMIUM"]) or (os.environ["CHROMIUM"] if Path(os.environ["CHROMIUM"]).is_file() else None)
    return next((found for found in map(shutil.which, NAMES) if found), None)


class Browser:
    def __init__(self, executable=None, *, timeout=30.0):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise BrowserError(f"no Chromium found (looked for $CHROMIUM and {', '.join(NAMES)} on PATH); on Debian: apt-get install -y chromium")
        self.timeout = timeout
        self._next_id = 0
        self._buffer = b""
        self._events = []
        self._profile = tempfile.TemporaryDirectory(prefix="htmlreport-chromium-")
        to_child, self._send_fd = os.pipe()  # chromium reads commands on its fd 3
        self._recv_fd, from_child = os.pipe()  # and writes answers on its fd 4

        def onto_3_and_4():  # in the child, before exec: high copies first, so that neither lands on the other
            a = fcntl.fcntl(to_child, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_child, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.close(a)
            os.close(b)

        args = [self.executable, *FLAGS, f"--user-data-dir={self._profile.name}", "--remote-debugging-pipe", "about:blank"]
        try:
            self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                             close_fds=False, preexec_fn=onto_3_and_4)
        finally:
            os.close(to_child)
            os.close(from_child)
        self.version = self.call("Browser.getVersion")["product"]

    # -- the protocol ------------------------------------------------------------------------------

    def _read_message(self, deadline):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"Chromium did not answer within {self.timeout:g} s")
            ready, _, _ = select.select([self._recv_fd], [], [], left)
            if ready:
                chunk = os.read(self._recv_fd, 1 << 20)
                if not chunk:
                    err = self._process.stderr.read().decode(errors="replace")[-800:] if self._process.poll() is not None else ""
                    raise BrowserError(f"Chromium closed the pipe (exit {self._process.poll()}): {err.strip()}")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, params=None, *, session=None):
        """Send one command and wait for its answer; events that arrive meanwhile are kept for `events`."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._send_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error'].get('message')} {answer['error'].get('data', '')}".strip())
                return answer.get("result", {})
            if "method" in answer:
                self._events.append(answer)

    def wait_for(self, method, *, session=None, timeout=None):
        """The first event named `method` (for `session`), waiting for it if it has not come yet."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method and (session is None or event.get("sessionId") == session):
                    return self._events.pop(i)
            self._events.append(self._read_message(deadline))

    def events(self, session):
        """The events received so far for `session` (and keeps them)."""
        return [ev for ev in self._events if ev.get("sessionId") == session]

    # -- pages -------------------------------------------------------------------------------------

    def open(self, path_or_url, *, width=1280, height=900):
        """A Page showing path_or_url at width x height CSS pixels (device scale 1), after its load event."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=session)
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                  session=session)
        url = path_or_url if "://" in str(path_or_url) else Path(path_or_url).resolve().as_uri()
        page.url = url
        started = time.perf_counter()
        self.call("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired", session=session)
        page.load_seconds = time.perf_counter() - started
        return page

    def close(self):
        if getattr(self, "_process", None) is None:
            return
        try:
            if self._process.poll() is None:
                self.call("Browser.close")
        except BrowserError:
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stderr.close()
        os.close(self._send_fd)
        os.close(self._recv_fd)
        self._process = None
        self._profile.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Page:
    def __init__(self, browser, target, session):
        self.browser, self.target, self.session = browser, target, session
        self.url = ""
        self.load_seconds = None

    def call(self, method, params=None):
        return self.browser.call(method, params, session=self.session)

    def evaluate(self, expression):
        """The value of a JavaScript expression (JSON-able), awaited when it is a promise; a page exception raises BrowserError."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression!r} raised: {details.get('exception', {}).get('description') or details.get('text')}")
        return result["result"].get("value")

    def click(self, selector):
        """Scroll the first element matching selector into view and click its centre with the mouse, as a person would."""
        box = self.evaluate(f"(() => {{ const el = document.querySelector({json.dumps(selector)}); if (!el) return null;"
                            " el.scrollIntoView({block: 'center'}); const r = el.getBoundingClientRect();"
                            " return {x: r.left + Math.min(r.width / 2, 40), y: r.top + r.height / 2}; })()")
        if box is None:
            raise BrowserError(f"no element matches {selector!r}")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": box["x"], "y": box["y"], "button": "left", "clickCount": 1})
        self.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")  # let it lay out and paint

    def screenshot(self, *, full_page=False):
        """PNG bytes of the viewport as it is scrolled now (or of the whole page)."""
        params = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            w, h = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}
        return base64.b64decode(self.call("Page.captureScreenshot", params)["data"])

    def timing(self):
        """The browser's own figures, in milliseconds from the start of navigation: DOMContentLoaded, load, first contentful paint."""
        return self.evaluate("(() => { const n = performance.getEntriesByType('navigation')[0];"
                             " const p = performance.getEntriesByName('first-contentful-paint')[0];"
                             " return {dom_content_loaded: n.domContentLoadedEventEnd, load: n.loadEventEnd,"
                             " first_contentful_paint: p ? p.startTime : null, transfer_bytes: n.decodedBodySize}; })()")

    @property
    def problems(self):
        """Console errors and warnings, uncaught exceptions, failed loads, and requests to anything but the page or data:/blob:."""
        found = []
        for event in self.browser.events(self.session):
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(f"uncaught: {details.get('exception', {}).get('description') or details.get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
                found.append(f"console.{params['type']}: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
                found.append(f"log {params['entry']['level']}: {params['entry'].get('text')} {params['entry'].get('url', '')}".strip())
            elif method == "Network.requestWillBeSent":
                url = params["request"]["url"]
                if url != self.url and not url.startswith(("data:", "blob:", "about:")):
                    found.append(f"request to {url}: a self-contained report fetches nothing")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                found.append(f"load failed: {params.get('errorText')}")
        return found


def png_size(png):
    """(width, height) from a PNG's header."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def screenshot(html_path, out_path, *, width=1280, height=900, open_first_card=False, full_page=False):
    """Render html_path in headless Chromium and write a screenshot; (problems, timing) of the page."""
    with Browser() as browser:
        page = browser.open(html_path, width=width, height=height)
        if open_first_card and page.evaluate("document.querySelector('details.card') !== null"):
            page.click("details.card > summary")
            page.evaluate("document.querySelector('details.card').scrollIntoView({block: 'start'})")
        png = page.screenshot(full_page=full_page)
        Path(out_path).write_bytes(png)
        return page.problems, page.timing()
