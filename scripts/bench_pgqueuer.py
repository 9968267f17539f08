"""The measuring half of scripts/bench-pgqueuer.sh: pgqueuer beside opqd on one PostgreSQL server.

Run by the script inside a scratch venv that has pgqueuer, asyncpg and psycopg; the script has
already started PostgreSQL (one server, a database for each system) and one opqd on its own
database, and passes their addresses. Every producer and worker is a Python process of its own
(multiprocessing, forkserver), with one connection each, made before the clock starts:

  pgqueuer  producer: Queries.enqueue(lists) of --enqueue-batch jobs per call (one INSERT ... SELECT
                      FROM unnest statement, autocommit: one commit per call).
            worker:   PgQueuer(...).qm.run(batch_size=--batch), continuous mode, an async no-op
                      entrypoint, every other setting pgqueuer's default: a dequeue statement picks
                      up to --batch rows (one commit), each completion goes into its
                      JobStatusLogBuffer, which commits them (DELETE from the queue + INSERT into
                      the log, one statement) when --batch are buffered or every ~0.1 s. A job
                      counts as complete once the statement holding its completion has returned.
  opqd      producer: POST /v1/operations:batch with --enqueue-batch external operations
                      (answered 201 after its commit); the answer is parsed (json) for its ids.
            worker:   POST /v1/queues/{q}/claim?wait=1&max=--batch, then one
                      POST /v1/operations:finish for everything claimed (answered after its
                      commit), one http.client keep-alive connection; a job counts as complete
                      once that answer says 200 for it.

Phases, for each system, alternating which system goes first each round:
  enqueue  the producers alone put N jobs in (nothing consumes them): from the start signal to
           the last producer's last answer;
  drain    the workers alone take those N jobs: from the start signal to the last completion;
  e2e      producers and workers together on N new jobs: from the start signal to the last
           completion.
CPU: utime + stime of the opqd process, and of PostgreSQL (the postmaster's own and reaped
children's times plus its live children's) from /proc, before and after each phase; the
clients' own CPU as each process reports it. PostgreSQL's xact_commit (of the system's own
database) and WAL bytes and syncs (the whole server) are read 1.5 s after each phase, once the
backends have reported them.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
import urllib.parse

import asyncpg
import psycopg
from pgqueuer import PgQueuer, Queries
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

ENTRYPOINT = "noop"
OPQD_QUEUE = "pgq-compare"


# --------------------------------------------------------------------------- /proc


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    f = _stat_fields(pid)
    return (int(f[11]) + int(f[12])) / TICK if f else 0.0


def postgres_cpu(postmaster: int) -> float:
    """The postmaster's utime, stime, cutime, cstime, plus every live child's utime + stime."""
    ticks = 0
    f = _stat_fields(postmaster)
    if f:
        ticks += sum(int(x) for x in f[11:15])
    parent = str(postmaster)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        g = _stat_fields(int(entry))
        if g and g[1] == parent:
            ticks += int(g[11]) + int(g[12])
    return ticks / TICK


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


# --------------------------------------------------------------------------- pgqueuer side


def pgq_producer(dsn, count, batch, ready, go, results):
    cpu = [0.0]  # at the start signal

    async def main():
        conn = await asyncpg.connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            ready.put(os.getpid())
            go.wait()
            cpu[0] = own_cpu()
            ids = 0
            left = count
            while left > 0:
                k = min(batch, left)
                ids += len(await queries.enqueue([ENTRYPOINT] * k, [None] * k, [0] * k))
                left -= k
            return ids, time.monotonic()
        finally:
            await conn.close()

    try:
        ids, end = asyncio.run(main())
        results.put({"role": "producer", "created": ids, "end": end, "cpu": own_cpu() - cpu[0]})
    except BaseException as e:  # noqa: BLE001 - reported, not raised
        results.put({"role": "producer", "error": repr(e), "cpu": own_cpu() - cpu[0]})


def pgq_worker(dsn, batch, target, done, stop, ready, go, results):
    executed: list[int] = []
    state = {"completed": 0, "last": 0.0, "cpu": 0.0}

    class CountingQueries(Queries):
        """pgqueuer's Queries, counting completions once their statement has returned."""

        async def log_jobs(self, job_status):
            await super().log_jobs(job_status)
            n = sum(1 for _, status, _ in job_status if status == "successful")
            state["completed"] += n
            state["last"] = time.monotonic()
            with done.get_lock():
                done.value += n

    async def main():
        conn = await asyncpg.connect(dsn)
        try:
            driver = AsyncpgDriver(conn)
            pgq = PgQueuer(driver, queries=CountingQueries(driver))

            @pgq.entrypoint(ENTRYPOINT)
            async def noop(job: Job) -> None:
                executed.append(job.id)

            # The schema check qm.run starts with is made now, before the clock (as the opqd
            # workers connect before it), and not again inside it.
            await pgq.qm.verify_structure()

            async def verified() -> None:
                return None

            pgq.qm.verify_structure = verified
            ready.put(os.getpid())
            go.wait()
            state["cpu"] = own_cpu()

            async def watch() -> None:
                while done.value < target and not stop.is_set():
                    await asyncio.sleep(0.005)
                pgq.qm.shutdown.set()

            watcher = asyncio.create_task(watch())
            await pgq.qm.run(batch_size=batch)
            await watcher
        finally:
            await conn.close()

    try:
        asyncio.run(main())
        results.put({"role": "worker", "completed": state["completed"], "last": state["last"], "ids": executed,
                     "cpu": own_cpu() - state["cpu"]})
    except BaseException as e:  # noqa: BLE001
        results.put({"role": "worker", "error": repr(e), "completed": state["completed"], "last": state["last"],
                     "ids": executed, "cpu": own_cpu() - state["cpu"]})


