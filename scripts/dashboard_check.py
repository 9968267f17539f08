"""The dashboard in a real browser: headless Chromium driven over the Chrome DevTools Protocol.

usage: python3 scripts/dashboard_check.py --binary .build/debug/opqd [--screenshot DIR]
                                          [--skip-scale] [--only basic|resume|panels|token|scale]
(scripts/dashboard-check.sh installs Chromium and websocket-client, then runs this.)

Five runs, each on a fresh opqd (127.0.0.1, a port the kernel picks, a temporary --data):
  basic  3 queues with executing and finished operations: the page shows them with the server's
         counts; a change made through the API after the page loaded shows up without a reload;
         a suspend clicked and confirmed on the page changes the server's state, and so does
         every other action; the queue and operation views, searches, results and errors
         render, hostile names stay text; AA contrast, named controls, Tab order with a visible
         focus; no console errors or CSP refusals; at 375 px the page does not scroll sideways.
  resume the server goes away while the page is offline: the stream resumes with
         Last-Event-ID and delivers what was missed; after 410 it restarts from now and
         re-reads; after a restart that reset the seqs (--store memory) it starts over.
  panels hosts, limiters, schedules (--breaker-failures 2): a host opened by a local port that
         refuses shows open with the API's held count, failures and next probe; an operation it
         holds says so in words; Close on the page (the target now up) releases the work, which
         succeeds; Auto hands it back. The limiter panel's numbers are GET /v1/limiters', its
         busiest keys the keys endpoint's; a limited operation says "2 of 2 running". Schedules
         show the API's next and last runs; Run now on the page creates a run, Pause and Resume
         work, the preview is GET …/next's. Contrast, names, console and 375 px as in basic.
  token  --token and --read-token: the page asks for a token; with the read token no action is
         offered (queues, operations, hosts, schedules); with the full token they are.
  scale  100 queues and 100,000 operations (--store memory): the first render of the queue
         table (a performance.mark the page sets) must come within 1 s of navigation start, and
         the page load must fetch under 200 KB (CDP Network encodedDataLength); a queue's view
         reads one page; a storm of changes in 20 queues costs about one read a second.
Exits 1 on any failure, printing what was expected and what was seen.
"""
import argparse
import base64
import concurrent.futures
import http.client
import http.server
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import socket
import sqlite3
import tempfile
import threading
import time
import urllib.request

import websocket  # websocket-client

RENDER_BUDGET_MS = 1000
BYTES_BUDGET = 200 * 1024
failures = []


def check(ok, what):
    print(("  ok    " if ok else "  FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def wait_for(what, fn, timeout=10.0, every=0.05):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


class Server:
    """opqd on 127.0.0.1 with a port the kernel picks, in a temporary data directory."""

    def __init__(self, binary, *args):
        self.binary, self.args = binary, list(args)
        self.data = tempfile.mkdtemp(prefix="opqd-dash-")
        self.token = None
        self.proc = None
        self.start(0)

    def start(self, port, *extra):
        """Starts opqd on `port` (0: any) with this server's data; a restart keeps both."""
        self.log = open(os.path.join(self.data, "server.log"), "w+")
        self.proc = subprocess.Popen(
            [self.binary, "--host", "127.0.0.1", "--port", str(port), "--data", os.path.join(self.data, "db"),
             "--log-level", "warning", *self.args, *extra],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

        def listening():
            self.log.flush()
            with open(self.log.name) as f:
                m = re.search(r"http://127\.0\.0\.1:(\d+)", f.read())
            if self.proc.poll() is not None:
                raise RuntimeError("opqd exited: " + open(self.log.name).read()[-2000:])
            return m and int(m.group(1))

        self.port = wait_for("opqd to listen", listening, timeout=20)
        self.base = f"http://127.0.0.1:{self.port}"

    def request(self, method, path, body=None, token=None, timeout=10):
        token = token or self.token
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if token:
            headers["Authorization"] = "Bearer " + token
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = None
        return r.status, parsed

    def must(self, method, path, body=None, status=(200, 201)):
        code, data = self.request(method, path, body)
        if code not in status:
            raise RuntimeError(f"{method} {path} answered {code}: {data}")
        return data

    def halt(self):
        """Stops opqd (SIGTERM, SIGKILL after 15 s), keeping its data for a restart."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.log.close()

    def stop(self):
        self.halt()
        shutil.rmtree(self.data, ignore_errors=True)


class Browser:
    """Headless Chromium and one page, spoken to over the DevTools websocket."""

    def __init__(self, chromium):
        self.profile = tempfile.mkdtemp(prefix="opqd-chromium-")
        self.proc = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "--window-size=1400,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, text=True)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        first = wait_for("Chromium's DevTools port", lambda: os.path.exists(port_file) and open(port_file).read().split("\n")[0],
                         timeout=30)
        self.port = int(first)
        targets = wait_for("a page target", lambda: [t for t in self._json("/json/list") if t.get("type") == "page"], timeout=10)
        self.ws = websocket.create_connection(targets[0]["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events = []
        # (URL pattern, console text pattern) of refusals a check provokes on purpose: an
        # unknown id, an endpoint this build may not have yet (copy, bulk cancel, namePrefix).
        self.expected_refusals = [
            (r"/v1/operations/op-ffffffffffffffff$", r"status of 404"),
            (r"/copy$|/operations:cancel$", r"status of 40[45]"),
            (r"namePrefix=", r"status of 422"),
        ]
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Network.enable")
        self.send("Log.enable")

    def _json(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return json.loads(r.read())

    def send(self, method, params=None, timeout=30):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(method)

    def pump(self, seconds):
        """Collects events for a while (they only arrive while something reads the socket)."""
        self.ws.settimeout(0.05)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if "method" in msg:
                self.events.append(msg)
        self.ws.settimeout(30)

    def eval(self, expr):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr[:80]}…: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r.get("result", {}).get("value")

    def until(self, what, expr, timeout=10.0):
        return wait_for(what, lambda: self.eval(expr), timeout=timeout, every=0.05)

    def goto(self, url, width=1400, height=900, mobile=False):
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})
        self.events.clear()
        self.send("Page.navigate", {"url": url})
        wait_for("the load event", lambda: self._seen("Page.loadEventFired") or self.pump(0.05), timeout=15)

    def _seen(self, method):
        return any(e["method"] == method for e in self.events)

    def problems(self):
        """Console errors, uncaught exceptions and CSP refusals seen so far."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails", {}).get("exception", {}).get("description")))
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                text = p["entry"].get("text", "")
                # A 401 the page asked for on purpose (to learn that it needs a token) is not a
                # fault, nor a refusal the test provoked and checked the page shows (see
                # expected_refusals).
                if "401" in text and "Unauthorized" in text:
                    continue
                url = p["entry"].get("url", "")
                if any(re.search(u, url) and re.search(t, text) for u, t in self.expected_refusals):
                    continue
                out.append("log: " + text)
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append("console: " + json.dumps([a.get("value") for a in p.get("args", [])]))
        return out

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        shutil.rmtree(self.profile, ignore_errors=True)


QUEUE_ROWS = """[...document.querySelectorAll('#queues-body tr')].map(tr => ({
  name: tr.dataset.queue,
  counts: Object.fromEntries([...tr.querySelectorAll('td[data-state]')].map(td => [td.dataset.state, Number(td.textContent.replace(/,/g, ''))])),
  badge: tr.querySelector('.badge').textContent,
  toggle: tr.querySelector('.q-toggle') ? tr.querySelector('.q-toggle').textContent : null }))"""


def add_delay(server, queue, seconds, name=None):
    body = {"kind": "delay", "spec": {"seconds": seconds}}
    if name is not None:
        body["name"] = name
    return server.must("POST", f"/v1/queues/{queue}/operations", body)["id"]


def server_counts(server):
    return {q["name"]: {s: q["counts"].get(s, 0) for s in ("pending", "ready", "executing", "paused", "finished")}
            for q in server.must("GET", "/v1/queues")["queues"]}


