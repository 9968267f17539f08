#!/usr/bin/env python3
"""An opqd worker for `external` operations, standard library only.

It claims an operation from a queue (long poll), heartbeats while it works, reports
progress and finishes it — or stops when the server says the operation was cancelled,
and holds while it is paused.

    python3 examples/worker.py --url http://127.0.0.1:8080 --queue jobs --name worker-1
"""
import argparse
import json
import sys
import time
import urllib.error
import urllib.request


def call(base, method, path, body=None, timeout=70):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else None)


def work(base, op, token, steps=5):
    """Pretend to work in `steps` steps, heartbeating and reporting progress."""
    for step in range(1, steps + 1):
        status, hb = call(base, "POST", f"/v1/operations/{op['id']}/heartbeat", {"leaseToken": token})
        if status != 200:
            print(f"lost the lease of {op['id']}: {hb and hb.get('detail')}", file=sys.stderr)
            return
        if hb["isCancelled"]:
            print(f"{op['id']} was cancelled; stopping")
            return
        while hb["isPaused"]:
            time.sleep(0.5)
            status, hb = call(base, "POST", f"/v1/operations/{op['id']}/heartbeat", {"leaseToken": token})
            if status != 200 or hb["isCancelled"]:
                return
        time.sleep(0.1)  # the real work goes here
        call(base, "POST", f"/v1/operations/{op['id']}/progress",
             {"leaseToken": token, "completed": step, "total": steps})
    status, done = call(base, "POST", f"/v1/operations/{op['id']}/finish",
                        {"leaseToken": token, "result": {"worker": "python", "steps": steps}})
    print(f"finished {op['id']}: {status} {done and done.get('outcome')}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--queue", required=True)
    p.add_argument("--name", default="python-worker")
    p.add_argument("--once", action="store_true", help="handle one operation, then exit")
    a = p.parse_args()
    while True:
        status, claim = call(a.url, "POST", f"/v1/queues/{a.queue}/claim?wait=30", {"worker": a.name})
        if status == 204:
            continue  # nothing came within the wait; poll again
        if status != 200:
            print(f"claim failed: {status} {claim}", file=sys.stderr)
            time.sleep(1)
            continue
        work(a.url, claim["operation"], claim["lease"]["token"])
        if a.once:
            return


if __name__ == "__main__":
    main()