# --------------------------------------------------------------------------- opqd side


def _http(base: str) -> http.client.HTTPConnection:
    u = urllib.parse.urlsplit(base)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.connect()
    return c


def _post(c: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, bytes]:
    c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, r.read()


def opqd_producer(base, count, batch, ready, go, results):
    try:
        c = _http(base)
        element = json.dumps({"queue": OPQD_QUEUE, "kind": "external", "spec": {"lease": 60}})
        ready.put(os.getpid())
        go.wait()
        cpu0 = own_cpu()
        created, refused, left = 0, {}, count
        while left > 0:
            k = min(batch, left)
            status, body = _post(c, "/v1/operations:batch", ('{"operations":[' + ",".join([element] * k) + "]}").encode())
            if status == 201:
                created += len(json.loads(body)["operations"])
            else:
                refused[status] = refused.get(status, 0) + k
            left -= k
        end = time.monotonic()
        c.close()
        results.put({"role": "producer", "created": created, "refused": refused, "end": end, "cpu": own_cpu() - cpu0})
    except BaseException as e:  # noqa: BLE001
        results.put({"role": "producer", "error": repr(e)})


def opqd_worker(base, batch, target, done, stop, ready, go, results, name):
    claimed: list[str] = []
    completed, last, refused, cpu0 = 0, 0.0, {}, own_cpu()
    try:
        c = _http(base)
        claim_path = f"/v1/queues/{OPQD_QUEUE}/claim?wait=1&max={batch}"
        claim_body = json.dumps({"worker": name}).encode()
        ready.put(os.getpid())
        go.wait()
        cpu0 = own_cpu()
        while done.value < target and not stop.is_set():
            status, body = _post(c, claim_path, claim_body)
            if status == 204:
                continue
            if status != 200:
                refused[f"claim {status}"] = refused.get(f"claim {status}", 0) + 1
                time.sleep(0.01)
                continue
            claims = json.loads(body)["claims"]
            claimed += [x["operation"]["id"] for x in claims]
            finishes = [{"id": x["operation"]["id"], "leaseToken": x["lease"]["token"], "result": {}} for x in claims]
            status, body = _post(c, "/v1/operations:finish", json.dumps({"finishes": finishes}).encode())
            if status != 200:
                refused[f"finish {status}"] = refused.get(f"finish {status}", 0) + len(finishes)
                continue
            ok = sum(1 for f in json.loads(body)["finishes"] if f.get("status") == 200)
            if ok < len(finishes):
                refused["finish element not 200"] = refused.get("finish element not 200", 0) + len(finishes) - ok
            completed += ok
            last = time.monotonic()
            with done.get_lock():
                done.value += ok
        c.close()
        results.put({"role": "worker", "completed": completed, "last": last, "ids": claimed, "refused": refused,
                     "cpu": own_cpu() - cpu0})
    except BaseException as e:  # noqa: BLE001
        results.put({"role": "worker", "error": repr(e), "completed": completed, "last": last, "ids": claimed,
                     "refused": refused, "cpu": own_cpu() - cpu0})


# --------------------------------------------------------------------------- orchestration


