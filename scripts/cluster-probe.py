#!/usr/bin/env python3
"""Mixed traffic through a rolling restart, a kill -9, a join and a scale-down of opqd instances
on one PostgreSQL, as an outside client sees it (CLUSTER.md "Instances that come and go").

    scripts/pg.sh start /tmp/probe-pg > /tmp/probe-pg.url
    python3 scripts/cluster-probe.py .build/release/opqd "$(cat /tmp/probe-pg.url)" /tmp/probe-run
    scripts/pg.sh stop /tmp/probe-pg

Clients send only to instances that are up (as behind a load balancer): creates, cross-owner
batches, external operations claimed (max=5) and finished one by one and in bulk, others held
8 s by their worker (paused half of the time) with heartbeats through any instance, reads, lists,
the feed, cancel/pause/resume, waits on operations and queues and the feed's long poll (LONG
seconds, default 10), and an event stream that reconnects with Last-Event-ID. Prints every answer
by route and status, then what went wrong by phase (rolling, crash, join), with the slowest;
whether the stream saw every event the feed has; and whether every acknowledged operation exists.
Outside the crash phase nothing should be refused; during it, 503 owner-unavailable / no-owner
until the lease (3 s) runs out is the contract. Ports: PORTS (default 27101-27103, below the ephemeral range, and the next
for the joining instance). Bounded: a few minutes; it stops every process it started.
"""
import http.client, json, os, random, signal, subprocess, sys, threading, time, collections

if len(sys.argv) != 4:
    sys.exit("usage: cluster-probe.py OPQD_BINARY POSTGRES_URL SCRATCH_DIR")
BIN, PG, DIR = sys.argv[1], sys.argv[2], sys.argv[3]
PORTS = [int(p) for p in os.environ.get("PORTS", "27101,27102,27103").split(",")]
SECONDS_BETWEEN = float(os.environ.get("GAP", "6"))
os.makedirs(DIR, exist_ok=True)
procs = {}
up = list(range(len(PORTS)))
uplock = threading.Lock()
epoch = {}
stats = collections.Counter()
bad = []
badlock = threading.Lock()
stop = threading.Event()


def start(i):
    log = open(f"{DIR}/opqd-{i}.log", "ab")
    procs[i] = subprocess.Popen([BIN, "--store", PG, "--lease", "3", "--port", str(PORTS[i]), "--data", f"{DIR}/data-{i}",
                                 "--log-level", os.environ.get("LOGLEVEL", "info")], stdout=log, stderr=log)


def ready(i, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORTS[i], timeout=2)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return True
        except Exception:
            pass
        time.sleep(0.05)
    return False


class Client:
    def __init__(self):
        self.conns = {}
        self.epochs = {}

    def call(self, route, method, path, body=None, timeout=20):
        with uplock:
            i = random.choice(up)
        t = time.time()
        try:
            with uplock: e = epoch.get(i, 0)
            c = self.conns.get(i)
            if c is not None and self.epochs.get(i) != e:
                c.close(); c = None
            self.epochs[i] = e
            if c is None:
                c = http.client.HTTPConnection("127.0.0.1", PORTS[i], timeout=timeout)
                self.conns[i] = c
            # This call's own timeout on a connection kept from another route's call.
            c.timeout = timeout
            if c.sock is not None:
                c.sock.settimeout(timeout)
            data = json.dumps(body).encode() if body is not None else None
            c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
            r = c.getresponse()
            raw = r.read()
            st = r.status
            if r.getheader("Connection", "").lower() == "close":
                c.close(); self.conns.pop(i, None)
        except Exception as e:
            self.conns.pop(i, None)
            # A connection the stopping instance closed between requests: retry once elsewhere,
            # as a client library would for an idle keep-alive connection (only if nothing was sent back).
            stats[(route, "conn-error")] += 1
            with badlock:
                bad.append((route, "conn", f"#{i} {type(e).__name__} {e}", time.time() - t, t))
            return None, None
        d = time.time() - t
        stats[(route, st)] += 1
        try:
            j = json.loads(raw) if raw else None
        except Exception:
            j = None
        # A worker's lease is refused nowhere it is held (kept across handovers, also paused).
        leased = route in ("heartbeat", "finish", "finish-kept", "pause-leased", "resume-leased") and st == 409
        if st >= 500 or leased or d > (32 if route == "wait-default" else LONG + 2):
            with badlock:
                bad.append((route, st, f"#{i} {path} {raw[:300]!r}", d, t))
        return st, j


