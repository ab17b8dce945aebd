"""The supervisor web UI in a real headless browser (Debian chromium + chromium-driver).

Skipped when ``/usr/bin/chromium`` or ``/usr/bin/chromedriver`` is missing, except
under ``CI=true`` (what CI services set), where that is a failure: a CI run must not
pass without testing the UI (``.ci/run`` installs both with apt when it can).
Drives the page through W3C WebDriver: servers grouped by category with
state/ready, a restart button, the log panel following a server, the try-it
panel's async flow to a result, its form built from a model's OpenAPI document (the
SDK examples SHARPEN and PATTERNS of conf/server/examples, and the built-in fake)
submitted to results shown as they are, the jobs page, and, last, that the
supervisor's Content-Security-Policy blocked nothing the page did.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image as PILImage

from .plane import API_TOKEN, ControlPlane, call, control_plane, free_port, wait_until
from .webdriver import WebDriver

pytestmark = pytest.mark.slow

#: A 1x1 PNG, base64.
ONE_PIXEL_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAF"
    "BQIAX8jx0gAAAABJRU5ErkJggg=="
)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HAVE_BROWSER = Path(CHROMIUM).exists() and Path(DRIVER).exists()
IN_CI = os.environ.get("CI", "").lower() == "true"
if not HAVE_BROWSER and not IN_CI:
    pytest.skip("needs Debian chromium + chromium-driver", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def browser_installed() -> None:
    """In CI a missing browser fails every test here (a skip would pass the run
    without testing the UI); the rest of the suite still runs."""
    if not HAVE_BROWSER:
        pytest.fail(
            f"CI=true but {CHROMIUM} or {DRIVER} is missing: the web UI's browser test "
            "cannot run (apt-get install -y chromium chromium-driver; .ci/run tries it)",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    models = ["FAKE_ASYNC", "FAKE_SYNC", "SHARPEN", "PATTERNS"]
    with control_plane(tmp_path_factory.mktemp("ui"), models) as cp:
        cp.wait_ready(["gateway", *models])
        yield cp


@pytest.fixture(scope="module")
def browser(plane: ControlPlane) -> Iterator[WebDriver]:
    wd = WebDriver(DRIVER, CHROMIUM, free_port())
    wait_until(lambda: _driver_up(wd), 30, "chromedriver")
    wd.start()
    wd.get(f"http://127.0.0.1:{plane.api_port}/#token={API_TOKEN}")
    yield wd
    wd.quit()


def _click(wd: WebDriver, css: str) -> bool:
    """Click, tolerating the table being re-rendered (every 2 s) between find and click."""
    try:
        wd.click(css)
        return True
    except OSError:  # urllib's HTTPError: stale element / not found yet
        return False


def _driver_up(wd: WebDriver) -> bool:
    try:
        wd._call("GET", "/status", timeout=2)
        return True
    except OSError:
        return False


def test_servers_grouped_with_state(browser: WebDriver) -> None:
    """The servers panel shows each model under its category, running and ready."""
    row = 'tr[data-server="FAKE_ASYNC"] td.ready'
    wait_until(lambda: browser.run(
        f"const c = document.querySelector('{row}'); return c && c.textContent;") == "yes",
        20, "FAKE_ASYNC ready in the UI")  # fmt: skip
    headings = browser.run(
        "return [...document.querySelectorAll('#servers h3')].map(h => h.textContent);"
    )
    assert "fake" in headings and "control" in headings


def test_restart_button(browser: WebDriver, plane: ControlPlane) -> None:
    """Clicking restart on FAKE_SYNC restarts that process."""
    old = plane.status()["FAKE_SYNC"]["pid"]
    wait_until(
        lambda: _click(browser, 'button[data-action="restart"][data-id="FAKE_SYNC"]'),
        10,
        "restart button",
    )
    wait_until(lambda: (s := plane.status()["FAKE_SYNC"])["ready"] and s["pid"] != old, 30,
               "FAKE_SYNC restarted")  # fmt: skip


def test_log_panel_follows(browser: WebDriver) -> None:
    """Choosing a server in the log panel shows its log, including supervisor notes."""
    browser.run("const s = document.getElementById('log-server'); s.value = 'FAKE_ASYNC';"
                "s.dispatchEvent(new Event('change'));")  # fmt: skip
    wait_until(lambda: "[supervisor] started pid" in browser.text("#logs"), 10, "log lines")


def test_try_it_async_job(browser: WebDriver) -> None:
    """Try-it submits an async job, shows live state and then the result envelope."""
    browser.run(
        "document.getElementById('try-model').value = 'FAKE_ASYNC';"
        "document.getElementById('try-model').dispatchEvent(new Event('change'));"
        "document.getElementById('try-mode').value = 'async';"
        "document.getElementById('try-params').value = arguments[0];",
        json.dumps({"delay_ms": 1500}),
    )
    browser.click("#try-submit")
    wait_until(lambda: "running" in browser.text("#try-state") or "pending" in browser.text(
        "#try-state"), 10, "live state")  # fmt: skip
    wait_until(lambda: '"success"' in browser.text("#try-json"), 20, "result envelope")


def _pick_try_model(browser: WebDriver, model: str, kind: str) -> dict[str, dict[str, Any]]:
    """Choose ``model`` in the try-it panel and wait for its form (``kind``: sdk or
    builtin); each field's control as ``{name: {tag, type, required, value, min,
    max, step, accept, multiple, options, label}}``."""
    script = (  # (re)select it until its form is there: the catalog may still be loading
        "const s = document.getElementById('try-model');"
        "if (s.value !== arguments[0]) { s.value = arguments[0];"
        " s.dispatchEvent(new Event('change')); }"
        "const f = document.getElementById('try-fields');"
        "return f.getAttribute('data-model') === arguments[0] && f.getAttribute('data-kind');"
    )
    wait_until(lambda: browser.run(script, model) == kind, 20, f"the form of {model}")
    # Pairs, not an object: chromedriver returns an object's keys sorted.
    return dict(
        browser.run(
            "const out = [];"
            "for (const l of document.querySelectorAll('#try-fields label[data-field]')) {"
            " const c = l.querySelector('[data-input]');"
            " out.push([l.dataset.field, {tag: c.tagName.toLowerCase(), type: c.type,"
            "  value: c.value, required: c.required, min: c.min, max: c.max, step: c.step,"
            "  accept: c.accept, multiple: c.multiple, checked: c.checked, label: l.textContent,"
            "  options: c.options ? [...c.options].map(o => o.textContent) : null}]); }"
            "return out;"
        )
    )


def _set_fields(browser: WebDriver, values: dict[str, str]) -> None:
    browser.run(
        "for (const [k, v] of Object.entries(arguments[0]))"
        " document.querySelector(`#try-fields [data-input='${k}']`).value = v;"
        "document.getElementById('try-params').value = '';"
        "document.getElementById('try-form').removeAttribute('data-last-job');",
        values,
    )


def _results(browser: WebDriver, where: str) -> list[dict[str, Any]]:
    """The result files shown under ``where``: name, state and the image's size."""
    return browser.run(  # type: ignore[no-any-return]
        "return [...document.querySelectorAll(arguments[0] + ' figure.result-file')].map(f => {"
        " const i = f.querySelector('img');"
        " return {name: f.dataset.file, state: f.dataset.state, src: i ? i.src.slice(0, 5) : null,"
        "  width: i ? i.naturalWidth : 0}; });",
        where,
    )