class Bench:
    def __init__(self, a):
        self.a = a
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["__main__"])
        self.admin = psycopg.connect(a.pg_url, autocommit=True)
        self.opqd_pid = a.opqd_pid
        self.postmaster = self._postmaster()
        self.children: list[mp.process.BaseProcess] = []
        self.problems: list[str] = []

    def _postmaster(self) -> int | None:
        row = self.admin.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'").fetchone()
        f = _stat_fields(row[0]) if row else None
        return int(f[1]) if f else None

    def sql(self, q, *args):
        return self.admin.execute(q, args).fetchone()

    def opqd_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        try:
            c = _http(self.a.opqd_url)
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
            c.close()
        except OSError:
            return out
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            key, value = line.rsplit(" ", 1)
            name = key.split("{", 1)[0]
            if name in ("opqd_store_commits_total", "opqd_store_records_total", "opqd_store_commit_duration_seconds_sum",
                        "opqd_http_requests_total"):
                out[name] = out.get(name, 0.0) + float(value)
        return out

    def server_counters(self, db: str) -> dict[str, float]:
        xact, = self.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", db)
        lsn, = self.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
        wal_sync, = self.sql("SELECT wal_sync FROM pg_stat_wal")
        return {"xact": float(xact), "wal": float(lsn), "wal_sync": float(wal_sync)}

    def wait_backends_gone(self, db: str) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            n, = self.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", db)
            if n == 0:
                return
            time.sleep(0.02)

    def start(self, target, args) -> mp.process.BaseProcess:
        p = self.ctx.Process(target=target, args=args, daemon=True)
        p.start()
        self.children.append(p)
        return p

    def stop_children(self) -> None:
        for p in self.children:
            if p.is_alive():
                p.terminate()
        for p in self.children:
            p.join(2)
            if p.is_alive():
                p.kill()
                p.join(1)
        self.children = []

    def phase(self, system: str, phase: str) -> dict:
        """One phase of one system; returns its figures (jobs_per_s None if it did not finish)."""
        a = self.a
        n = a.jobs
        producers = a.producers if phase in ("enqueue", "e2e") else 0
        workers = a.workers if phase in ("drain", "e2e") else 0
        ready, results = self.ctx.Queue(), self.ctx.Queue()
        go, stop = self.ctx.Event(), self.ctx.Event()
        done = self.ctx.Value("q", 0)
        db = a.pgq_db if system == "pgqueuer" else a.opqd_db
        for k in range(producers):
            share = n // producers + (1 if k < n % producers else 0)
            if system == "pgqueuer":
                self.start(pgq_producer, (a.pgq_dsn, share, a.enqueue_batch, ready, go, results))
            else:
                self.start(opqd_producer, (a.opqd_url, share, a.enqueue_batch, ready, go, results))
        for k in range(workers):
            if system == "pgqueuer":
                self.start(pgq_worker, (a.pgq_dsn, a.batch, n, done, stop, ready, go, results))
            else:
                self.start(opqd_worker, (a.opqd_url, a.batch, n, done, stop, ready, go, results, f"bench-{k}"))
        out = {"system": system, "phase": phase, "jobs": n, "jobs_per_s": None}
        try:
            for _ in range(producers + workers):
                ready.get(timeout=60)
        except Exception:  # noqa: BLE001
            self.problems.append(f"{system} {phase}: the clients did not connect within 60 s")
            self.stop_children()
            return out
        if a.statements:
            self.sql("SELECT pg_stat_statements_reset()")
        counters0 = self.server_counters(db)
        metrics0 = self.opqd_metrics() if system == "opqd" else {}
        opqd0 = process_cpu(self.opqd_pid)
        pg0 = postgres_cpu(self.postmaster) if self.postmaster else None
        t0 = time.monotonic()
        go.set()
        deadline = t0 + a.timeout
        got: list[dict] = []
        finished = False

        def is_done() -> bool:
            if workers:
                return done.value >= n
            while True:
                try:
                    got.append(results.get(timeout=0.001))
                except Exception:  # noqa: BLE001
                    return len(got) >= producers

        while time.monotonic() < deadline:
            if is_done():
                finished = True
                break
            if not any(p.is_alive() for p in self.children):
                time.sleep(0.1)
                finished = is_done()
                break  # every client has ended (each reports its error) without the phase being done
            time.sleep(0.002)
        opqd1 = process_cpu(self.opqd_pid)
        # opqd's connections stay: PostgreSQL's CPU is read now. pgqueuer's clients leave, and their
        # backends' CPU is PostgreSQL's once they have exited (below).
        pg1 = postgres_cpu(self.postmaster) if self.postmaster and system == "opqd" else None
        metrics1 = self.opqd_metrics() if system == "opqd" else {}
        stop.set()
        # A worker may be in a 1 s long poll (opqd) or winding down (pgqueuer): at most 15 s more.
        collect_until = time.monotonic() + 15
        while len(got) < producers + workers and time.monotonic() < collect_until:
            try:
                got.append(results.get(timeout=max(0.01, collect_until - time.monotonic())))
            except Exception:  # noqa: BLE001
                break
        for p in self.children:
            p.join(max(0.01, collect_until - time.monotonic()))
        self.stop_children()
        if system == "pgqueuer":
            self.wait_backends_gone(db)
            pg1 = postgres_cpu(self.postmaster) if self.postmaster else None
        time.sleep(1.5)
        counters1 = self.server_counters(db)
        if a.statements:
            out["statements"] = self.admin.execute(
                "SELECT calls, total_exec_time, rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 110)"
                " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)"
                " ORDER BY total_exec_time DESC LIMIT 10", (db,)).fetchall()
        if not finished:
            self.problems.append(f"{system} {phase}: not done within {a.timeout:g} s ({done.value} of {n} completed)")
        for r in got:
            if "error" in r:
                self.problems.append(f"{system} {phase} {r['role']}: {r['error']}")
            for k, v in (r.get("refused") or {}).items():
                self.problems.append(f"{system} {phase} {r['role']}: {v} x {k}")
        prods = [r for r in got if r["role"] == "producer"]
        works = [r for r in got if r["role"] == "worker"]
        created = sum(r.get("created", 0) for r in prods)
        if producers and created != n:
            self.problems.append(f"{system} {phase}: {created} of {n} jobs created")
        if workers:
            ids = [i for r in works for i in r.get("ids", [])]
            doubles = len(ids) - len(set(ids))
            if doubles:
                self.problems.append(f"{system} {phase}: {doubles} jobs handed out more than once")
            completed = sum(r.get("completed", 0) for r in works)
            if finished and completed != n:
                self.problems.append(f"{system} {phase}: {completed} completions counted for {n} jobs")
        if finished:
            end = max(r["last"] for r in works) if workers else max(r["end"] for r in prods)
            out["wall"] = end - t0
            out["jobs_per_s"] = n / out["wall"] if out["wall"] > 0 else None
            if phase == "e2e" and prods:
                out["enqueue_done"] = max(r["end"] for r in prods) - t0
        k = n / 1000
        out["client_cpu_per_1k"] = sum(r.get("cpu", 0.0) for r in got) / k
        out["pg_cpu_per_1k"] = (pg1 - pg0) / k if pg0 is not None else None
        out["pg_commits_per_1k"] = (counters1["xact"] - counters0["xact"]) / k
        out["wal_kib_per_1k"] = (counters1["wal"] - counters0["wal"]) / 1024 / k
        out["wal_syncs_per_1k"] = (counters1["wal_sync"] - counters0["wal_sync"]) / k
        if system == "opqd":
            out["opqd_cpu_per_1k"] = (opqd1 - opqd0) / k
            commits = metrics1.get("opqd_store_commits_total", 0) - metrics0.get("opqd_store_commits_total", 0)
            records = metrics1.get("opqd_store_records_total", 0) - metrics0.get("opqd_store_records_total", 0)
            seconds = metrics1.get("opqd_store_commit_duration_seconds_sum", 0) - metrics0.get(
                "opqd_store_commit_duration_seconds_sum", 0)
            requests = metrics1.get("opqd_http_requests_total", 0) - metrics0.get("opqd_http_requests_total", 0)
            out["opqd_commits_per_1k"] = commits / k
            out["opqd_records_per_job"] = records / n
            out["opqd_commit_ms"] = seconds / commits * 1000 if commits else None
            out["opqd_commit_busy"] = seconds / out["wall"] if out.get("wall") else None
            out["opqd_requests_per_1k"] = (requests - 1) / k  # less the /metrics read itself
        return out

    def pgq_left(self) -> int:
        async def count():
            conn = await asyncpg.connect(self.a.pgq_dsn)
            try:
                return await conn.fetchval("SELECT count(*) FROM pgqueuer")
            finally:
                await conn.close()

        return asyncio.run(count())


