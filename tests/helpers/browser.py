"""A real browser for the tests: Debian's ``chromium`` driven by Playwright, with the network
blocked.

Playwright's own browser download is not used (CI cannot reach it): ``chromium()`` launches the
system's Chromium (``$PPX_CHROMIUM`` or ``chromium``/``chromium-browser`` on PATH) and skips the
test, with the reason, when there is none or it cannot start. With ``PPX_REQUIRE_BROWSER=1``
(``.ci/run`` sets it once apt has installed Chromium) a missing or broken browser fails instead.

``blocked_page(browser, allow=...)`` opens a page in a fresh context where the network is off
twice over: Chromium resolves no host name but 127.0.0.1 (``--host-resolver-rules``), and every
request that is not ``file://`` or one of the allowed origins (``http://127.0.0.1:<port>``) is
aborted by a route before it leaves the browser. Each aborted request, failed request, console
error and uncaught page error is recorded on the returned ``Traffic``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

REQUIRE = "PPX_REQUIRE_BROWSER"
# no host name resolves but the loopback address: what the route does not catch (Chromium's own
# background requests, prefetches) cannot reach the network either
LAUNCH_ARGS = ["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--disable-dev-shm-usage"]


def unavailable(reason: str):
    """Skip the test for a missing browser, or fail it where CI installed one (PPX_REQUIRE_BROWSER=1)."""
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{reason} ({REQUIRE}=1: the browser tests must run here)")
    pytest.skip(reason)


def find_chromium() -> str | None:
    """$PPX_CHROMIUM, else chromium or chromium-browser on PATH."""
    if os.environ.get("PPX_CHROMIUM"):
        return shutil.which(os.environ["PPX_CHROMIUM"])
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def chromium() -> Iterator:
    """A headless Chromium (Playwright's ``Browser``), closed afterwards; skips (or fails under
    PPX_REQUIRE_BROWSER=1) when there is none to launch."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        unavailable("playwright is not installed (pip install -e '.[test]')")
    exe = find_chromium()
    if exe is None:
        named = os.environ.get("PPX_CHROMIUM")
        where = f"PPX_CHROMIUM={named} not found" if named else "neither chromium nor chromium-browser on PATH"
        unavailable(f"no Chromium: {where} (Debian: apt-get install chromium)")
    args = [*LAUNCH_ARGS, *(["--no-sandbox"] if os.geteuid() == 0 else [])]  # root: no sandbox
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=exe, args=args)
        except Error as e:
            unavailable(f"Chromium at {exe} did not start: {str(e).splitlines()[0]}")
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Traffic:
    """What a blocked page tried and what went wrong on it."""

    blocked: list[str] = field(default_factory=list)  # requests the route aborted (URL)
    failed: list[str] = field(default_factory=list)  # every failed request: "URL (reason)"
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)  # uncaught exceptions

    def __str__(self) -> str:
        return (
            f"blocked {self.blocked}, failed {self.failed}, console errors {self.console_errors}, "
            f"page errors {self.page_errors}"
        )


@contextmanager
def blocked_page(browser, allow: tuple[str, ...] = (), viewport=(1400, 1000)) -> Iterator[tuple]:
    """(page, traffic): a page in a fresh context whose requests go only to file:// URLs and the
    ``allow`` origins (e.g. ``http://127.0.0.1:6006``); everything else is aborted and recorded."""
    traffic = Traffic()
    allowed = re.compile("^(file://" + "".join("|" + re.escape(o.rstrip("/")) + "/" for o in allow) + ")")
    context = browser.new_context(viewport=dict(zip(("width", "height"), viewport)), service_workers="block")
    context.set_default_timeout(15_000)  # a wait that hangs fails in seconds, not Playwright's 30

    def route(r):
        if allowed.match(r.request.url):
            r.continue_()
        else:
            traffic.blocked.append(r.request.url)
            r.abort("internetdisconnected")

    def route_ws(ws):  # never connected to a server: the page talks to nothing
        traffic.blocked.append(ws.url)
        ws.close()

    context.route("**/*", route)
    context.route_web_socket(re.compile(".*"), route_ws)
    page = context.new_page()
    page.on("requestfailed", lambda r: traffic.failed.append(f"{r.url} ({r.failure})"))
    page.on("console", lambda m: m.type == "error" and traffic.console_errors.append(m.text))
    page.on("pageerror", lambda e: traffic.page_errors.append(str(e)))
    try:
        yield page, traffic
    finally:
        context.close()