def _settled(files: list[dict[str, Any]]) -> bool:
    """Every file fetched, and every fetched image decoded (its width known)."""
    return all(f["state"] not in ("loading", "waiting") for f in files) and all(
        f["width"] for f in files if f["state"] == "loaded"
    )


def test_try_form_for_an_sdk_model_async_with_result_files(
    browser: WebDriver, tmp_path: Path
) -> None:
    """SHARPEN's form comes from its declaration (a required image picker, bounded
    numbers, a select, defaults filled in; the plain image picker hidden); a submit
    from it (multipart) runs the job with the bar following its events, and the
    sharpened picture, a stored result file, is shown (fetched with the token)."""
    fields = _pick_try_model(browser, "SHARPEN", "sdk")
    assert list(fields) == ["image", "amount", "mode", "steps"]
    image = fields["image"]
    assert (image["type"], image["accept"], image["required"]) == ("file", "image/*", True)
    amount = fields["amount"]
    assert (amount["type"], amount["min"], amount["max"], amount["value"]) == (
        "number",
        "0",
        "4",
        "1",
    )
    assert fields["steps"]["step"] == "1" and fields["steps"]["value"] == "10"
    assert fields["mode"]["options"] == ["unsharp", "laplace"] and fields["mode"]["value"] == "0"
    assert "*" in image["label"] and "*" not in amount["label"]
    assert (
        browser.run("return getComputedStyle(document.getElementById('try-image-label')).display")
        == "none"
    )
    picture = tmp_path / "cat.png"
    PILImage.new("RGB", (24, 16), (120, 60, 200)).save(picture)
    browser.send_keys("#try-fields [data-input='image']", str(picture))
    _set_fields(browser, {"steps": "4", "mode": "1"})
    browser.run("document.getElementById('try-mode').value = 'async';")
    browser.click("#try-submit")
    last_job = "return document.getElementById('try-form').getAttribute('data-last-job')"
    wait_until(lambda: browser.run(last_job), 15, "the job's 202")
    shown = wait_until(
        lambda: (r := _results(browser, "#try-output")) and _settled(r) and r,
        30,
        "the result file",
    )
    assert shown == [{"name": "output.png", "state": "loaded", "src": "blob:", "width": 24}], shown
    assert "done" in browser.text("#try-state")
    bar = browser.run(
        "const b = document.getElementById('try-progress');"
        "return [b.hidden, b.getAttribute('value'), b.getAttribute('max')];"
    )
    assert bar == [False, "4", "4"]
    assert '"url": "/api/v1/jobs/SHARPEN/' in browser.text("#try-json")