def setup_pgqueuer(dsn: str) -> str:
    async def main():
        conn = await asyncpg.connect(dsn)
        try:
            await Queries(AsyncpgDriver(conn)).install()
            rows = await conn.fetch(
                "SELECT relname, relpersistence::text AS relpersistence FROM pg_class WHERE relname LIKE 'pgqueuer%' AND relkind = 'r' ORDER BY 1")
            return ", ".join(f"{r['relname']} {'logged' if r['relpersistence'] == 'p' else 'UNLOGGED'}" for r in rows)
        finally:
            await conn.close()

    return asyncio.run(main())


def setup_opqd(base: str, max_concurrent: int) -> None:
    c = _http(base)
    status, body = _post(c, "/v1/queues", json.dumps({"name": OPQD_QUEUE, "maxConcurrentOperationCount": max_concurrent}).encode())
    c.close()
    if status != 201:
        raise SystemExit(f"bench_pgqueuer: creating the opqd queue answered {status}: {body[:300]!r}")


def fmt(v, digits=0, width=9):
    if v is None:
        return "-".rjust(width)
    if digits == 0:
        return f"{v:,.0f}".rjust(width)
    return f"{v:,.{digits}f}".rjust(width)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pg-url", required=True, help="the server's maintenance database (for statistics)")
    p.add_argument("--pgq-db", required=True)
    p.add_argument("--opqd-db", required=True)
    p.add_argument("--opqd-url", required=True)
    p.add_argument("--opqd-pid", type=int, required=True)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--enqueue-batch", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--statements", action="store_true",
                   help="print each phase's top statements from pg_stat_statements (the server must preload it)")
    a = p.parse_args()
    u = urllib.parse.urlsplit(a.pg_url)
    a.pgq_dsn = urllib.parse.urlunsplit(u._replace(path="/" + a.pgq_db))

    # SIGTERM (the script's timeout) ends the run through the finally below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import pgqueuer

    persistence = setup_pgqueuer(a.pgq_dsn)
    max_concurrent = a.workers * a.batch
    setup_opqd(a.opqd_url, max_concurrent)
    bench = Bench(a)
    version, = bench.sql("SELECT current_setting('server_version')")
    sync, = bench.sql("SELECT current_setting('synchronous_commit')")
    fsync, = bench.sql("SELECT current_setting('fsync')")
    print(f"PostgreSQL {version}: synchronous_commit={sync}, fsync={fsync}; one server, databases {a.pgq_db} (pgqueuer) and {a.opqd_db} (opqd)")
    print(f"pgqueuer {pgqueuer.__version__} (asyncpg {asyncpg.__version__}); tables: {persistence}")
    print(f"opqd pid {a.opqd_pid} at {a.opqd_url}: one instance, --store postgres:// (partitions), "
          f"queue {OPQD_QUEUE} maxConcurrentOperationCount {max_concurrent} (workers x batch)")
    print(f"{a.jobs:,} no-op jobs a phase; {a.producers} producer processes (batches of {a.enqueue_batch}), "
          f"{a.workers} worker processes (batches of {a.batch}); {a.rounds} round(s); every phase stops after {a.timeout:g} s")
    print(f"cores: {os.cpu_count()}; load average before: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    sys.stdout.flush()

    runs: list[dict] = []
    try:
        for r in range(a.rounds):
            order = ["pgqueuer", "opqd"] if r % 2 == 0 else ["opqd", "pgqueuer"]
            for phase in ("enqueue", "drain", "e2e"):
                for system in order:
                    print(f"round {r + 1}: {system} {phase}...", file=sys.stderr, flush=True)
                    out = bench.phase(system, phase)
                    out["round"] = r + 1
                    runs.append(out)
            left = bench.pgq_left()
            if left:
                bench.problems.append(f"pgqueuer: {left} jobs left in its queue table after round {r + 1}")
    finally:
        bench.stop_children()

    def median(system, phase, key):
        vals = [x[key] for x in runs if x["system"] == system and x["phase"] == phase and x.get(key) is not None]
        return statistics.median(vals) if vals else None

    print("")
    header = ["system", "phase", "jobs/s", "wall s", "opqd CPU", "PG CPU", "clients", "PG xacts", "WAL KiB",
              "WAL syncs", "opqd commits", "rec/job", "ms/commit", "busy", "req"]
    widths = [9, 8, 9, 7, 9, 8, 8, 9, 8, 10, 13, 8, 10, 5, 6]
    print(" ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    for x in runs:
        cells = [x["system"].ljust(9), x["phase"].ljust(8), fmt(x["jobs_per_s"], 0, 9), fmt(x.get("wall"), 3, 7),
                 fmt(x.get("opqd_cpu_per_1k"), 3, 9), fmt(x.get("pg_cpu_per_1k"), 3, 8), fmt(x.get("client_cpu_per_1k"), 3, 8),
                 fmt(x.get("pg_commits_per_1k"), 1, 9), fmt(x.get("wal_kib_per_1k"), 0, 8), fmt(x.get("wal_syncs_per_1k"), 1, 10),
                 fmt(x.get("opqd_commits_per_1k"), 1, 13), fmt(x.get("opqd_records_per_job"), 2, 8),
                 fmt(x.get("opqd_commit_ms"), 2, 10),
                 fmt(x["opqd_commit_busy"] * 100 if x.get("opqd_commit_busy") is not None else None, 0, 4) + ("%" if x.get("opqd_commit_busy") is not None else " "),
                 fmt(x.get("opqd_requests_per_1k"), 1, 6)]
        print(" ".join(cells) + (f"   (producers done at {x['enqueue_done']:.3f} s)" if x.get("enqueue_done") else ""))
    print("(per 1,000 jobs: opqd CPU / PG CPU / clients = CPU seconds of the opqd process, of PostgreSQL (postmaster and"
          " children), of the Python producers and workers; PG xacts = xact_commit of the system's database;"
          " WAL KiB and WAL syncs (fsyncs of the WAL) are the whole server's; opqd commits = its store's commits"
          " (opqd_store_commits_total), rec/job its records per job, ms/commit its mean commit time, busy the share of the"
          " phase its one writer spent committing, req its HTTP requests)")
    for x in runs:
        if x.get("statements"):
            print(f"pg_stat_statements, {x['system']} {x['phase']} (round {x['round']}): calls/1k jobs, ms/1k jobs, rows/call, statement")
            for calls, ms, rows, query in x["statements"]:
                print(f"  {calls / (x['jobs'] / 1000):9.1f} {ms / (x['jobs'] / 1000):9.2f} {rows / calls if calls else 0:8.1f}  {query}")
    summary: dict[str, object] = {}
    for phase in ("enqueue", "drain", "e2e"):
        q, o = median("pgqueuer", phase, "jobs_per_s"), median("opqd", phase, "jobs_per_s")
        ratio = q / o if q and o else None
        print(f"{phase:8} pgqueuer {fmt(q, 0, 0)} jobs/s, opqd {fmt(o, 0, 0)} jobs/s: pgqueuer/opqd = {fmt(ratio, 2, 0)}x")
        summary[f"pgqueuer_{phase}_jobs_per_s"] = round(q) if q else None
        summary[f"opqd_{phase}_jobs_per_s"] = round(o) if o else None
        summary[f"ratio_{phase}"] = round(ratio, 3) if ratio else None
    for system in ("pgqueuer", "opqd"):
        for phase in ("enqueue", "drain", "e2e"):
            for key, name in (("pg_cpu_per_1k", "pg_cpu_s_per_1k"), ("opqd_cpu_per_1k", "opqd_cpu_s_per_1k"),
                              ("client_cpu_per_1k", "client_cpu_s_per_1k"), ("pg_commits_per_1k", "pg_xacts_per_1k"),
                              ("wal_kib_per_1k", "wal_kib_per_1k"), ("opqd_commits_per_1k", "store_commits_per_1k")):
                v = median(system, phase, key)
                if v is not None:
                    summary[f"{system}_{phase}_{name}"] = round(v, 3)
    if bench.problems:
        print("")
        print("PROBLEMS:")
        for m in bench.problems:
            print(f"  !! {m}")
    summary.update({
        "jobs": a.jobs, "producers": a.producers, "workers": a.workers, "batch": a.batch, "enqueue_batch": a.enqueue_batch,
        "rounds": a.rounds, "pgqueuer_version": pgqueuer.__version__, "postgres_version": version,
        "synchronous_commit": sync, "load_average_end": float(open("/proc/loadavg").read().split()[0]),
        "ok": not bench.problems,
    })
    print(json.dumps(summary, separators=(",", ":")))
    return 0 if not bench.problems else 1  # as opqd-bench: a phase that could not be measured fails the run


if __name__ == "__main__":
    sys.exit(main())
