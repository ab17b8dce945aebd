"""A minimal W3C WebDriver client over stdlib HTTP, for Debian's chromium-driver.

Only what the UI test needs: a session, navigate, find, click, type (a file's path
into a file picker), text, execute script.
No selenium and no browser download: it drives ``/usr/bin/chromium`` through
``/usr/bin/chromedriver`` (apt: ``chromium chromium-driver``).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from typing import Any

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


class WebDriver:
    def __init__(self, driver: str, binary: str, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.session = ""
        self.binary = binary

    def _call(self, method: str, path: str, body: Any = None, timeout: float = 30) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())["value"]

    def start(self) -> None:
        caps = {
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    # Console and security messages (CSP violations), for log().
                    "goog:loggingPrefs": {"browser": "ALL"},
                    "goog:chromeOptions": {
                        "binary": self.binary,
                        "args": [
                            "--headless=new",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--disable-dev-shm-usage",
                            "--window-size=1280,900",
                        ],
                    },
                }
            }
        }
        self.session = self._call("POST", "/session", caps, timeout=60)["sessionId"]

    def s(self, path: str) -> str:
        return f"/session/{self.session}{path}"

    def get(self, url: str) -> None:
        self._call("POST", self.s("/url"), {"url": url})

    def find(self, css: str) -> str:
        found = self._call("POST", self.s("/element"), {"using": "css selector", "value": css})
        return str(found[ELEMENT])

    def click(self, css: str) -> None:
        self._call("POST", self.s(f"/element/{self.find(css)}/click"), {})

    def send_keys(self, css: str, text: str) -> None:
        """Type ``text`` into an element (for ``<input type=file>``: a file's path)."""
        self._call("POST", self.s(f"/element/{self.find(css)}/value"), {"text": text})

    def text(self, css: str) -> str:
        return str(self._call("GET", self.s(f"/element/{self.find(css)}/text")))

    def run(self, script: str, *args: Any) -> Any:
        return self._call("POST", self.s("/execute/sync"), {"script": script, "args": list(args)})

    def log(self) -> list[dict[str, Any]]:
        """The browser's console and security messages since the last call
        (chromedriver's ``se/log``): ``{"level", "message", "source", ...}``."""
        return list(self._call("POST", self.s("/se/log"), {"type": "browser"}))

    def quit(self) -> None:
        try:
            if self.session:
                self._call("DELETE", self.s(""))
        finally:
            self.process.terminate()
            self.process.wait(10)