QUEUES = [f"mq-{k}" for k in range(12)]
LONG = float(os.environ.get("LONG", "10"))


def waiter(seed):
    cl = Client(); rnd = random.Random(seed)
    after = None
    while not stop.is_set():
        with lock:
            ids = acked[-50:]
        what = rnd.choice(["op", "queue", "feed", "default"])
        if what == "default" and ids:
            # Without a timeout: 30 s by default.
            cl.call("wait-default", "GET", f"/v1/operations/{rnd.choice(ids)}/wait", timeout=60)
        elif what == "op" and ids:
            cl.call("wait-op-long", "GET", f"/v1/operations/{rnd.choice(ids)}/wait?timeout={LONG}", timeout=LONG + 20)
        elif what == "queue":
            cl.call("wait-queue", "GET", f"/v1/queues/{rnd.choice(QUEUES)}/wait?timeout={LONG}", timeout=LONG + 20)
        else:
            if after is None:
                st, j = cl.call("feed", "GET", "/v1/events?limit=1&after=0")
                after = 0
            st, j = cl.call("feed-wait", "GET", f"/v1/events?after={after}&limit=1000&wait={LONG}", timeout=LONG + 20)
            if st == 200 and j and j.get("events"):
                after = j["events"][-1]["seq"]
            elif st == 410 and j:
                import re
                m = re.search(r"after=(\d+)", j.get("detail", ""))
                after = int(m.group(1)) if m else 0
EXT = [f"mx-{k}" for k in range(6)]
acked = []
ext_acked = []
finished_ext = set()
lock = threading.Lock()


def creator(seed):
    cl = Client(); rnd = random.Random(seed)
    while not stop.is_set():
        q = rnd.choice(QUEUES)
        st, j = cl.call("create", "POST", f"/v1/queues/{q}/operations", {"kind": "delay", "spec": {"seconds": rnd.choice([0.01, 0.2, 3])}})
        if st == 201 and j:
            with lock: acked.append(j["id"])


def batcher(seed):
    cl = Client(); rnd = random.Random(seed)
    while not stop.is_set():
        qs = rnd.sample(QUEUES, 4)
        st, j = cl.call("batch", "POST", "/v1/operations:batch", {"operations": [{"queue": q, "kind": "delay", "spec": {"seconds": 0.05}} for q in qs]})
        if st == 201 and j:
            with lock: acked.extend(o["id"] for o in j["operations"])


def producer(seed):
    cl = Client(); rnd = random.Random(seed)
    while not stop.is_set():
        q = rnd.choice(EXT)
        st, j = cl.call("create-ext", "POST", f"/v1/queues/{q}/operations", {"kind": "external"})
        if st == 201 and j:
            with lock: ext_acked.append(j["id"])
        time.sleep(0.01)


def worker(seed):
    cl = Client(); rnd = random.Random(seed)
    while not stop.is_set() or True:
        if stop.is_set() and draining.is_set():
            return
        q = rnd.choice(EXT)
        st, j = cl.call("claim", "POST", f"/v1/queues/{q}/claim?wait={LONG}&max=5")
        if st != 200 or not j:
            continue
        if any(not c.get("operation") or not c.get("lease") for c in j.get("claims", [None])):
            with badlock: bad.append(("claim", "odd", json.dumps(j)[:600], 0, time.time()))
            continue
        fins = [{"id": c["operation"]["id"], "leaseToken": c["lease"]["token"], "result": {"ok": 1}} for c in j["claims"]]
        if rnd.random() < 0.5:
            st2, j2 = cl.call("finish-bulk", "POST", "/v1/operations:finish", {"finishes": fins})
            if st2 == 200 and j2:
                for f, r in zip(fins, j2.get("finishes", [])):
                    stats[("finish-bulk element", r.get("status"))] += 1
                    if r.get("status") != 200:
                        with badlock:
                            bad.append(("finish-bulk element", r.get("status"), json.dumps(r)[:300], 0, time.time()))
        else:
            for f in fins:
                st2, j2 = cl.call("finish", "POST", f"/v1/operations/{f['id']}/finish", {"leaseToken": f["leaseToken"], "result": {"ok": 1}})