def run_basic(binary, browser):
    print("\n== basic: 3 queues, live events, an action, the views", flush=True)
    server = Server(binary)
    try:
        for name, limit in (("emails", 2), ("images", 1), ("reports", 3)):
            server.must("POST", "/v1/queues", {"name": name, "maxConcurrentOperationCount": limit})
        done = [add_delay(server, "reports", 0.01, f"report-{i}") for i in range(4)]
        for i in range(3):
            add_delay(server, "emails", 30, f"send-{i}")        # 2 execute, 1 waits (ready)
        for i in range(2):
            add_delay(server, "images", 30, f"resize-{i}")      # 1 executes, 1 waits
        add_delay(server, "reports", 30, "quarterly")
        wait_for("the short operations to finish",
                 lambda: all(server.must("GET", f"/v1/operations/{i}")["state"] == "finished" for i in done))
        expected = wait_for("3 executing", lambda: (c := server_counts(server)) and
                            sum(q["executing"] for q in c.values()) == 4 and c)

        browser.goto(server.base + "/")
        browser.until("the queue table", "document.body.dataset.queuesRendered === 'true' && document.querySelectorAll('#queues-body tr').length === 3")
        rows = browser.eval(QUEUE_ROWS)
        shown = {r["name"]: r["counts"] for r in rows}
        check(sorted(shown) == ["emails", "images", "reports"], f"the page lists the 3 queues: {sorted(shown)}")
        for name, counts in expected.items():
            check(shown.get(name) == counts, f"{name}: page shows {shown.get(name)}, server says {counts}")
        check(browser.eval("document.getElementById('conn').textContent") == "live", "the stream is live")
        cluster = wait_for("the cluster line", lambda: browser.eval(
            "(e => e && !e.hidden && e.textContent)(document.getElementById('cluster'))"), timeout=5)
        check(cluster.startswith("1 instance") and "sqlite" in cluster, f"the header shows who serves the API (GET /v1/cluster): {cluster!r}")
        check(browser.eval("document.getElementById('tail-list').getAttribute('aria-live')") == "polite", "the live tail is an aria-live region")
        check(browser.eval("!!document.querySelector('#queues-body .q-toggle')"), "actions are offered without a token")

        # A change after the page loaded: a new operation, and the tail and counts follow it.
        browser.eval("window.__sameDocument = 'yes'")
        new_id = add_delay(server, "reports", 30, "after-load")
        browser.until("the new operation in the live tail",
                      f"[...document.querySelectorAll('#tail-list li')].some(li => li.textContent.includes('{new_id}'))", timeout=10)
        check(True, f"an event of {new_id} (created after the page loaded) is in the live tail")
        want = server_counts(server)["reports"]["executing"]
        browser.until("the reports row to count it",
                      f"document.querySelector('tr[data-queue=reports] td[data-state=executing]').textContent === '{want}'", timeout=10)
        check(True, f"the reports row shows executing {want} without a reload")
        # A burst (created, started, finished within 0.2 s): the counts settle on the server's.
        quick = add_delay(server, "reports", 0.2, "quick")
        wait_for("quick to finish", lambda: server.must("GET", f"/v1/operations/{quick}")["state"] == "finished")
        want = server_counts(server)["reports"]
        browser.until("the reports row to settle", f"JSON.stringify(({QUEUE_ROWS}).find(r => r.name === 'reports').counts) === "
                      f"JSON.stringify({json.dumps(want)})", timeout=5)
        check(True, f"after a burst of events the reports row settles on the server's counts {want}")
        check(browser.eval("window.__sameDocument") == "yes" and browser.eval("performance.getEntriesByType('navigation').length") == 1,
              "no reload happened")

        # An action through the page: suspend, confirmed in the page's own dialog.
        before = server.must("GET", "/v1/queues/emails")["isSuspended"]
        check(before is False, "emails is not suspended before the click")
        # By keyboard: focus the row's button, Enter opens the dialog, Escape closes it.
        browser.eval("document.querySelector('tr[data-queue=emails] .q-toggle').focus()")
        key(browser, "Enter", "Enter", 13, text="\r")
        browser.until("the confirmation dialog", "document.getElementById('confirm').open")
        check(browser.eval("document.activeElement.id") == "confirm-no", "Enter on Suspend opens the dialog, its focus on Keep (the safe answer)")
        key(browser, "Escape", "Escape", 27)
        browser.until("Escape to close the dialog", "!document.getElementById('confirm').open")
        browser.pump(0.3)
        check(server.must("GET", "/v1/queues/emails")["isSuspended"] is False and
              browser.eval("document.activeElement.classList.contains('q-toggle')"),
              "Escape closes it, changes nothing, and gives the focus back to the button")
        browser.eval("document.querySelector('tr[data-queue=emails] .q-toggle').click()")
        browser.until("the confirmation dialog", "document.getElementById('confirm').open")
        check(server.must("GET", "/v1/queues/emails")["isSuspended"] is False, "nothing changes before confirming")
        browser.eval("document.getElementById('confirm-yes').click()")
        wait_for("emails suspended on the server", lambda: server.must("GET", "/v1/queues/emails")["isSuspended"])
        check(True, "clicking Suspend and confirming suspended emails on the server")
        browser.until("the row to say suspended",
                      "document.querySelector('tr[data-queue=emails] .badge').textContent === 'suspended'")
        check(True, "the emails row says suspended")

        # The queue view: operations by state, cursor-paged; names are text, never markup.
        hostile = "<img src=x id=pwned onerror=\"document.title='pwned'\">"
        add_delay(server, "images", 30, hostile)
        browser.eval("location.hash = '#/q/images'")
        browser.until("the images operations", "document.querySelectorAll('#ops-body tr').length === 3")
        names = browser.eval("[...document.querySelectorAll('#ops-body tr td:nth-child(2)')].map(td => td.textContent)")
        check(hostile in names, "a name with markup is shown as text")
        check(browser.eval("document.getElementById('pwned') === null && document.title !== 'pwned'"), "and never becomes an element")
        browser.eval("document.getElementById('q-filter-state').value = 'executing'; document.getElementById('q-filter-state').dispatchEvent(new Event('change'))")
        browser.until("the executing filter", "document.querySelectorAll('#ops-body tr').length === 1")
        check(True, "state=executing lists the 1 executing operation of images")

        # Search: a name prefix lists only those (or, while this build's list lacks namePrefix,
        # the page shows the server's refusal); an id opens that operation.
        browser.eval("document.getElementById('q-filter-state').value = ''; document.getElementById('q-search').value = 'resize'; "
                     "document.getElementById('q-search-form').requestSubmit()")
        prefix_rows = "[...document.querySelectorAll('#ops-body tr td:nth-child(2)')].map(td => td.textContent)"
        expect_done_or_problem(server, browser, "Search by name prefix", "GET", "/v1/queues/images/operations?namePrefix=resize&limit=50", None,
                               lambda: browser.eval(prefix_rows) == ["resize-0", "resize-1"])
        browser.eval("document.getElementById('notice-close').click()")
        some = server.must("GET", "/v1/queues/reports/operations?limit=1")["operations"][0]["id"]
        browser.eval(f"document.getElementById('q-search').value = '{some}'; document.getElementById('q-search-form').requestSubmit()")
        browser.until("the operation found by id", f"location.hash === '#/op/{some}' && document.getElementById('op-id').textContent === '{some}'")
        check(True, "searching an id in a queue's view opens that operation")
        browser.eval("location.hash = '#/'")
        browser.eval(f"document.getElementById('find-id').value = '{some}'; document.getElementById('find-form').requestSubmit()")
        browser.until("the header's id search", f"location.hash === '#/op/{some}'")
        browser.eval("document.getElementById('find-id').value = 'op-ffffffffffffffff'; document.getElementById('find-form').requestSubmit()")
        browser.until("the unknown id", "(document.getElementById('notice-text').textContent || '').includes('no operation with id')")
        check(True, "the header's id search opens an operation, and says so when there is none")
        browser.eval("document.getElementById('notice-close').click()")

        # One operation: status, spec, history.
        op = server.must("GET", "/v1/queues/emails/operations?limit=1")["operations"][0]
        browser.eval(f"location.hash = '#/op/{op['id']}'")
        browser.until("the operation view", f"document.getElementById('op-id').textContent === '{op['id']}' && "
                      "document.getElementById('op-spec').textContent.includes('seconds') && "
                      "document.querySelectorAll('#op-events-body tr').length > 0")
        check(browser.eval("document.getElementById('op-state').textContent") == op["state"],
              f"the operation view shows state {op['state']}")
        # Why an operation waits, in words (waitingOn).
        server.must("POST", "/v1/queues", {"name": "held", "isSuspended": True})
        held = server.must("POST", "/v1/queues/held/operations", {"kind": "delay", "spec": {"seconds": 1}})["id"]
        browser.eval(f"location.hash = '#/op/{held}'")
        browser.until("why it waits", f"document.getElementById('op-id').textContent === '{held}' && "
                      "document.getElementById('op-fields').textContent.includes('its queue is suspended')")
        check(True, "an operation's waitingOn is shown in words")
        # A failed operation shows its error; a succeeded one its result.
        failed_op = server.must("POST", "/v1/queues/reports/operations",
                                {"kind": "http", "name": "unreachable", "spec": {"method": "GET", "url": "http://127.0.0.1:1/"}})["id"]
        wait_for("the http operation to fail", lambda: op_state(server, failed_op).get("outcome") == "failed")
        browser.eval(f"location.hash = '#/op/{failed_op}'")
        browser.until("its error", "document.getElementById('op-outcome-title').textContent === 'Error' && "
                      f"document.getElementById('op-outcome').textContent.includes({json.dumps(op_state(server, failed_op)['error']['type'])})")
        check(browser.eval("document.getElementById('op-state').textContent") == "finished (failed)", "a failed operation shows finished (failed) and its error")
        browser.eval(f"location.hash = '#/op/{done[0]}'")
        browser.until("its result", f"document.getElementById('op-id').textContent === '{done[0]}' && "
                      "document.getElementById('op-outcome-title').textContent === 'Result' && "
                      "document.getElementById('op-outcome').textContent.includes('seconds')")
        check(True, "a succeeded operation shows its result")

        run_actions(server, browser)
        check_accessibility(browser)
        browser.eval("location.hash = '#/'")

        problems = browser.problems()
        check(not problems, "no console errors, exceptions or CSP refusals" + (f": {problems}" if problems else ""))

        # Phone width: readable without sideways scrolling of the page itself.
        browser.goto(server.base + "/", width=375, height=740, mobile=True)
        browser.until("the queue table at 375 px", "document.body.dataset.queuesRendered === 'true'")
        width = browser.eval("document.documentElement.scrollWidth")
        check(width <= 375, f"at 375 px the page is {width} px wide")
        same_columns(browser, "queues")
        browser.eval("location.hash = '#/q/images'")
        browser.until("the images view at 375 px", "document.querySelectorAll('#ops-body tr').length > 0")
        width = browser.eval("document.documentElement.scrollWidth")
        check(width <= 375, f"at 375 px a queue's view is {width} px wide (wide tables scroll in their own box)")
        same_columns(browser, "ops")

    finally:
        server.stop()


