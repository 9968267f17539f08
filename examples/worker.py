#!/usr/bin/env python3
"""An opqd worker for `external` operations, standard library only.

It claims operations from a queue in batches (`claim?wait=30&max=N`, a long poll), runs up
to `--concurrency` of them at once, heartbeats each while it works, reports progress, and
finishes them in batches (`POST /v1/operations:finish`, one request for many). It stops an
operation when the server says it was cancelled, and holds it while it is paused.

    python3 examples/worker.py --url http://127.0.0.1:8080 --queue jobs --name worker-1 \\
        --concurrency 16 --batch 16

`--drain` exits once a claim finds nothing (for scripts and tests); `--batch 1` claims one
at a time (`claim` without `max`) and finishes each on its own, as older servers need.
"""
import argparse
import http.client
import json
import queue
import sys
import threading
import time
import urllib.parse


class Client:
    """One keep-alive HTTP/1.1 connection per thread."""

    def __init__(self, base, token=None, timeout=70):
        u = urllib.parse.urlsplit(base)
        if u.scheme != "http":
            raise SystemExit(f"--url must be http://host:port, got {base!r}")
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout
        self.local = threading.local()

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                conn.request(method, path, body=data, headers=self.headers)
                r = conn.getresponse()
                raw = r.read()
                return r.status, (json.loads(raw) if raw else None)
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise


class Finisher(threading.Thread):
    """Collects finished jobs and sends them in batches: when `batch` are waiting, or 50 ms
    after the first of them, whichever comes first."""

    def __init__(self, client, batch):
        super().__init__(daemon=True)
        self.client, self.batch = client, batch
        self.inbox = queue.Queue()
        self.done = 0

    def run(self):
        while True:
            first = self.inbox.get()
            if first is None:
                return
            items, deadline = [first], time.monotonic() + 0.05
            stop = False
            while len(items) < self.batch:
                try:
                    item = self.inbox.get(timeout=max(0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                items.append(item)
            self.send(items)
            if stop:
                return

    def send(self, items):
        if self.batch == 1:
            for op_id, element in items:
                status, answer = self.client.call("POST", f"/v1/operations/{op_id}/finish", element)
                self.report(op_id, status, answer, answer)
            return
        status, answer = self.client.call(
            "POST", "/v1/operations:finish", {"finishes": [dict(element, id=op_id) for op_id, element in items]})
        if status != 200:
            print(f"finish of {len(items)} refused: {status} {answer}", file=sys.stderr)
            return
        for (op_id, _), entry in zip(items, answer["finishes"]):
            self.report(op_id, entry["status"], entry.get("operation"), entry.get("problem"))

    def report(self, op_id, status, operation, problem):
        if status == 200:
            self.done += 1
            print(f"finished {op_id}: {operation.get('outcome') or operation.get('state')}")
        else:
            print(f"finish of {op_id} refused: {status} {problem and problem.get('detail')}", file=sys.stderr)


def work(client, op, token, steps, step_seconds):
    """Pretends to work in `steps` steps, heartbeating and reporting progress. Returns the
    finish element, or None when the operation was cancelled or the lease lost."""
    op_id = op["id"]
    for step in range(1, steps + 1):
        status, hb = client.call("POST", f"/v1/operations/{op_id}/heartbeat", {"leaseToken": token})
        if status != 200:
            print(f"lost the lease of {op_id}: {hb and hb.get('detail')}", file=sys.stderr)
            return None
        if hb["isCancelled"]:
            print(f"{op_id} was cancelled; stopping")
            return None
        while hb["isPaused"]:
            time.sleep(0.5)
            status, hb = client.call("POST", f"/v1/operations/{op_id}/heartbeat", {"leaseToken": token})
            if status != 200 or hb["isCancelled"]:
                return None
        time.sleep(step_seconds)  # the real work goes here
        client.call("POST", f"/v1/operations/{op_id}/progress", {"leaseToken": token, "completed": step, "total": steps})
    return {"leaseToken": token, "result": {"worker": "python", "steps": steps}}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--queue", required=True)
    p.add_argument("--name", default="python-worker")
    p.add_argument("--token", help="bearer token (the server's --token)")
    p.add_argument("--concurrency", type=int, default=8, help="jobs run at once (default 8)")
    p.add_argument("--batch", type=int, default=8, help="claim and finish up to this many per request, 1-100 (default 8)")
    p.add_argument("--steps", type=int, default=5, help="heartbeat/progress steps per job (default 5)")
    p.add_argument("--step-seconds", type=float, default=0.1, help="pretend work per step (default 0.1)")
    p.add_argument("--drain", action="store_true", help="exit once a claim finds nothing and every job is done")
    p.add_argument("--wait", type=float, default=30, help="claim long poll, seconds (default 30; --drain uses 1)")
    a = p.parse_args()
    if not 1 <= a.batch <= 100 or a.concurrency < 1:
        raise SystemExit("--batch must be 1-100 and --concurrency at least 1")
    client = Client(a.url, a.token)
    finisher = Finisher(client, a.batch)
    finisher.start()
    slots = threading.Semaphore(a.concurrency)
    running = []

    def run(op, token):
        try:
            element = work(client, op, token, a.steps, a.step_seconds)
            if element is not None:
                finisher.inbox.put((op["id"], element))
        except Exception as e:  # a worker keeps going when one job fails
            print(f"{op['id']}: {e}", file=sys.stderr)
        finally:
            slots.release()

    wait = 1 if a.drain else a.wait
    while True:
        slots.acquire()  # at least one free slot before asking for work
        free = 1
        while free < a.batch and slots.acquire(blocking=False):
            free += 1
        path = f"/v1/queues/{a.queue}/claim?wait={wait}" + (f"&max={free}" if a.batch > 1 else "")
        status, answer = client.call("POST", path, {"worker": a.name})
        claims = []
        if status == 200:
            claims = answer["claims"] if a.batch > 1 else [answer]
        elif status != 204:
            print(f"claim failed: {status} {answer}", file=sys.stderr)
            time.sleep(1)
        for _ in range(free - len(claims)):
            slots.release()  # slots asked for but not filled
        for c in claims:
            t = threading.Thread(target=run, args=(c["operation"], c["lease"]["token"]), daemon=True)
            t.start()
            running.append(t)
        running = [t for t in running if t.is_alive()]
        if status == 204 and a.drain and not running:
            break
    finisher.inbox.put(None)
    finisher.join()
    print(f"{a.name}: finished {finisher.done}")


if __name__ == "__main__":
    main()