def test_try_form_for_an_sdk_model_sync_shows_the_inline_picture(
    browser: WebDriver, tmp_path: Path
) -> None:
    """A sync run of SHARPEN from the form: the picture comes back inline (base64 in
    its file description) and is shown as a data: image."""
    _pick_try_model(browser, "SHARPEN", "sdk")
    picture = tmp_path / "small.png"
    PILImage.new("RGB", (8, 12), (10, 200, 30)).save(picture)
    browser.send_keys("#try-fields [data-input='image']", str(picture))
    _set_fields(browser, {"steps": "2"})
    browser.run("document.getElementById('try-mode').value = 'sync';")
    browser.click("#try-submit")
    shown = wait_until(lambda: (r := _results(browser, "#try-output")) and r[0]["width"] and r,
                       30, "the inline picture")  # fmt: skip
    assert shown == [{"name": "output.png", "state": "loaded", "src": "data:", "width": 8}]
    assert "HTTP 200" in browser.text("#try-state")


def test_try_form_for_a_streaming_sdk_model_shows_previews_and_frames(
    browser: WebDriver,
) -> None:
    """PATTERNS (a generator emitting a preview before each frame): its previews and
    frames (output events) arrive on the job's stream, and the result's frames fill
    the grid, every one a loaded image."""
    fields = _pick_try_model(browser, "PATTERNS", "sdk")
    assert fields["palette"]["options"] == ["ember", "mono", "ocean"]
    assert not any(f["required"] for f in fields.values())
    _set_fields(browser, {"frames": "3", "width": "32", "height": "32"})
    browser.run("document.getElementById('try-mode').value = 'async';")
    browser.click("#try-submit")
    frames = wait_until(
        lambda: (r := _results(browser, "#try-output")) and len(r) == 3 and _settled(r) and r,
        30,
        "three frames",
    )
    assert [f["width"] for f in frames] == [32, 32, 32]
    previews = int(browser.run("return document.getElementById('try-preview').dataset.events || 0"))
    assert previews >= 1
    preview = wait_until(
        lambda: (r := _results(browser, "#try-preview")) and _settled(r) and r, 10, "the preview"
    )
    assert preview and preview[0]["state"] == "loaded" and preview[0]["width"] == 8


def test_try_form_for_a_builtin_model(browser: WebDriver) -> None:
    """FAKE_ASYNC (a built-in: no declaration) gets its params' fields beside the
    image picker; a job submitted from the fields alone (the JSON envelope) completes."""
    fields = _pick_try_model(browser, "FAKE_ASYNC", "builtin")
    assert {"delay_ms", "mode", "fail", "steps"} <= set(fields)
    assert fields["delay_ms"]["type"] == "number" and fields["delay_ms"]["max"] == "600000"
    assert fields["mode"]["options"][0] == "" and fields["fail"]["type"] == "checkbox"
    assert (
        browser.run("return getComputedStyle(document.getElementById('try-image-label')).display")
        != "none"
    )
    _set_fields(browser, {"delay_ms": "300", "steps": "3"})
    browser.run("document.getElementById('try-mode').value = 'async';")
    browser.click("#try-submit")
    wait_until(lambda: '"success"' in browser.text("#try-json"), 20, "the result envelope")
    bar = browser.run("const b = document.getElementById('try-progress');"
                      "return [b.getAttribute('value'), b.getAttribute('max')];")  # fmt: skip
    assert bar == ["3", "3"]


def _jobs_submit(browser: WebDriver, params: dict[str, int]) -> str:
    """Submit a FAKE_ASYNC job from the jobs page; its job id."""
    browser.run(
        "document.getElementById('jobs-params').value = arguments[0];"
        "document.getElementById('jobs-form').removeAttribute('data-last-job');",
        json.dumps(params),
    )
    browser.click("#jobs-submit")
    script = "return document.getElementById('jobs-form').getAttribute('data-last-job');"
    return str(wait_until(lambda: browser.run(script), 15, "the job's 202"))


def _job_row(browser: WebDriver, job: str) -> dict[str, str] | None:
    return browser.run(  # type: ignore[no-any-return]
        'const r = document.querySelector(`tr[data-job="${arguments[0]}"]`);'
        "if (!r) return null; const b = r.querySelector('progress');"
        "return {events: r.getAttribute('data-events'), live: r.getAttribute('data-live'),"
        " value: b.getAttribute('value'), max: b.getAttribute('max'),"
        " state: r.querySelector('td.job-state').className};",
        job,
    )