def key(browser, name, code, vk, text=None):
    down = {"type": "keyDown", "key": name, "code": code, "windowsVirtualKeyCode": vk}
    if text:
        down["text"] = text
    browser.send("Input.dispatchKeyEvent", down)
    browser.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": name, "code": code, "windowsVirtualKeyCode": vk})


def op_state(server, op_id):
    return server.must("GET", f"/v1/operations/{op_id}")


def click(browser, selector):
    browser.until(f"{selector} to be enabled", f"(b => b && !b.disabled && !b.hidden)(document.querySelector('{selector}'))")
    browser.eval(f"document.querySelector('{selector}').click()")


def confirm(browser, cascade=False):
    browser.until("the confirmation dialog", "document.getElementById('confirm').open")
    if cascade:
        browser.eval("document.getElementById('confirm-cascade').checked = true")
    browser.eval("document.getElementById('confirm-yes').click()")
    browser.until("the dialog to close", "!document.getElementById('confirm').open")


def notice(browser):
    return browser.eval("document.getElementById('notice').hidden ? null : document.getElementById('notice-text').textContent")


def expect_done_or_problem(server, browser, what, method, path, body, done):
    """An action whose endpoint may not exist in this build yet: either the page shows it done
    (`done()` true), or it shows the server's own problem detail for the same request."""
    outcome = wait_for(f"{what} to be done or refused", lambda: ("done" if done() else None) or
                       ((n := notice(browser)) and "failed" in n and n), timeout=10)
    if outcome == "done":
        check(True, f"{what} through the page changed the server's state")
        return
    code, problem = server.request(method, path, body)
    detail = (problem or {}).get("detail", "")
    check(code >= 400 and detail and detail in outcome, f"{what}: the server answers {code}; the page shows its detail: {outcome!r}")


def run_actions(server, browser):
    """Every action through the page's own controls, checked on the server."""
    # Concurrency of a queue.
    browser.eval("location.hash = '#/q/images'")
    browser.until("the images view", "document.getElementById('q-name').textContent === 'images' && document.querySelectorAll('#ops-body tr').length > 0")
    browser.eval("document.getElementById('q-conc').value = '3'; document.getElementById('q-conc-form').requestSubmit()")
    wait_for("images to run 3 at once", lambda: server.must("GET", "/v1/queues/images")["maxConcurrentOperationCount"] == 3)
    browser.until("the page to confirm it", "document.getElementById('notice-text').textContent.includes('up to 3')")
    check(True, "Max concurrent 3 through the page: the server's images queue runs up to 3")
    browser.eval("document.getElementById('q-conc').value = '0'; document.getElementById('q-conc-form').requestSubmit()")
    check(server.must("GET", "/v1/queues/images")["maxConcurrentOperationCount"] == 3 and "positive" in (notice(browser) or ""),
          "Max concurrent 0 is refused on the page and changes nothing")
    browser.eval("document.getElementById('notice-close').click()")

    # Pause and resume one operation.
    target = add_delay(server, "images", 30, "to-pause")
    browser.eval(f"location.hash = '#/op/{target}'")
    browser.until("its view", f"document.getElementById('op-id').textContent === '{target}' && document.getElementById('op-state').textContent !== ''")
    click(browser, "#op-pause")
    wait_for("paused on the server", lambda: op_state(server, target)["state"] == "paused")
    check(True, "Pause through the page paused the operation")
    browser.until("the page to say paused", "document.getElementById('op-state').textContent === 'paused'")
    click(browser, "#op-resume")
    wait_for("resumed on the server", lambda: op_state(server, target)["state"] != "paused")
    check(True, "Resume through the page resumed it")

    # Cancel with cascade: the dependent goes too.
    first = add_delay(server, "reports", 30, "parent")
    body = {"kind": "delay", "spec": {"seconds": 1}, "name": "child", "dependencies": [first]}
    child = server.must("POST", "/v1/queues/images/operations", body)["id"]
    # The dependent's view links to the operation it depends on.
    browser.eval(f"location.hash = '#/op/{child}'")
    browser.until("the dependent's view", f"document.getElementById('op-id').textContent === '{child}' && document.querySelector('#op-deps a') !== null")
    browser.eval("document.querySelector('#op-deps a').click()")
    browser.until("the parent's view", f"document.getElementById('op-id').textContent === '{first}' && document.getElementById('op-state').textContent !== ''")
    browser.until("the parent's history", "document.querySelectorAll('#op-events-body tr').length > 0")
    check(True, "the dependent's view links to its dependency, and the link opens it")
    click(browser, "#op-cancel")
    check(op_state(server, first)["state"] != "finished", "nothing is cancelled before confirming")
    confirm(browser, cascade=True)
    wait_for("both cancelled", lambda: op_state(server, first).get("outcome") == "cancelled" and op_state(server, child).get("outcome") == "cancelled")
    check(True, "Cancel with cascade through the page cancelled the operation and its dependent")
    browser.until("the page to say cancelled", "document.getElementById('op-state').textContent === 'finished (cancelled)'")

    # Copy (201 and the page opens the copy, or the server's refusal shown as it said it).
    before = len(server.must("GET", "/v1/queues/reports/operations?limit=1000")["operations"])
    click(browser, "#op-copy")
    expect_done_or_problem(server, browser, "Copy", "POST", f"/v1/operations/{first}/copy", {},
                           lambda: len(server.must("GET", "/v1/queues/reports/operations?limit=1000")["operations"]) == before + 1 and
                           browser.eval(f"document.getElementById('op-id').textContent !== '{first}'"))
    browser.eval("document.getElementById('notice-close').click()")

    # Bulk cancel of the ready operations of a queue.
    server.must("POST", "/v1/queues/images/suspend")
    for i in range(3):
        add_delay(server, "images", 30, f"bulk-{i}")
    browser.eval("location.hash = '#/q/images'")
    browser.until("the images view", "document.getElementById('q-name').textContent === 'images'")
    browser.eval("document.getElementById('q-bulk-state').value = 'ready'; document.getElementById('q-bulk-form').requestSubmit()")
    confirm(browser)
    expect_done_or_problem(server, browser, "Bulk cancel of ready", "POST", "/v1/queues/images/operations:cancel", {"state": "ready"},
                           lambda: server_counts(server)["images"]["ready"] == 0 and "Cancelled" in (notice(browser) or ""))
    browser.eval("document.getElementById('notice-close').click()")
    server.must("POST", "/v1/queues/images/resume")


# WCAG 2 contrast of every visible text against the background it is drawn on, and a name for
# every control.
A11Y = r"""(() => {
  const rgb = (c) => { const m = c.match(/[\d.]+/g); return m ? m.map(Number) : [0, 0, 0, 0]; };
  const lum = ([r, g, b]) => { const f = (v) => (v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const bg = (e) => { for (; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor); if (c.length < 4 || c[3] > 0) return c; } return [255, 255, 255]; };
  const bad = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n; (n = walker.nextNode());) {
    const e = n.parentElement;
    if (!n.textContent.trim() || !e.getClientRects().length || e.closest('[hidden], dialog:not([open])')) continue;
    const fg = lum(rgb(getComputedStyle(e).color)), b = lum(bg(e));
    const ratio = (Math.max(fg, b) + 0.05) / (Math.min(fg, b) + 0.05);
    if (ratio < 4.5) bad.push(e.tagName + ' "' + n.textContent.trim().slice(0, 30) + '" ' + ratio.toFixed(2));
  }
  for (const c of document.querySelectorAll('input, select, textarea')) if (!c.labels || !c.labels.length) bad.push('unlabelled ' + c.id);
  for (const c of document.querySelectorAll('button, a[href]')) if (!(c.textContent.trim() || c.getAttribute('aria-label'))) bad.push('nameless ' + c.outerHTML.slice(0, 60));
  return bad;
})()"""


def check_accessibility(browser):
    for view in ("#/", "#/q/reports"):
        browser.eval(f"location.hash = '{view}'")
        browser.pump(0.3)
        bad = browser.eval(A11Y)
        check(not bad, f"{view}: every text has AA contrast and every control a name" + (f": {bad[:8]}" if bad else ""))
    # Keyboard: Tab from the top reaches the first queue link and a Suspend button, and focus is drawn.
    browser.eval("location.hash = '#/'; document.activeElement.blur()")
    seen = []
    for _ in range(40):
        key(browser, "Tab", "Tab", 9)
        seen.append(browser.eval("(e => e.tagName + ':' + e.textContent.trim().slice(0, 20) + ':' + getComputedStyle(e).outlineStyle)(document.activeElement)"))
    check(any(x.startswith("A:emails") for x in seen) and any(x.startswith("BUTTON:Suspend") or x.startswith("BUTTON:Resume") for x in seen),
          "Tab reaches the queue links and their buttons")
    check(all(x.endswith(":solid") for x in seen if not x.startswith("BODY")), "every focused control shows a focus outline")


def stream_requests(browser):
    """(Last-Event-ID or None, status or None) of each request for the event stream, in order."""
    out, index = [], {}
    for e in browser.events:
        p = e.get("params", {})
        if e["method"] == "Network.requestWillBeSent" and "/v1/events/stream" in p["request"]["url"]:
            h = {k.lower(): v for k, v in p["request"].get("headers", {}).items()}
            index[p["requestId"]] = len(out)
            out.append([h.get("last-event-id"), None])
        elif e["method"] == "Network.responseReceived" and p["requestId"] in index:
            out[index[p["requestId"]]][1] = p["response"]["status"]
    return out