def keeper(seed):
    """Holds one claimed operation for 8 s (across whatever restart comes), paused half of the
    time, heartbeating every 0.5 s through any instance, then resumes and finishes it."""
    cl = Client(); rnd = random.Random(seed)
    while not stop.is_set():
        q = rnd.choice(EXT)
        st, j = cl.call("claim", "POST", f"/v1/queues/{q}/claim?wait={LONG}")
        if st != 200 or not j or not j.get("lease") or not j.get("operation"):
            continue
        op, token = j["operation"]["id"], j["lease"]["token"]
        paused = rnd.random() < 0.5
        if paused:
            cl.call("pause-leased", "POST", f"/v1/operations/{op}/pause")
        end = time.time() + 8
        while time.time() < end and not stop.is_set():
            st2, j2 = cl.call("heartbeat", "POST", f"/v1/operations/{op}/heartbeat", {"leaseToken": token})
            if st2 == 200 and j2 and bool(j2.get("isPaused")) != paused:
                with badlock:
                    bad.append(("heartbeat", "isPaused", f"{op} paused={paused}: {json.dumps(j2)[:300]}", 0, time.time()))
            time.sleep(0.5)
        if paused:
            cl.call("resume-leased", "POST", f"/v1/operations/{op}/resume")
        cl.call("finish-kept", "POST", f"/v1/operations/{op}/finish", {"leaseToken": token, "result": {"kept": 1}})


def reader(seed):
    cl = Client(); rnd = random.Random(seed)
    after = 0
    while not stop.is_set():
        with lock:
            ids = acked[-200:]
        if ids:
            cl.call("get-op", "GET", f"/v1/operations/{rnd.choice(ids)}")
        cl.call("get-queue", "GET", f"/v1/queues/{rnd.choice(QUEUES)}")
        st, j = cl.call("feed", "GET", f"/v1/events?after={after}&limit=200")
        if st == 200 and j and j.get("events"):
            after = j["events"][-1]["seq"]
        cl.call("list", "GET", f"/v1/queues/{rnd.choice(QUEUES)}/operations?limit=20")


def fiddler(seed):
    cl = Client(); rnd = random.Random(seed)
    while not stop.is_set():
        with lock:
            ids = acked[-300:]
        if not ids:
            time.sleep(0.01); continue
        op = rnd.choice(ids)
        what = rnd.choice(["cancel", "pause", "resume", "wait"])
        if what == "wait":
            cl.call("wait-op", "GET", f"/v1/operations/{op}/wait?timeout={LONG}")
        else:
            cl.call(what, "POST", f"/v1/operations/{op}/{what}")


draining = threading.Event()
sse_seen = []
sse_problems = []
sse_reconnects = [0]


def sse(seed):
    rnd = random.Random(seed)
    last = None
    while not stop.is_set():
        with uplock:
            i = rnd.choice(up)
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORTS[i], timeout=30)
            headers = {"Last-Event-ID": str(last)} if last is not None else {}
            path = "/v1/events/stream" if last is not None else "/v1/events/stream?after=" + str(start_seq[0])
            c.request("GET", path, headers=headers)
            r = c.getresponse()
            if r.status != 200:
                sse_problems.append(f"#{i} {r.status} {r.read()[:200]!r}")
                time.sleep(0.2)
                continue
            while not stop.is_set():
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"id:"):
                    seq = int(line[3:].strip())
                    if last is not None and seq <= last:
                        sse_problems.append(f"#{i} seq {seq} after {last}")
                    last = seq
                    sse_seen.append(seq)
            c.close()
        except Exception as e:
            pass
        sse_reconnects[0] += 1


start_seq = [0]
phase_marks = [("rolling", 0)]