def test_jobs_page_live_progress_cancel_and_result(browser: WebDriver) -> None:
    """On the jobs page a long job's bar moves with its event stream, cancel ends it
    cancelled, and a short job's result appears."""
    browser.run("const s = document.getElementById('jobs-model'); s.value = 'FAKE_ASYNC';"
                "s.dispatchEvent(new Event('change'));")  # fmt: skip
    long_job = _jobs_submit(browser, {"delay_ms": 60000, "steps": 120})
    seen: set[str] = set()

    def moving() -> bool:
        row = _job_row(browser, long_job)
        if row is None:
            return False
        if row["live"] == "1" and row["value"] not in (None, "0"):
            seen.add(row["value"])
        return int(row["events"]) >= 3 and len(seen) >= 2

    wait_until(moving, 30, "the progress bar moving with stream events")
    wait_until(lambda: _click(browser, f'button[data-cancel="{long_job}"]'), 10, "cancel")
    wait_until(lambda: "state-cancelled" in (_job_row(browser, long_job) or {}).get("state", ""),
               20, "the job cancelled")  # fmt: skip
    short_job = _jobs_submit(browser, {"delay_ms": 300, "steps": 3})
    wait_until(
        lambda: (
            short_job in browser.text("#jobs-result-title")
            and '"success"' in browser.text("#jobs-json")
        ),
        30,
        "the short job's result",
    )
    row = _job_row(browser, short_job)
    assert row is not None and "state-done" in row["state"] and row["value"] == row["max"]


def test_a_try_link_opens_try_it_on_that_model(browser: WebDriver, plane: ControlPlane) -> None:
    """The servers table's "try it" link of PATTERNS opens Try-it on it: its form, a
    params example from its declared inputs (no {"timesteps": 10}), the address
    #try=PATTERNS; a page loaded at #try=SHARPEN opens on SHARPEN (issue 36.4)."""
    wait_until(lambda: _click(browser, 'a[data-try="PATTERNS"]'), 10, "the try link")
    form = (
        "const f = document.getElementById('try-fields');"
        "return f.getAttribute('data-model') === arguments[0] && f.getAttribute('data-kind');"
    )
    wait_until(lambda: browser.run(form, "PATTERNS") == "sdk", 20, "the form of PATTERNS")
    example = browser.run("return document.getElementById('try-params').placeholder")
    assert json.loads(example) == {"width": 256, "height": 256}
    assert "try=PATTERNS" in browser.run("return location.hash")
    browser.get(f"http://127.0.0.1:{plane.api_port}/?again=1#try=SHARPEN")
    wait_until(lambda: browser.run(form, "SHARPEN") == "sdk", 20, "the form of SHARPEN")
    assert browser.run("return document.getElementById('try-model').value") == "SHARPEN"


def test_the_security_policy_blocks_nothing_the_page_uses(
    browser: WebDriver, plane: ControlPlane
) -> None:
    """Runs last: the page is served with its CSP and anti-framing headers, its style
    sheet applies, result images (data:) and picked files (blob:) draw under the
    policy, and in everything the tests above did the browser reported no violation
    (while an inline script, the policy's target, is refused)."""
    _, headers, _, _ = call(plane.api_port, "GET", "/")
    assert "script-src 'self';" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
    assert browser.run("return getComputedStyle(document.body).backgroundColor") == (
        "rgb(246, 247, 249)"
    )
    browser.run(
        "window.cspImages = {}; const png = arguments[0];"
        "const bytes = Uint8Array.from(atob(png), c => c.charCodeAt(0));"
        "const urls = {data: 'data:image/png;base64,' + png,"
        " blob: URL.createObjectURL(new Blob([bytes], {type: 'image/png'}))};"
        "for (const [k, u] of Object.entries(urls)) { const i = new Image();"
        " i.onload = () => { window.cspImages[k] = 'loaded'; };"
        " i.onerror = () => { window.cspImages[k] = 'blocked'; }; i.src = u; }",
        ONE_PIXEL_PNG,
    )  # fmt: skip
    images = wait_until(
        lambda: (r := browser.run("return window.cspImages")) and len(r) == 2 and r,
        10,
        "both test images settled",
    )
    assert images == {"data": "loaded", "blob": "loaded"}
    violations = [e["message"] for e in browser.log() if e.get("source") == "security"]
    assert violations == [], violations
    browser.run(
        "const s = document.createElement('script'); s.textContent = 'window.inlineRan = 1';"
        "document.body.append(s);"
    )
    assert browser.run("return window.inlineRan === undefined")
    refused = [e["message"] for e in browser.log() if e.get("source") == "security"]
    assert refused and "Content Security Policy" in refused[0]