def offline(browser, on):
    browser.send("Network.emulateNetworkConditions",
                 {"offline": on, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})


def run_resume(binary, browser):
    print("\n== resume: the stream comes back after a drop (Last-Event-ID), and after 410 from now", flush=True)
    server = Server(binary)
    try:
        server.must("POST", "/v1/queues", {"name": "ingest", "isSuspended": True})
        browser.goto(server.base + "/")
        browser.until("the page", "document.body.dataset.queuesRendered === 'true' && document.getElementById('conn').textContent === 'live'")
        seen = add_delay(server, "ingest", 30, "before-drop")
        browser.until("its event", f"document.getElementById('tail-list').textContent.includes('{seen}')")

        # The server goes away while the page is cut off; changes happen while it cannot hear.
        offline(browser, True)
        port = server.port
        server.halt()
        browser.until("the page to notice", "document.getElementById('conn').textContent.startsWith('reconnecting')", timeout=10)
        check(True, "the page says it is reconnecting")
        server.start(port)
        missed = add_delay(server, "ingest", 30, "while-away")
        offline(browser, False)
        browser.until("the missed change", f"document.getElementById('tail-list').textContent.includes('{missed}')", timeout=20)
        streams = stream_requests(browser)
        resumed = [r for r in streams if r[0] is not None and r[1] == 200]
        check(bool(resumed), f"the stream was reopened with Last-Event-ID: {streams}")
        check(True, "an event that happened while the page was cut off arrived after it reconnected")
        want = server_counts(server)["ingest"]
        browser.until("the counts", f"document.querySelector('tr[data-queue=ingest] td[data-state=ready]').textContent === '{want['ready']}'", timeout=5)

        # Again, but now the server keeps too few events for the page's cursor: 410, then from now.
        offline(browser, True)
        server.halt()
        browser.until("the page to notice", "document.getElementById('conn').textContent.startsWith('reconnecting')", timeout=10)
        server.start(port, "--event-capacity", "16")
        for i in range(40):  # more events than the restarted server keeps
            add_delay(server, "ingest", 30, f"flood-{i}")
        offline(browser, False)
        want = server_counts(server)["ingest"]
        browser.until("the counts after 410", f"document.querySelector('tr[data-queue=ingest] td[data-state=ready]').textContent === '{want['ready']}' && "
                      "document.getElementById('conn').textContent === 'live'", timeout=20)
        statuses = [r[1] for r in stream_requests(browser)]
        check(410 in statuses and statuses[-1] == 200, f"410 (cursor expired) was answered, then a fresh stream: {statuses}")
        check(True, f"after 410 the page re-read the queue: ingest ready {want['ready']}")
        late = add_delay(server, "ingest", 30, "after-410")
        browser.until("a live event after 410", f"document.getElementById('tail-list').textContent.includes('{late}')", timeout=10)
        check(True, "and follows new events again")

        # A server that lost its history (--store memory, restarted): its seqs start over below
        # the page's cursor; the page must take them, not drop them as already seen.
        offline(browser, True)
        server.halt()
        browser.until("the page to notice", "document.getElementById('conn').textContent.startsWith('reconnecting')", timeout=10)
        server.start(port, "--store", "memory")
        server.must("POST", "/v1/queues", {"name": "fresh"})
        offline(browser, False)
        browser.until("the page to reconnect", "document.getElementById('conn').textContent === 'live'", timeout=20)
        anew = add_delay(server, "fresh", 30, "after-reset")
        # (Ids start over too, so the tail's newest entry is looked for by its queue.)
        browser.until("the new server's event", f"(li => li && li.textContent.includes('fresh {anew}'))(document.querySelector('#tail-list li'))", timeout=10)
        browser.until("the new server's queues", "[...document.querySelectorAll('#queues-body tr')].map(tr => tr.dataset.queue).join() === 'fresh'", timeout=10)
        check(True, "after a restart that reset the seqs, the page shows the new server's events and queues only")
    finally:
        offline(browser, False)
        server.stop()


def same_columns(browser, table):
    heads = browser.eval(f"[...document.querySelectorAll('#{table} thead th')].filter(th => th.getClientRects().length).length")
    cells = browser.eval(f"(tr => tr ? [...tr.children].filter(td => td.getClientRects().length).length : -1)(document.querySelector('#{table} tbody tr'))")
    check(heads == cells and heads >= 3, f"at 375 px the {table} table shows as many headings as cells ({heads}, {cells})")