def main():
    for i in range(len(PORTS)):
        start(i)
    for i in range(len(PORTS)):
        assert ready(i), f"#{i} not ready"
    c = Client()
    for q in QUEUES + EXT:
        st, _ = c.call("setup", "POST", "/v1/queues", {"name": q, "maxConcurrentOperationCount": 8})
        assert st in (201, 409), st
    st, j = c.call("setup", "GET", "/v1/events?after=0&limit=1")
    if st == 410 and j:
        import re
        m = re.search(r"after=(\d+)", j.get("detail", ""))
        start_seq[0] = int(m.group(1)) if m else 0
    # the newest seq: page to the end quickly
    while True:
        st, j = c.call("setup", "GET", f"/v1/events?after={start_seq[0]}&limit=10000")
        if st != 200 or not j or not j.get("events"): break
        start_seq[0] = j["events"][-1]["seq"]
    threads = []
    for k, f in enumerate([creator, creator, creator, batcher, producer, producer, worker, worker, worker, keeper, keeper, keeper, reader, fiddler,
                           waiter, waiter, waiter, waiter, waiter, waiter, sse]):
        t = threading.Thread(target=f, args=(k,), daemon=True); t.start(); threads.append(t)
    time.sleep(4)
    for i in range(len(PORTS)):
        with uplock: up.remove(i); epoch[i] = epoch.get(i, 0) + 1
        t0 = time.time()
        procs[i].send_signal(signal.SIGTERM)
        rc = procs[i].wait(30)
        print(f"#{i} stopped in {time.time() - t0:.2f} s rc={rc}", flush=True)
        start(i)
        assert ready(i), f"#{i} not ready after restart"
        with uplock: up.append(i)
        print(f"#{i} back, ready", flush=True)
        time.sleep(SECONDS_BETWEEN)
    # A crash: kill -9 of one instance, restarted 4 s later on the same data (503 allowed meanwhile).
    phase_marks.append(("crash", time.time()))
    with uplock: up.remove(1); epoch[1] = epoch.get(1, 0) + 1
    procs[1].kill(); procs[1].wait(10)
    print("#1 killed", flush=True)
    time.sleep(4)
    start(1)
    assert ready(1), "#1 not ready after crash restart"
    with uplock: up.append(1)
    print("#1 back after crash", flush=True)
    time.sleep(5)
    phase_marks.append(("join", time.time()))
    print("join phase at", time.strftime("%H:%M:%S", time.gmtime()), flush=True)
    # Scale-up: a 4th instance joins, then leaves (scale-down).
    PORTS.append(PORTS[-1] + 1)
    start(3)
    assert ready(3), "#3 not ready"
    with uplock: up.append(3)
    print("#3 joined", flush=True)
    time.sleep(SECONDS_BETWEEN)
    with uplock: up.remove(3); epoch[3] = epoch.get(3, 0) + 1
    procs[3].send_signal(signal.SIGTERM)
    print(f"#3 left rc={procs[3].wait(30)}", flush=True)
    phase_marks.append(("end", time.time()))
    time.sleep(2)
    stop.set()
    time.sleep(3)
    draining.set()
    for t in threads: t.join(10)
    print("answers by route and status:")
    for (route, st), n in sorted(stats.items(), key=lambda x: (x[0][0], str(x[0][1]))):
        print(f"  {route:12} {st}: {n}")
    print(f"findings ({len(bad)}):")
    def phase(t):
        name = "rolling"
        for n, at in phase_marks:
            if t >= at: name = n
        return name
    import re as _re
    groups = collections.OrderedDict()
    for b in bad:
        kind = _re.search(r'problems/([a-z-]+)', b[2])
        key = (phase(b[4] + b[3]), b[0], b[1], kind.group(1) if kind else "")
        groups.setdefault(key, []).append(b)
    for key, items in groups.items():
        print(f"   {key}: {len(items)}; slowest {max(i[3] for i in items):.2f} s; e.g. {items[0][2][:220]}")
        if key[0] != "crash":
            for i in items[:5]:
                print("      ", time.strftime("%H:%M:%S", time.gmtime(i[4])) + f".{int(i[4]*1000)%1000:03d}", f"+{i[3]:.2f}s", i[2][:160])
    # every acknowledged operation exists
    cl = Client(); missing = []
    for op in acked + ext_acked:
        st, j = cl.call("check", "GET", f"/v1/operations/{op}")
        if st != 200: missing.append((op, st))
    # The stream saw every event the feed has, in order, across its reconnects.
    feed = []
    after = start_seq[0]
    while sse_seen and after < sse_seen[-1]:
        st, j = cl.call("check", "GET", f"/v1/events?after={after}&limit=10000")
        if st != 200 or not j or not j.get("events"): break
        feed.extend(e["seq"] for e in j["events"])
        after = j["events"][-1]["seq"]
    feed = [x for x in feed if x <= (sse_seen[-1] if sse_seen else 0)]
    missing_sse = sorted(set(feed) - set(sse_seen))
    extra_sse = sorted(set(sse_seen) - set(feed))
    print(f"stream: {len(sse_seen)} events over {sse_reconnects[0]} reconnects; problems {len(sse_problems)} {sse_problems[:3]}; feed has {len(feed)} up to the stream's last; missing from stream {len(missing_sse)} {missing_sse[:5]}; in stream not feed {len(extra_sse)} {extra_sse[:5]}")
    print(f"acked {len(acked)} delay/batch, {len(ext_acked)} external; not found after: {len(missing)} {missing[:5]}")
    for i in range(len(PORTS)):
        procs[i].send_signal(signal.SIGTERM)
    for i in range(len(PORTS)):
        procs[i].wait(30)


try:
    main()
finally:
    for p in procs.values():
        if p.poll() is None:
            p.kill()
