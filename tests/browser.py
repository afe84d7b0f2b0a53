"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol: open a page, time it, list its network
requests and console errors, query the DOM, take a screenshot. No Playwright (its browser download is not possible
here): a websocket to the browser's own debugging port."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


def chromium_or_skip() -> str:
    """The chromium binary; in CI (CI set) its absence fails the test, locally it skips with the reason."""
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        message = "needs Debian's chromium (apt-get install -y chromium; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@dataclass
class PageLoad:
    """What opening one page showed: seconds to the load event, requests other than the page itself, errors."""

    seconds: float
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Browser:
    """One headless Chromium with one page, spoken to over the DevTools protocol."""

    def __init__(self, binary: str, width: int = 1280, height: int = 1000):
        self.profile = Path(tempfile.mkdtemp(prefix="trtflow-chromium-"))
        self.process = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.connection, self.next_id, self.events = contextlib.ExitStack(), 0, []
        try:
            self.socket = self.connection.enter_context(self._connect(self._page_url()))
            for domain in ("Page", "Network", "Runtime", "Log"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def _page_url(self) -> str:
        """The websocket of the page chromium opened (DevToolsActivePort names the port once it listens)."""
        import urllib.request

        port_file, deadline = self.profile / "DevToolsActivePort", time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.05)
        port = port_file.read_text().split()[0]
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")

    @staticmethod
    def _connect(url: str) -> Any:
        from websockets.sync.client import connect

        return connect(url, max_size=1 << 28, open_timeout=30)

    def call(self, method: str, **params: Any) -> dict:
        """Send one command and return its result (events arriving meanwhile are kept)."""
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def _wait_for(self, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(json.loads(self.socket.recv(timeout=max(deadline - time.monotonic(), 0.01))))

    def open(self, path: Path, timeout: float = 30) -> PageLoad:
        """Navigate to a file and wait for its load event; what it requested and every error it logged."""
        self.events = []
        url = path.resolve().as_uri()
        started = time.perf_counter()
        self.call("Page.navigate", url=url)
        self._wait_for("Page.loadEventFired", timeout)
        seconds = time.perf_counter() - started
        self.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")  # laid out and painted
        return PageLoad(seconds, _requests(self.events, url), _errors(self.events))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, destination: Path, full_page: bool = True, clip_height: int | None = None) -> Path:
        """A PNG of the page (the whole page, or its top `clip_height` pixels)."""
        height = clip_height or (self.evaluate("document.documentElement.scrollHeight") if full_page else None)
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": bool(height)}
        if height:
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": self.evaluate("document.documentElement.scrollWidth"),
                "height": height,
                "scale": 1,
            }
        destination.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))
        return destination

    def close(self) -> None:
        """Stop the browser and remove its profile."""
        try:
            self.connection.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            shutil.rmtree(self.profile, ignore_errors=True)


def _requests(events: list[dict], page: str) -> list[str]:
    """Every request the page made other than loading itself (data: URLs are inline, not network)."""
    urls = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    return [u for u in urls if u != page and not u.startswith("data:")]


def _errors(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions and browser log errors (a CSP violation is one)."""
    found = [
        json.dumps(e["params"]["exceptionDetails"])[:300]
        for e in events
        if e.get("method") == "Runtime.exceptionThrown"
    ]
    found += [
        json.dumps(e["params"]["args"])[:300]
        for e in events
        if e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert")
    ]
    found += [
        e["params"]["entry"].get("text", "")
        for e in events
        if e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error"
    ]
    return found