class Target:
    """A local HTTP target that refuses connections until `up()`, then answers 200."""

    def __init__(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()  # nothing listens: connections are refused
        self.server = None

    def up(self):
        class Ok(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Ok)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()


def shown_time(browser, selector):
    """The datetime of the <time> in `selector` (the page keeps the server's RFC 3339 text there)."""
    return browser.eval(f"(t => t ? t.getAttribute('datetime') : null)(document.querySelector({json.dumps(selector + ' time')}))")


CHART_FIELDS = ("created", "started", "succeeded", "failed", "cancelled")
CHART_SHOWN = """[...document.querySelectorAll('#%s figure.chart')].map(f => ({
  range: f.dataset.range, since: f.dataset.since, step: Number(f.dataset.step),
  totals: Object.fromEntries([...f.querySelectorAll('[data-total]')].filter(s => s.dataset.total !== 'live' && s.dataset.total !== 'waitP95Max')
    .map(s => [s.dataset.total, Number(s.textContent.replace(/,/g, ''))])),
  bars: [...f.querySelectorAll('.plot-tput g[data-start]')].map(g => [g.dataset.start, Number(g.dataset.succeeded), Number(g.dataset.failed)])
    .filter(b => b[1] || b[2]),
  live: [...f.querySelectorAll('.plot-tput g[data-start]')].reduce((n, g) => n + Number(g.dataset.live), 0),
  waits: [...f.querySelectorAll('.plot-wait circle[data-start]')].map(c => [c.dataset.start, Number(c.dataset.wait)]) }))"""


def check_charts(server, browser, box, path, what, timeout=12):
    last = []

    def agree():
        nonlocal last
        last = [(r, ok, t, s) for r, ok, t, s in (chart_matches_list(server, browser, box, path))]
        return last and all(ok for _, ok, _, _ in last)
    try:
        wait_for(f"{what} to agree with {path}", agree, timeout=timeout, every=0.5)
    except TimeoutError:
        pass
    for r, ok, t, s in last:
        check(ok, f"{what}, {r}: totals, bars and p95 points equal {path}'s buckets (sums {s}; page {t})")
    if not last:
        check(False, f"{what}: no chart shown")


def chart_matches_list(server, browser, box, path):
    out = []
    for fig in browser.eval(CHART_SHOWN % box):
        got = server.must("GET", f"{path}?step={fig['step']}&since={fig['since']}")["buckets"]
        sums = {f: sum(b[f] for b in got) for f in CHART_FIELDS}
        bars = [[b["start"], b["succeeded"], b["failed"]] for b in got if b["succeeded"] or b["failed"]]
        waits = [[b["start"], b["waitP95"]] for b in got if b["waitP95"] is not None]
        out.append((fig["range"], fig["totals"] == sums and fig["bars"] == bars and fig["waits"] == waits and fig["live"] == 0,
                    fig["totals"], sums))
    return out


# Succeeded and failed must differ by more than hue: failed is a pattern, and its dark stripe
# against succeeded's fill has at least 3:1 contrast (WCAG's for graphics).
CVD = r"""(() => {
  const ok = document.querySelector('.plot-tput rect.bar-ok'), bad = document.querySelector('.plot-tput rect.bar-fail');
  if (!ok || !bad) return 'no bars of both kinds';
  const rgb = (c) => c.match(/[\d.]+/g).map(Number);
  const lum = ([r, g, b]) => { const f = (v) => (v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const fill = getComputedStyle(bad).fill;
  const m = fill.match(/url\("?#([\w-]+)"?\)/);
  if (!m) return 'failed is drawn without a pattern: ' + fill;
  const stripes = [...document.getElementById(m[1]).querySelectorAll('rect')].map(r => lum(rgb(getComputedStyle(r).fill)));
  const a = lum(rgb(getComputedStyle(ok).fill)), dark = Math.min(...stripes);
  const ratio = (Math.max(a, dark) + 0.05) / (Math.min(a, dark) + 0.05);
  return ratio >= 3 ? 'ok ' + ratio.toFixed(1) : 'stripe vs succeeded only ' + ratio.toFixed(2) + ':1';
})()"""


def finish_external(server, queue, outcomes):
    """External operations finished by a worker as given: 'ok' succeeds, 'fail' fails."""
    ids = [server.must("POST", f"/v1/queues/{queue}/operations", {"kind": "external", "spec": {"lease": 30}, "retry": {"maxAttempts": 1}})["id"]
           for _ in outcomes]
    claims = []
    while len(claims) < len(ids):
        code, got = server.request("POST", f"/v1/queues/{queue}/claim?wait=2&max={len(ids)}")
        claims += (got or {}).get("claims", []) if code == 200 else []
    finishes = [{"id": c["operation"]["id"], "leaseToken": c["lease"]["token"],
                 **({"result": {"n": i}} if o == "ok" else {"error": {"type": "declined", "detail": "card declined"}})}
                for i, (c, o) in enumerate(zip(claims, outcomes))]
    server.must("POST", "/v1/operations:finish", {"finishes": finishes})
    return ids


def run_charts(server, browser):
    """The history charts against GET /v1/history and GET /v1/queues/{q}/history (panels run)."""
    server.must("POST", "/v1/queues", {"name": "jobs", "maxConcurrentOperationCount": 8})
    finish_external(server, "jobs", ["ok", "ok", "fail", "ok", "fail"])
    browser.eval("location.hash = '#/'")
    browser.until("the overview charts", "document.body.dataset.chartsRendered === '*'")
    check_charts(server, browser, "overview-charts", "/v1/history", "overview")
    verdict = browser.eval(CVD)
    check(verdict.startswith("ok"), f"failed and succeeded differ by pattern and lightness, not hue alone: {verdict}")
    # Live: finishes seen on the stream grow the newest bucket before the next read; that read
    # then has them.
    add_delay(server, "jobs", 0.01, "tick")
    browser.pump(0.5)
    for i in range(3):
        add_delay(server, "jobs", 0.01, f"live-{i}")
    grown = wait_for("the newest bucket to grow from the stream",
                     lambda: browser.eval("[...document.querySelectorAll('#overview-charts figure[data-range=hour] g[data-live]')]"
                                          ".reduce((n, g) => n + Number(g.dataset.live), 0)") or None, timeout=4)
    check(grown >= 1, f"finishes seen live grow the newest bucket between reads (+{grown} before the next read)")
    check_charts(server, browser, "overview-charts", "/v1/history", "overview after the next read")
    browser.eval("location.hash = '#/q/jobs'")
    browser.until("the queue's charts", "document.body.dataset.chartsRendered === 'jobs'")
    check_charts(server, browser, "q-charts", "/v1/queues/jobs/history", "queue jobs")


def run_panels(binary, browser):
    print("\n== panels: hosts, limiters, schedules, and why an operation waits", flush=True)
    server = Server(binary, "--breaker-failures", "2", "--breaker-open", "300")
    target = Target()
    host = f"127.0.0.1:{target.port}"
    try:
        # A host that refuses: 4 http operations with retries; 2 failures in a row open it.
        server.must("POST", "/v1/queues", {"name": "hooks"})
        hooks = [server.must("POST", "/v1/queues/hooks/operations", {
            "kind": "http", "name": f"hook-{i}", "spec": {"method": "POST", "url": f"http://{host}/hook", "body": "x"},
            "retry": {"maxAttempts": 5, "backoff": 0.2}})["id"] for i in range(4)]
        # A limiter: 2 at once per key, 1 for acct-7; 5 operations on acct-42, 1 on acct-7.
        server.must("POST", "/v1/limiters", {"name": "stripe", "concurrency": 2, "overrides": {"acct-7": {"concurrency": 1}}})
        server.must("POST", "/v1/limiters", {"name": "smtp", "rate": {"perSecond": 0.01, "burst": 1}})
        server.must("POST", "/v1/queues", {"name": "billing", "maxConcurrentOperationCount": 10})
        charges = [server.must("POST", "/v1/queues/billing/operations", {
            "kind": "delay", "name": f"charge-{i}", "spec": {"seconds": 120},
            "limits": [{"limiter": "stripe", "key": "acct-42"}]})["id"] for i in range(5)]
        server.must("POST", "/v1/queues/billing/operations", {
            "kind": "delay", "name": "refund", "spec": {"seconds": 120}, "limits": [{"limiter": "stripe", "key": "acct-7"}]})
        for i in range(2):
            server.must("POST", "/v1/queues/billing/operations", {
                "kind": "delay", "name": f"mail-{i}", "spec": {"seconds": 0.01}, "limits": [{"limiter": "smtp", "key": "news"}]})
        # Schedules: one by cron in a zone with daylight saving, one every 10 minutes.
        server.must("POST", "/v1/queues/billing/schedules", {
            "name": "nightly", "cron": "30 2 * * *", "timezone": "Europe/Berlin", "operation": {"kind": "delay", "spec": {"seconds": 0.01}}})
        server.must("POST", "/v1/queues/hooks/schedules", {"name": "ping", "every": 600, "operation": {"kind": "delay", "spec": {"seconds": 0.01}}})
        wait_for("the host to open and hold all 4", lambda: (h := server.request("GET", f"/v1/hosts/{host}")[1]) and
                 h.get("state") == "open" and h.get("held") == 4, timeout=15)

        browser.goto(server.base + "/")
        browser.until("the page", "document.body.dataset.queuesRendered === 'true' && document.getElementById('conn').textContent === 'live'")

        # Hosts: the row says what GET /v1/hosts says.
        browser.eval("location.hash = '#/hosts'")
        row = f"#hosts-body tr[data-host='{host}']"
        browser.until("the host row", f"!!document.querySelector({json.dumps(row)})")
        api = server.must("GET", f"/v1/hosts/{host}")
        seen = browser.eval(f"""(tr => ({{state: tr.querySelector('[data-field=state]').dataset.state,
            badge: tr.querySelector('.badge').textContent, held: tr.querySelector('[data-field=held]').textContent,
            failures: tr.querySelector('[data-field=consecutiveFailures]').textContent,
            trips: tr.querySelector('[data-field=trips]').textContent,
            until: tr.querySelector('[data-field=until]').textContent,
            error: tr.querySelector('[data-field=lastError]').title}}))(document.querySelector({json.dumps(row)}))""")
        check(seen["state"] == "open" and seen["badge"] == "open" and seen["held"] == str(api["held"]) and
              seen["failures"] == str(api["consecutiveFailures"]) and seen["trips"] == str(api["trips"]),
              f"the hosts panel shows {host} open, held {seen['held']}, failures {seen['failures']}, trips {seen['trips']} as the API: "
              f"{api['state']}, {api['held']}, {api['consecutiveFailures']}, {api['trips']}")
        check(shown_time(browser, row + " [data-field=until]") == api["until"] and seen["until"].startswith("next probe"),
              f"and its next probe at the API's until {api['until']}: {seen['until']!r}")
        check(api["lastError"]["type"] in seen["error"], f"and its last error ({api['lastError']['type']})")

        # The held operation says why it waits, with the host's numbers.
        browser.eval(f"location.hash = '#/op/{hooks[0]}'")
        browser.until("why the hook waits", "(l => l && /\\d held/.test(l.textContent))(document.querySelector('#op-waiting li[data-type=host]'))")
        words = browser.eval("document.querySelector('#op-waiting li[data-type=host]').textContent")
        waiting = op_state(server, hooks[0])["waitingOn"]
        check(f"host {host} is held: its breaker is open until" in words and "4 held" in words and
              shown_time(browser, "#op-waiting li[data-type=host]") == waiting[0].get("until"),
              f"waitingOn in words: {words!r}")

        # Close it from the page, with the target up: the held work runs and succeeds.
        target.up()
        browser.eval("location.hash = '#/hosts'")
        browser.until("the host row", f"!!document.querySelector({json.dumps(row + ' .h-closed')})")
        browser.eval(f"document.querySelector({json.dumps(row + ' .h-closed')}).click()")
        check(server.must("GET", f"/v1/hosts/{host}")["state"] == "open", "nothing changes before confirming")
        confirm(browser)
        wait_for("the host closed by hand", lambda: (h := server.must("GET", f"/v1/hosts/{host}")).get("state") == "closed" and
                 (h.get("manual") or {}).get("breaker") == "closed")
        check(True, "Close through the page closed the host on the server (by hand)")
        # Looked for now, before the held hooks' events come: the tail keeps the last 100
        # events, and looking once after them raced both its rendering and that bound.
        browser.until("the live tail to show the host's breaker change",
                      f"[...document.querySelectorAll('#tail-list li')].some(li => li.textContent.includes('host {host} breaker open → closed'))")
        check(True, "the live tail shows the host's breaker change")
        wait_for("the held hooks to succeed", lambda: all(op_state(server, i).get("outcome") == "succeeded" for i in hooks), timeout=15)
        check(True, "and the 4 held operations ran and succeeded")
        browser.until("the row to follow", f"(tr => tr.querySelector('.badge').textContent === 'closed (by hand)' && "
                      f"tr.querySelector('[data-field=held]').textContent === '0')(document.querySelector({json.dumps(row)}))")
        check(True, "the row says closed (by hand), 0 held")
        # By keyboard: Tab from the top reaches the row's Auto button, drawn with a focus outline.
        browser.eval("document.activeElement.blur()")
        for _ in range(30):
            key(browser, "Tab", "Tab", 9)
            if browser.eval("document.activeElement.classList.contains('h-auto')"):
                break
        check(browser.eval("document.activeElement.classList.contains('h-auto') && getComputedStyle(document.activeElement).outlineStyle === 'solid'"),
              "Tab reaches the host's buttons, with a focus outline")
        browser.eval(f"document.querySelector({json.dumps(row + ' .h-auto')}).click()")
        wait_for("the host back on the automatic rules", lambda: "manual" not in server.must("GET", f"/v1/hosts/{host}"))
        check(True, "Auto through the page hands it back to the automatic rules")

        # Limiters: every number the panel shows is the API's.
        browser.eval("location.hash = '#/limiters'")
        browser.until("the limiter rows and busiest keys", "document.querySelectorAll('#limiters-body tr').length === 2 && "
                      "!!document.querySelector('#limiters-body tr[data-limiter=stripe] .busiest li[data-key]')")
        fields = ("concurrency", "running", "waiting", "keys")
        want = {lim["name"]: {f: "–" if lim[f] is None else f"{lim[f]:,}" for f in fields}
                for lim in server.must("GET", "/v1/limiters")["limiters"]}
        shown = browser.eval("Object.fromEntries([...document.querySelectorAll('#limiters-body tr')].map(tr => [tr.dataset.limiter, "
                             f"Object.fromEntries({json.dumps(fields)}.map(f => [f, tr.querySelector('[data-field=' + f + ']').textContent]))]))")
        check(shown == want, f"the limiter panel's numbers equal GET /v1/limiters: {shown}")
        keys = server.must("GET", "/v1/limiters/stripe/keys")["keys"]
        busiest = browser.eval("[...document.querySelectorAll('#limiters-body tr[data-limiter=stripe] .busiest li[data-key]')].map(li => "
                               "[li.dataset.key, Number(li.dataset.running), Number(li.dataset.waiting), li.textContent])")
        ranked = sorted(keys, key=lambda k: (-k["running"], -k["waiting"], k["key"]))
        check([b[:3] for b in busiest] == [[k["key"], k["running"], k["waiting"]] for k in ranked][:3] and
              busiest[0][3] == "acct-42: 2 of 2 running, 3 waiting" and busiest[1][3].startswith("acct-7: 1 of 1 running"),
              f"its busiest keys are the keys endpoint's, busiest first: {[b[3] for b in busiest]}")
        browser.eval(f"location.hash = '#/op/{charges[4]}'")
        browser.until("why the charge waits", "(l => l && /\\d of \\d running/.test(l.textContent))(document.querySelector('#op-waiting li[data-type=limiter]'))")
        words = browser.eval("document.querySelector('#op-waiting li[data-type=limiter]').textContent")
        check(words == "waiting for limiter stripe, key acct-42: 2 of 2 running, 3 waiting", f"waitingOn in words: {words!r}")

        # Schedules: next and last runs as the API has them; a trigger from the page makes a run.
        browser.eval("location.hash = '#/schedules'")
        browser.until("the schedule rows", "document.querySelectorAll('#schedules-body tr').length === 2")
        listed = {f"{s['queue']}/{s['name']}": s for s in server.must("GET", "/v1/schedules")["schedules"]}
        for name, s in listed.items():
            sel = f"#schedules-body tr[data-schedule='{name}']"
            last = browser.eval(f"document.querySelector({json.dumps(sel + ' [data-field=lastRun]')}).textContent")
            check(shown_time(browser, sel + " [data-field=nextRunAt]") == s["nextRunAt"] and
                  (last == "never" if "lastRun" not in s else s["lastRun"]["operation"] in last),
                  f"{name}: next run {s['nextRunAt']}, last run {last!r}, as the API says")
        sel = "#schedules-body tr[data-schedule='billing/nightly']"
        browser.eval(f"document.querySelector({json.dumps(sel + ' .s-trigger')}).click()")
        confirm(browser)
        runs = listed["billing/nightly"]["runs"]
        made = wait_for("a run of nightly", lambda: (s := server.must("GET", "/v1/queues/billing/schedules/nightly")).get("runs") == runs + 1 and s)
        run = op_state(server, made["lastRun"]["operation"])
        check(run.get("schedule", {}).get("name") == "nightly", f"Run now through the page created a run: {run['id']} of schedule nightly")
        browser.until("the row's last run", f"(td => td.textContent.includes('{run['id']}'))(document.querySelector({json.dumps(sel + ' [data-field=lastRun]')}))")
        check(shown_time(browser, sel + " [data-field=lastRun]") == made["lastRun"]["nominalTime"] and
              browser.eval(f"document.querySelector({json.dumps(sel + ' [data-field=counts]')}).textContent") ==
              f"{made['runs']} · {made['skipped']} · {made['missed']}",
              f"the row shows that run (its nominal time and operation) and counts {made['runs']} · {made['skipped']} · {made['missed']}")
        browser.eval(f"document.querySelector({json.dumps(sel + ' .s-toggle')}).click()")
        confirm(browser)
        wait_for("nightly paused", lambda: server.must("GET", "/v1/queues/billing/schedules/nightly")["isPaused"])
        browser.until("the row to say paused", f"document.querySelector({json.dumps(sel + ' .badge')}).textContent === 'paused'")
        check(True, "Pause through the page paused the schedule")
        browser.eval(f"document.querySelector({json.dumps(sel + ' .s-toggle')}).click()")
        wait_for("nightly resumed", lambda: not server.must("GET", "/v1/queues/billing/schedules/nightly")["isPaused"])
        check(True, "Resume through the page resumed it")

        # One schedule: the preview of its next runs is the API's.
        browser.eval("location.hash = '#/q/billing/s/nightly'")
        browser.until("the preview", "document.querySelectorAll('#sched-next-body tr[data-nominal]').length === 10")
        runs = server.must("GET", "/v1/queues/billing/schedules/nightly/next?count=10")["runs"]
        shown = browser.eval("[...document.querySelectorAll('#sched-next-body tr')].map(tr => [tr.dataset.nominal, tr.children[2].textContent])")
        check(shown == [[r["nominalTime"], r["localTime"]] for r in runs], f"the next 10 runs are GET …/next?count=10's ({runs[0]['localTime']} first)")
        browser.eval("document.getElementById('sched-next-count').value = '25'; document.getElementById('sched-next-count').dispatchEvent(new Event('change'))")
        browser.until("25 runs", "document.querySelectorAll('#sched-next-body tr[data-nominal]').length === 25")
        check(True, "and 25 when asked for 25")
        # A queue's view lists its schedules.
        browser.eval("location.hash = '#/q/hooks'")
        browser.until("the queue's schedules", "!document.getElementById('q-sched').hidden && "
                      "document.querySelector('#q-schedules-body tr').dataset.schedule === 'hooks/ping'")
        check(True, "a queue's view lists its schedules")

        run_charts(server, browser)

        for view in ("#/", "#/q/jobs", "#/hosts", "#/limiters", "#/schedules", "#/q/billing/s/nightly"):
            browser.eval(f"location.hash = '{view}'")
            browser.pump(0.4)
            bad = browser.eval(A11Y)
            check(not bad, f"{view}: every text has AA contrast and every control a name" + (f": {bad[:8]}" if bad else ""))
        problems = browser.problems()
        check(not problems, "no console errors, exceptions or CSP refusals" + (f": {problems}" if problems else ""))
        browser.goto(server.base + "/", width=375, height=740, mobile=True)
        browser.until("the page at 375 px", "document.body.dataset.queuesRendered === 'true'")
        for view in ("#/", "#/q/jobs", "#/hosts", "#/limiters", "#/schedules", "#/q/billing/s/nightly"):
            browser.eval(f"location.hash = '{view}'")
            browser.pump(0.4)
            width = browser.eval("document.documentElement.scrollWidth")
            check(width <= 375, f"at 375 px {view} is {width} px wide")
    finally:
        target.down()
        server.stop()


def run_token(binary, browser):
    print("\n== token: --token and --read-token", flush=True)
    server = Server(binary, "--token", "full-token-x", "--read-token", "read-token-y")
    server.token = "full-token-x"
    try:
        server.must("POST", "/v1/queues", {"name": "billing"})
        op_id = add_delay(server, "billing", 30, "invoice")
        server.must("POST", "/v1/queues/billing/schedules", {"name": "monthly", "cron": "@monthly", "operation": {"kind": "delay", "spec": {"seconds": 1}}})
        server.must("PATCH", "/v1/hosts/api.example.com:443", {"breaker": "open", "reason": "maintenance"})
        browser.goto(server.base + "/")
        browser.until("the token form", "!document.getElementById('login').hidden")
        check(browser.eval("document.getElementById('view-queues').hidden"), "no queues are shown before a token is given")
        browser.eval("document.getElementById('login-token').value = 'read-token-y'; document.getElementById('login-form').requestSubmit()")
        browser.until("the queue table with the read token", "document.querySelectorAll('#queues-body tr').length === 1")
        check(browser.eval("sessionStorage.getItem('opqd.token')") == "read-token-y", "the token is in sessionStorage")
        check(browser.eval("localStorage.length") == 0 and browser.eval("document.cookie") == "", "and nowhere else")
        check(browser.eval("document.querySelectorAll('#queues-body button').length") == 0, "read token: no queue actions")
        browser.eval(f"location.hash = '#/op/{op_id}'")
        browser.until("the operation view", f"document.getElementById('op-id').textContent === '{op_id}' && document.getElementById('op-state').textContent !== ''")
        actions = "['q-suspend', 'q-resume', 'q-conc', 'q-bulk-state', 'op-cancel', 'op-pause', 'op-resume', 'op-copy']"
        check(browser.eval(f"{actions}.every(id => document.getElementById(id) === null) && "
                           "document.querySelectorAll('button.danger, .q-toggle').length === 0"),
              "read token: no queue or operation action is in the page")
        check("read-only" in browser.eval("document.getElementById('mode').textContent"), "the page says it is read-only")
        # The panels: everything is shown, no action is offered.
        browser.eval("location.hash = '#/hosts'")
        browser.until("the held host", "(tr => tr && tr.querySelector('.badge').textContent === 'open (by hand)')(document.querySelector('#hosts-body tr'))")
        browser.eval("location.hash = '#/schedules'")
        browser.until("the schedule", "document.querySelectorAll('#schedules-body tr').length === 1")
        browser.eval("location.hash = '#/q/billing/s/monthly'")
        browser.until("the schedule's view", "document.querySelectorAll('#sched-next-body tr[data-nominal]').length === 10")
        browser.eval("location.hash = '#/q/billing'")
        browser.until("the queue's schedules", "!document.getElementById('q-sched').hidden")
        check(browser.eval("document.querySelectorAll('#hosts-body button, #schedules-body button, #q-schedules-body button').length === 0 && "
                           "document.getElementById('sched-actions') === null"),
              "read token: the hosts and schedules are shown, with no action (open, close, pause, resume, run now)")
        status = browser.eval("fetch('/v1/queues/billing/suspend', {method: 'POST', headers: {Authorization: 'Bearer ' + "
                              "sessionStorage.getItem('opqd.token')}}).then(r => r.status)")
        check(status == 403 and server.must("GET", "/v1/queues/billing")["isSuspended"] is False,
              f"and the server refuses an action with that token anyway: {status}")
        browser.expected_refusals.append((r"/v1/queues/billing/suspend$", r"status of 403"))

        # Forget it, give the full token: actions come back.
        browser.eval("document.getElementById('forget').click()")
        browser.until("the token form again", "document.readyState === 'complete' && !document.getElementById('login').hidden", timeout=15)
        check(browser.eval("sessionStorage.getItem('opqd.token')") is None, "Forget token removes it")
        browser.eval("document.getElementById('login-token').value = 'wrong'; document.getElementById('login-form').requestSubmit()")
        browser.until("the refusal", "document.getElementById('login-error').textContent.includes('refused')")
        check(True, "a wrong token is refused on the form")
        browser.eval("document.getElementById('login-token').value = 'full-token-x'; document.getElementById('login-form').requestSubmit()")
        browser.until("the queue table with the full token", "document.querySelectorAll('#queues-body .q-toggle').length === 1")
        browser.eval("location.hash = '#/hosts'")
        browser.until("the host's actions", "document.querySelectorAll('#hosts-body button').length === 3")
        browser.eval("location.hash = '#/'")
        check(True, "full token: actions are offered")
        problems = browser.problems()
        check(not problems, "no console errors, exceptions or CSP refusals" + (f": {problems}" if problems else ""))
    finally:
        server.stop()


def create_many(server, queues, per_queue):
    """queues × per_queue delay operations on suspended queues, over parallel keep-alive connections."""
    for i in range(queues):
        server.must("POST", "/v1/queues", {"name": f"q{i:03d}", "isSuspended": True, "maxConcurrentOperationCount": 4})

    def worker(qs):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        body = json.dumps({"kind": "delay", "spec": {"seconds": 3600}})
        made = 0
        for q in qs:
            for _ in range(per_queue):
                conn.request("POST", f"/v1/queues/{q}/operations", body=body, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                if r.status != 201:
                    raise RuntimeError(f"create in {q}: {r.status}")
                made += 1
        conn.close()
        return made

    names = [f"q{i:03d}" for i in range(queues)]
    threads = 8
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(worker, [names[i::threads] for i in range(threads)]))


def measure_load(browser, url, settle=1.0):
    """Loads url with the cache off; returns (first render ms of the queue table, of the overview
    charts, bytes fetched, per-URL bytes)."""
    browser.send("Network.setCacheDisabled", {"cacheDisabled": True})
    browser.goto(url)
    browser.until("the first render", "performance.getEntriesByName('opqd-queues-rendered').length > 0", timeout=15)
    browser.until("the overview charts", "performance.getEntriesByName('opqd-overview-rendered').length > 0", timeout=15)
    browser.pump(settle)
    render = browser.eval("performance.getEntriesByName('opqd-queues-rendered')[0].startTime")
    charts = browser.eval("performance.getEntriesByName('opqd-overview-rendered')[0].startTime")
    urls, finished, streamed = {}, {}, {}
    for e in browser.events:
        p = e.get("params", {})
        if e["method"] == "Network.requestWillBeSent":
            urls[p["requestId"]] = p["request"]["url"]
        elif e["method"] == "Network.loadingFinished":
            finished[p["requestId"]] = p.get("encodedDataLength", 0)
        elif e["method"] == "Network.dataReceived":
            streamed[p["requestId"]] = streamed.get(p["requestId"], 0) + p.get("encodedDataLength", 0)
    per_url = {}
    for rid, url in urls.items():
        n = finished.get(rid, streamed.get(rid, 0))
        per_url[url] = per_url.get(url, 0) + n
    browser.send("Network.setCacheDisabled", {"cacheDisabled": False})
    return render, charts, sum(per_url.values()), per_url


def run_scale(binary, browser, queues=100, per_queue=1000):
    print(f"\n== scale: {queues} queues, {queues * per_queue:,} operations", flush=True)
    server = Server(binary, "--store", "memory")
    try:
        t0 = time.monotonic()
        made = create_many(server, queues, per_queue)
        print(f"  created {made:,} operations in {time.monotonic() - t0:.1f} s")
        total = sum(sum(c.values()) for c in server_counts(server).values())
        check(total == queues * per_queue, f"the server counts {total:,} operations")

        render, charts, fetched, per_url = measure_load(browser, server.base + "/")
        rows = browser.eval("document.querySelectorAll('#queues-body tr').length")
        check(rows == queues, f"the page lists {rows} queues")
        shown = browser.eval("document.querySelector('tr[data-queue=q042] td[data-state=ready]').textContent")
        check(shown == f"{per_queue:,}", f"q042 shows ready {shown}")
        for url, n in sorted(per_url.items(), key=lambda kv: -kv[1]):
            print(f"    {n:>8,} B  {url.replace(server.base, '')}")
        print(f"  FIGURES first render {render:.0f} ms (charts {charts:.0f} ms), fetched {fetched:,} bytes ({fetched / 1024:.1f} KB) "
              f"with {queues} queues and {total:,} operations")
        check(render <= RENDER_BUDGET_MS, f"first render {render:.0f} ms <= {RENDER_BUDGET_MS} ms")
        check(charts <= RENDER_BUDGET_MS, f"overview charts drawn at {charts:.0f} ms <= {RENDER_BUDGET_MS} ms")
        check(fetched <= BYTES_BUDGET, f"fetched {fetched:,} B <= {BYTES_BUDGET:,} B")

        # A queue's operations: one page, never everything.
        browser.events.clear()
        t = time.monotonic()
        browser.eval("location.hash = '#/q/q007'")
        browser.until("a page of q007", "document.querySelectorAll('#ops-body tr').length > 0")
        ms = (time.monotonic() - t) * 1000
        browser.pump(0.3)
        got = sum(e["params"].get("encodedDataLength", 0) for e in browser.events if e["method"] == "Network.loadingFinished")
        rows = browser.eval("document.querySelectorAll('#ops-body tr').length")
        print(f"  FIGURES queue view of {per_queue:,} operations: {rows} rows in {ms:.0f} ms, {got:,} bytes")
        check(rows <= 100 and browser.eval("!document.getElementById('ops-more').hidden"), "the list is one page with a Load more")
        browser.eval("document.getElementById('ops-more').click()")
        browser.until("the next page", f"document.querySelectorAll('#ops-body tr').length === {2 * rows}")
        ids = browser.eval("[...document.querySelectorAll('#ops-body tr')].map(tr => tr.dataset.op)")
        first = [o["id"] for o in server.must("GET", f"/v1/queues/q007/operations?limit={2 * rows}")["operations"]]
        check(ids == first, f"Load more appends the next {rows} by the cursor, in order, no repeats")

        # A storm of changes in 20 queues: the page's reads stay bounded (a list read a second
        # at most when many queues change), however many events come.
        browser.eval("location.hash = '#/'")
        churn = [f"churn{i:02d}" for i in range(20)]
        for name in churn:
            server.must("POST", "/v1/queues", {"name": name, "maxConcurrentOperationCount": 8})
        browser.pump(1.5)
        browser.events.clear()
        stop = time.monotonic() + 4

        def storm(names):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            body = json.dumps({"kind": "delay", "spec": {"seconds": 0.01}})
            n = 0
            while time.monotonic() < stop:
                for q in names:
                    conn.request("POST", f"/v1/queues/{q}/operations", body=body, headers={"Content-Type": "application/json"})
                    r = conn.getresponse()
                    r.read()
                    n += 1
            conn.close()
            return n

        t = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            future = pool.map(storm, [churn[i::4] for i in range(4)])
            browser.pump(4.5)
            made = sum(future)
        seconds = time.monotonic() - t
        browser.pump(1.5)
        reads = [e["params"]["request"]["url"].replace(server.base, "") for e in browser.events
                 if e["method"] == "Network.requestWillBeSent" and "/v1/events/stream" not in e["params"]["request"]["url"]]
        events = browser.eval("Number(document.querySelector('#tail-list li').dataset.seq)")
        print(f"  FIGURES storm: {made:,} operations created ({made * 4:,}+ events) in {seconds:.1f} s; the page made {len(reads)} reads: "
              f"{sorted(set(r.split('?')[0] for r in reads))}")
        # The page's promise: each queue (and the whole list) read at most once a second, and
        # one list read instead of many queue reads when more than 8 queues changed.
        per_target = {}
        for r in reads:
            per_target[r.split("?")[0]] = per_target.get(r.split("?")[0], 0) + 1
        busiest = max(per_target.values(), default=0)
        check(busiest <= seconds + 2.5, f"no queue and not the list read more than once a second: at most {busiest} reads of one in {seconds + 1.5:.1f} s")
        check(len(reads) <= 5 * (seconds + 2), f"{len(reads)} reads in all for {made * 4:,}+ events")
        want = server_counts(server)
        browser.until("the churn queues to settle", f"({QUEUE_ROWS}).filter(r => r.name.startsWith('churn')).every(r => "
                      f"r.counts.finished === ({json.dumps({k: v['finished'] for k, v in want.items()})})[r.name])", timeout=10)
        check(True, f"after the storm every churn row shows the server's finished count (last seq {events})")
    finally:
        server.stop()


def seed_history(path, queues, now):
    """Every minute of the last 24 hours and every hour of the last 30 days busy, in each queue:
    the rows the server keeps (SQLite table `history`, StoreKit.HistoryText), written while it is
    stopped. The most history a queue can have, so the largest answers the page can get."""
    con = sqlite3.connect(path)
    rows = []
    for q in queues:
        for step, ring in ((60, 1440), (3600, 720)):
            k = step // 60
            for i in range(ring):
                start = (now // step - i) * step
                # created started succeeded failed cancelled | wait bins | run bins
                text = f"{40 * k} {42 * k} {36 * k} {3 * k} {k}|6:{30 * k} 9:{8 * k} 12:{4 * k}|8:{30 * k} 11:{9 * k}"
                rows.append((q, step, (start // step) % ring, start, text))
    con.executemany("INSERT OR REPLACE INTO history (queue, step, slot, start, data) VALUES (?, ?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    return len(rows)


def run_history_scale(binary, browser, queues=100):
    """100 queues with 30 days of history each (seeded into a stopped server's SQLite store): the
    overview's first render and its bytes stay within the budget, and its charts equal the API's."""
    print(f"\n== scale: {queues} queues with 30 days of history each", flush=True)
    server = Server(binary)
    try:
        names = [f"h{i:03d}" for i in range(queues)]
        for name in names:
            server.must("POST", "/v1/queues", {"name": name, "isSuspended": True})
        port = server.port
        server.halt()
        t = time.monotonic()
        n = seed_history(os.path.join(server.data, "db", "opqd.sqlite"), names, int(time.time()))
        print(f"  seeded {n:,} history buckets in {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        server.start(port)
        print(f"  restarted with them in {time.monotonic() - t:.1f} s")
        month = server.must("GET", "/v1/queues/h042/history?step=3600&since=" +
                            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 30 * 86400)))["buckets"]
        check(len(month) >= 719, f"h042 answers {len(month)} hourly buckets for the last 30 days")

        render, charts, fetched, per_url = measure_load(browser, server.base + "/")
        for url, size in sorted(per_url.items(), key=lambda kv: -kv[1]):
            print(f"    {size:>8,} B  {url.replace(server.base, '')}")
        print(f"  FIGURES first render {render:.0f} ms (charts {charts:.0f} ms), fetched {fetched:,} bytes ({fetched / 1024:.1f} KB) "
              f"with {queues} queues of 30 days' history")
        check(render <= RENDER_BUDGET_MS and charts <= RENDER_BUDGET_MS,
              f"first render {render:.0f} ms, overview charts {charts:.0f} ms <= {RENDER_BUDGET_MS} ms")
        check(fetched <= BYTES_BUDGET, f"fetched {fetched:,} B <= {BYTES_BUDGET:,} B")
        history = [u for u in per_url if "/history" in u]
        check(len(history) == 2 and all("/v1/history?" in u for u in history),
              f"the overview reads GET /v1/history twice (hour, day) and no queue's history: {[u.replace(server.base, '') for u in history]}")
        check_charts(server, browser, "overview-charts", "/v1/history", "overview of 100 queues")
    finally:
        server.stop()


def seed_day(path, queues, now):
    """A plausible day for the screenshots: traffic that rises and falls over the day, a burst of
    failures, waits that grow with the load (rows as the server keeps them, see seed_history)."""
    con = sqlite3.connect(path)
    rows = []
    for qi, q in enumerate(queues):
        scale = (3, 1.2, 0.5)[qi % 3]
        hours = {}
        for i in range(1440):
            start = (now // 60 - i) * 60
            phase = (start % 86400) / 86400 * 2 * math.pi
            load = max(0.0, 1 + 0.8 * math.sin(phase + qi) + 0.3 * math.sin(start / 420.0 + qi * 2))
            done = int(scale * 12 * load)
            if done == 0:
                continue
            failed = int(done * 0.35) if (start // 60) % 97 in (40, 41, 42, 43) else int(done * 0.04 * (1 + math.sin(start / 900.0)))
            ok = done - failed
            cancelled = 1 if (start // 60) % 23 == 0 else 0
            slow = int(2 * load)  # the wait's upper bins fill as the load grows
            text = f"{done + cancelled} {done + failed // 2} {ok} {failed} {cancelled}|8:{done} {10 + slow}:{max(1, done // 5)}|9:{ok} 11:{failed + 1}"
            rows.append((q, 60, (start // 60) % 1440, start, text))
            h = hours.setdefault(start // 3600 * 3600, [0, 0, 0, 0, 0, 0])
            for j, v in enumerate((done + cancelled, done + failed // 2, ok, failed, cancelled, slow)):
                h[j] = max(h[j], v) if j == 5 else h[j] + v
        for start, (c, st, ok, f, ca, slow) in hours.items():
            rows.append((q, 3600, (start // 3600) % 720, start, f"{c} {st} {ok} {f} {ca}|8:{ok} {10 + slow}:{max(1, ok // 5)}|9:{ok} 11:{f + 1}"))
    con.executemany("INSERT OR REPLACE INTO history (queue, step, slot, start, data) VALUES (?, ?, ?, ?, ?)", rows)
    con.commit()
    con.close()


def run_screenshots(binary, browser, out):
    """docs/dashboard-overview.png and docs/dashboard-queue.png: three queues with a day of
    history (seeded, see seed_day), work in flight, a schedule and a live tail."""
    print("\n== screenshots", flush=True)
    server = Server(binary)
    try:
        for name, limit in (("emails", 8), ("images", 2), ("reports", 1)):
            server.must("POST", "/v1/queues", {"name": name, "maxConcurrentOperationCount": limit})
        server.must("POST", "/v1/queues/emails/schedules", {"name": "digest", "cron": "0 7 * * mon-fri", "timezone": "Europe/Berlin",
                                                              "operation": {"kind": "delay", "spec": {"seconds": 2}}})
        server.must("POST", "/v1/queues/reports/schedules", {"name": "hourly", "every": 3600, "operation": {"kind": "delay", "spec": {"seconds": 5}}})
        port = server.port
        server.halt()
        seed_day(os.path.join(server.data, "db", "opqd.sqlite"), ["emails", "images", "reports"], int(time.time()))
        server.start(port)
        for i in range(6):
            add_delay(server, "emails", 300, f"welcome-{i}")
        for i in range(3):
            add_delay(server, "images", 300, f"thumbnail-{i}")
        add_delay(server, "reports", 300, "quarterly")
        browser.goto(server.base + "/", width=1400, height=860)
        browser.until("the overview", "document.body.dataset.queuesRendered === 'true' && document.body.dataset.chartsRendered === '*'")
        for i in range(4):
            add_delay(server, "emails", 0.05, f"receipt-{i}")
        browser.pump(1.5)
        path = os.path.join(out, "dashboard-overview.png")
        browser.screenshot(path)
        print(f"  saved {path}")
        browser.eval("location.hash = '#/q/emails'")
        browser.until("the queue view", "document.body.dataset.chartsRendered === 'emails' && document.querySelectorAll('#ops-body tr').length > 0 && "
                      "!document.getElementById('q-sched').hidden")
        browser.pump(1.0)
        path = os.path.join(out, "dashboard-queue.png")
        browser.screenshot(path)
        print(f"  saved {path}")
    finally:
        server.stop()


def main():
    # `timeout` (scripts/dashboard-check.sh) ends a run that hangs with SIGTERM: unwind through
    # the finally blocks, so the servers and Chromium started here are stopped and removed.
    def terminated(*_):
        raise SystemExit("dashboard-check: terminated")
    signal.signal(signal.SIGTERM, terminated)
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=".build/debug/opqd")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    ap.add_argument("--screenshot", metavar="DIR", help="save dashboard-overview.png and dashboard-queue.png here")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--only", choices=["basic", "resume", "panels", "token", "scale"])
    ap.add_argument("--per-queue", type=int, default=1000)
    args = ap.parse_args()
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"dashboard-check: {args.binary} is not an executable; build first")

    browser = Browser(args.chromium)
    try:
        if args.only in (None, "basic"):
            run_basic(args.binary, browser)
        if args.only in (None, "resume"):
            run_resume(args.binary, browser)
        if args.only in (None, "panels"):
            run_panels(args.binary, browser)
        if args.only in (None, "token"):
            run_token(args.binary, browser)
        if args.only == "scale" or (args.only is None and not args.skip_scale):
            run_scale(args.binary, browser, per_queue=args.per_queue)
            run_history_scale(args.binary, browser)
        if args.screenshot:
            run_screenshots(args.binary, browser, args.screenshot)
    except Exception as e:  # a timeout or a broken step: report it as a failure, clean up below
        failures.append(f"{type(e).__name__}: {e}")
        print(f"  FAIL  {type(e).__name__}: {e}", flush=True)
    finally:
        browser.close()
    if failures:
        print(f"\ndashboard-check: {len(failures)} failure(s):")
        for f in failures:
            print("  - " + f)
        sys.exit(1)
    print("\ndashboard-check: all checks passed")


if __name__ == "__main__":
    main()
