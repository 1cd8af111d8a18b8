"""The monitor page in a real browser: headless Chromium, driven over the DevTools protocol (aiohttp's WebSocket
client), opens /monitor against a running daemon with real demo workers, waits for the page to refresh itself,
and asserts on the rendered DOM — one occupancy bar per worker, one histogram bar per history row, the
population's rows, a user who arrived after the page loaded — then saves a screenshot under build/.

Skipped, with its reason, where Chromium is absent (CI installs Debian's ``chromium``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from harness import browse

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (apt install chromium)")
BUILD = Path(__file__).resolve().parent.parent / "build"

TENANTS = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 4
            pool: {{min_workers: 3, max_workers: 3}}
  globex:
    apps:
      intranet:
        domains: [intranet.localhost]
        root: {root}
        groups:
          main:
            command: ["{{python}}", "-m", "elasticd.demo"]
            capacity: {{probe: prometheus, path: /metrics, interval: 200ms}}
          remote:
            nodes: [{{url: "http://127.0.0.1:9", name: far, capacity: {{probe: ratelimit}}}}]
"""


class DevTools:
    """One page target of a Chromium, over its DevTools WebSocket: send a command, await its result."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            message = json.loads((await asyncio.wait_for(self.ws.receive(), 30)).data)
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def until(self, expression: str, timeout: float = 30.0) -> Any:
        """Poll ``expression`` until it is true (an error, e.g. while the page is still being replaced by the
        navigation, counts as not yet)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = await self.evaluate(expression)
            except AssertionError as exc:
                value, error = None, exc
            else:
                error = None
            if value:
                return value
            assert time.monotonic() < deadline, f"never true in the page: {expression} ({error})"
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def chromium(profile: Path):
    process = subprocess.Popen(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={profile}",
         "--window-size=1280,1000", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert process.poll() is None and time.monotonic() < deadline, "Chromium did not start"
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            page = next(t for t in targets if t["type"] == "page")
            async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 << 20) as ws:
                yield DevTools(ws)
    finally:
        process.terminate()  # our own Chromium, by its pid
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


DOM = """(() => {
  const state = window.elasticdDrawn;
  return {
    tabs: [...document.querySelectorAll("nav#apps button.app-tab")].map(b => b.dataset.app),
    active: document.querySelector("nav#apps button.active")?.dataset.app,
    workers: [...document.querySelectorAll("table.workers tr.worker-row")].map(r => r.dataset.worker),
    bars: [...document.querySelectorAll(".occupancy[data-worker]")].map(b => b.dataset.worker),
    histograms: Object.fromEntries([...document.querySelectorAll("svg.histogram")].map(
      s => [s.dataset.worker, s.querySelectorAll("rect.hbar").length])),
    drawn: Object.fromEntries(Object.values(state.pool.groups).flatMap(g => g.workers).map(
      w => [w.id, w.history.length])),
    users: [...document.querySelectorAll("table.population tr.user-row")].map(r => r.dataset.user),
    ledger: document.querySelector(".ledger [data-ledger=C]")?.textContent,
  };
})()"""


def test_the_monitor_page_renders_and_refreshes_in_chromium(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path), extra_server="  occupancy_interval: 500ms\n")
    d.start()
    deadline = time.monotonic() + 30
    while len([w for w in d.pool()["workers"] if w["announced"]]) < 3:
        assert time.monotonic() < deadline, "the workers never announced"
        time.sleep(0.1)
    cookies = []
    for n in range(2):
        _, _, cookie = browse(d, "/counter")
        for _ in range(n + 2):
            browse(d, "/counter", cookie)
        cookies.append(cookie)
    browse(d, "/login?name=alice", cookies[0])
    for _ in range(8):  # some load, so the bars and histograms have something to show (and the screenshot)
        browse(d, "/cpu?ms=150", cookies[0])

    async def scenario() -> dict[str, Any]:
        async with chromium(tmp_path / "profile") as page:
            await page.call("Emulation.setDeviceMetricsOverride", width=1280, height=1000, deviceScaleFactor=1,
                            mobile=False)
            await page.call("Page.navigate", url=f"http://127.0.0.1:{d.metrics_port}/monitor")
            await page.until("Number(document.body?.dataset.refreshes) >= 1")
            first = await page.evaluate(DOM)
            # A user who comes after the page loaded shows at a later refresh, without a reload.
            _, _, late = await asyncio.to_thread(browse, d, "/counter")
            await asyncio.to_thread(browse, d, "/counter", late)
            refreshes = int(await page.evaluate("document.body.dataset.refreshes"))
            await page.until(f"Number(document.body.dataset.refreshes) >= {refreshes + 1}")
            await page.until(f"!!document.querySelector('tr.user-row[data-user=\"{late[:8]}\"]')")
            later = await page.evaluate(DOM)
            navigations = await page.evaluate("performance.getEntriesByType('navigation').length")
            assert await page.evaluate("document.body.dataset.error === undefined")
            shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            BUILD.mkdir(exist_ok=True)
            (BUILD / "monitor.png").write_bytes(base64.b64decode(shot["data"]))
            # The other app's tab.
            await page.evaluate("document.querySelector('button.app-tab[data-app=\"globex/intranet\"]').click()")
            await page.until("document.querySelector('nav#apps button.active')?.dataset.app === 'globex/intranet'"
                             " && document.querySelectorAll('table.workers tr.worker-row').length === 1")
            # Its worker's capacity reading (the demo's own /metrics), and its nodes: group (never spawned).
            await page.until("/^0\\/8 prometheus/.test(document.querySelector('table.workers [data-capacity]')"
                             "?.textContent ?? '')")
            nodes = await page.evaluate("[...document.querySelectorAll('table.nodes tr.node-row')].map(r => "
                                        "[r.dataset.worker, r.querySelector('[data-capacity]').textContent])")
            return {"first": first, "later": later, "navigations": navigations, "late": late, "nodes": nodes}

    seen = asyncio.run(scenario())
    first, later = seen["first"], seen["later"]
    workers = sorted(w["id"] for w in d.pool()["workers"])
    assert first["tabs"] == ["acme/shop", "globex/intranet"] and first["active"] == "acme/shop"
    assert sorted(first["workers"]) == workers and sorted(first["bars"]) == workers  # one bar per worker
    for dom in (first, later):
        assert dom["histograms"] == dom["drawn"] and all(n > 0 for n in dom["drawn"].values())  # a bar per row
    assert set(first["users"]) == {c[:8] for c in cookies}
    assert set(later["users"]) == {c[:8] for c in [*cookies, seen["late"]]}
    assert first["ledger"].startswith("C ")
    assert seen["navigations"] == 1  # refreshed in place, never reloaded
    assert (BUILD / "monitor.png").stat().st_size > 10_000
    assert seen["nodes"] == [["globex.intranet.remote@far", "ratelimit: no reading"]]

