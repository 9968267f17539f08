// `opqd-bench pgstore`: the PostgreSQL store (`--store postgres://…`) against SQLite with
// --sync full, in the same run on the same machine:
//   (a) durable creates/s through HTTP: single creates over C keep-alive connections, and
//       1,000-operation batches, each 201 answered after its commit; the store's commits and
//       records per commit from /metrics;
//   (b) the store alone, no HTTP: one writer waiting for each commit (commit latency), and a
//       flood of single-record appends (how group commit keeps up).
// Every database is a fresh one on the server given (created and dropped with psql).
import Dispatch
import Foundation
import PostgresStore
import QueueEngine
import SQLiteStore
import StoreKit
import Synchronization

enum PGStoreBench {
    static let usage =
        "usage: opqd-bench pgstore --postgres URL [--singles N] [--batches N] [--connections C] [--serial N] [--flood N] [--quick]\n"
        + "  URL: a server opqd may create databases on (scripts/pg.sh start DIR prints one); default $OPQD_TEST_POSTGRES_URL\n"

    static func main(_ args: [String]) -> Int32 {
        var server = TestPostgres.serverURL
        var singles = 20_000, batches = 50, connections = 32, serial = 2_000, flood = 100_000
        var i = 0
        while i < args.count {
            switch args[i] {
            case "--quick": singles = 4_000; batches = 10; serial = 300; flood = 20_000
            case "--postgres" where i + 1 < args.count: i += 1; server = args[i]
            case "--singles" where i + 1 < args.count: i += 1; singles = max(1, Int(args[i]) ?? singles)
            case "--batches" where i + 1 < args.count: i += 1; batches = max(1, Int(args[i]) ?? batches)
            case "--connections" where i + 1 < args.count: i += 1; connections = max(1, min(Int(args[i]) ?? 32, 256))
            case "--serial" where i + 1 < args.count: i += 1; serial = max(1, Int(args[i]) ?? serial)
            case "--flood" where i + 1 < args.count: i += 1; flood = max(1, Int(args[i]) ?? flood)
            default:
                eprint("opqd-bench pgstore: unknown option '\(args[i])'\n" + usage)
                return 2
            }
            i += 1
        }
        guard let server else {
            eprint("opqd-bench pgstore: no PostgreSQL server: pass --postgres URL\n" + usage)
            return 2
        }
        print("opqd-bench pgstore: SQLite (--sync full) vs PostgreSQL (\(PostgresStore.redact(server))), same run")
        print(BenchSupport.machineLine())
        print("opqd: \(BenchSupport.opqdBinary())")
        if let settings = try? TestPostgres.psql(
            server,
            "SELECT current_setting('server_version') || ', fsync=' || current_setting('fsync') || ', synchronous_commit=' || current_setting('synchronous_commit')"
        ) {
            print("postgres: \(settings)")
        }
        var summary: [(String, Any)] = []
        var ok = true

        print("")
        print("(a) durable creates through HTTP: \(singles) single creates over \(connections) connections, then \(batches) batches of 1,000 over 4")
        print("store     mode     ops/s    p50 ms   p99 ms  non-201  commits  records/commit")
        for store in ["sqlite", "postgres"] {
            var database: String?
            defer { if let database { _ = try? TestPostgres.psql(server, "DROP DATABASE IF EXISTS \(database) WITH (FORCE)") } }
            var extra = ["--sync", "full", "--max-batch", "1000", "--max-unfinished", "100000000", "--max-unfinished-per-queue", "100000000"]
            if store == "postgres" {
                let name = "opqd_bench_\(UInt64.random(in: 0...UInt64.max))"
                do { try TestPostgres.psql(server, "CREATE DATABASE \(name)") } catch {
                    eprint("opqd-bench pgstore: \(error)\n")
                    return 1
                }
                database = name
                extra += ["--store", TestPostgres.url(server, database: name)]
            }
            let opqd: OpqdServer
            do { opqd = try OpqdServer(label: "pgstore-\(store)", extra: extra) } catch {
                eprint("opqd-bench pgstore: \(error)\n")
                return 1
            }
            defer { opqd.stop() }
            let queues = ["a", "b", "c", "d"]
            do { for q in queues { try opqd.createQueue(q, suspended: true) } } catch {
                eprint("opqd-bench pgstore: \(error)\n")
                return 1
            }
            let single = Array("{\"kind\":\"delay\",\"spec\":{\"seconds\":60}}".utf8)
            var body = "{\"operations\":["
            for e in 0..<1000 {
                if e > 0 { body += "," }
                body += "{\"queue\":\"\(queues[e % 4])\",\"kind\":\"delay\",\"spec\":{\"seconds\":60}}"
            }
            body += "]}"
            let batch = Array(body.utf8)

            let m0 = opqd.storeMetrics()
            let (sWall, sBad, sLat) = BatchBench.drive(server: opqd, connections: connections, count: singles) { c, n in
                try c.request("POST", "/v1/queues/\(queues[n % 4])/operations", body: single).status == 201
            }
            let m1 = opqd.storeMetrics()
            let (bWall, bBad, bLat) = BatchBench.drive(server: opqd, connections: 4, count: batches) { c, _ in
                try c.request("POST", "/v1/operations:batch", body: batch).status == 201
            }
            let m2 = opqd.storeMetrics()
            func delta(_ a: [String: Double], _ b: [String: Double], _ key: String) -> Double { (b[key] ?? 0) - (a[key] ?? 0) }
            for (mode, wall, bad, lat, ops, a, b) in [
                ("single", sWall, sBad, sLat, singles, m0, m1), ("batch", bWall, bBad, bLat, batches * 1000, m1, m2),
            ] {
                let sorted = lat.sorted()
                let commits = delta(a, b, "opqd_store_commits_total")
                let records = delta(a, b, "opqd_store_records_total")
                print(
                    [
                        BenchSupport.pad(store, 9), BenchSupport.pad(mode, 6), BenchSupport.pad(BenchSupport.grouped(Double(ops) / wall), 9, right: true),
                        BenchSupport.pad(BenchSupport.fmt(BenchSupport.percentile(sorted, 0.5) * 1000, 2), 8, right: true),
                        BenchSupport.pad(BenchSupport.fmt(BenchSupport.percentile(sorted, 0.99) * 1000, 2), 8, right: true),
                        BenchSupport.pad(String(bad), 8, right: true), BenchSupport.pad(String(Int(commits)), 8, right: true),
                        BenchSupport.pad(commits > 0 ? BenchSupport.fmt(records / commits, 1) : "-", 15, right: true),
                    ].joined(separator: " "))
                summary.append(("\(store)_\(mode)_ops_per_s", Int((Double(ops) / wall).rounded())))
                summary.append(("\(store)_\(mode)_commits_per_s", Int((commits / wall).rounded())))
                if bad > 0 { ok = false }
            }
            let held = queues.reduce(0) { acc, q in acc + (BenchSupport.int((try? opqd.queue(q))?["operationCount"]) ?? 0) }
            if held != singles + batches * 1000 {
                print("!! \(store): operationCount over the queues is \(held), expected \(singles + batches * 1000)")
                ok = false
            }
        }

        print("")
        print("(b) the store alone (no HTTP): \(serial) appends each waiting for its commit, then \(flood) single-operation appends at once")
        print("store     commit latency p50 ms  p99 ms  commits/s (serial)   flood records/s  records/commit  writer CPU / wall in commits")
        for store in ["sqlite", "postgres"] {
            var database: String?
            var dir: String?
            defer {
                if let database { _ = try? TestPostgres.psql(server, "DROP DATABASE IF EXISTS \(database) WITH (FORCE)") }
                if let dir { BenchSupport.removeTree(dir) }
            }
            let s: any OperationStore
            let stats: () -> StoreStats
            let close: () -> Void
            do {
                if store == "postgres" {
                    let name = "opqd_bench_\(UInt64.random(in: 0...UInt64.max))"
                    try TestPostgres.psql(server, "CREATE DATABASE \(name)")
                    database = name
                    let p = try PostgresStore(url: TestPostgres.url(server, database: name))
                    (s, stats, close) = (p, { p.stats }, { p.close() })
                } else {
                    let d = BenchSupport.makeTempDir("opqd-bench-pgstore")
                    dir = d
                    let q = try SQLiteStore(directory: d, sync: .full)
                    (s, stats, close) = (q, { q.stats }, { q.close() })
                }
            } catch {
                eprint("opqd-bench pgstore: \(error)\n")
                return 1
            }
            defer { close() }
            let t0 = Timestamp(nanoseconds: 1_795_000_000_000_000_000)
            func op(_ id: UInt64) -> OperationSnapshot {
                OperationSnapshot(
                    id: OperationID(raw: id), queue: "q", name: nil, kind: "delay", spec: .object([("seconds", .number(60))]), state: .ready,
                    outcome: nil, isCancelled: false, queuePriority: .normal, dependencies: [], progress: nil, attempt: 0, result: nil, error: nil,
                    createdAt: t0, startedAt: nil, finishedAt: nil, revision: 1, options: OperationOptions())
            }
            func event(_ seq: UInt64) -> ChangeEvent {
                ChangeEvent(seq: seq, time: t0, queue: "q", operation: OperationID(raw: seq), key: .isReady, old: .none, new: .bool(true), state: .ready)
            }
            var ticket: UInt64 = 0
            var latencies: [Double] = []
            let serialStart = BenchSupport.now()
            for _ in 0..<serial {
                ticket += 1
                let done = DispatchSemaphore(value: 0)
                let started = BenchSupport.now()
                s.append([.operation(op(ticket)), .event(event(ticket))], upTo: ticket)
                s.whenDurable(ticket) { done.signal() }
                done.wait()
                latencies.append(BenchSupport.now() - started)
            }
            let serialWall = BenchSupport.now() - serialStart
            let before = stats()
            let floodStart = BenchSupport.now()
            for _ in 0..<flood {
                ticket += 1
                s.append([.operation(op(ticket)), .event(event(ticket))], upTo: ticket)
            }
            let done = DispatchSemaphore(value: 0)
            s.whenDurable(ticket) { done.signal() }
            done.wait()
            let floodWall = BenchSupport.now() - floodStart
            let after = stats()
            let commits = after.commits - before.commits
            let sorted = latencies.sorted()
            print(
                [
                    BenchSupport.pad(store, 9),
                    BenchSupport.pad(BenchSupport.fmt(BenchSupport.percentile(sorted, 0.5) * 1000, 2), 21, right: true),
                    BenchSupport.pad(BenchSupport.fmt(BenchSupport.percentile(sorted, 0.99) * 1000, 2), 7, right: true),
                    BenchSupport.pad(BenchSupport.grouped(Double(serial) / serialWall), 19, right: true),
                    BenchSupport.pad(BenchSupport.grouped(Double(2 * flood) / floodWall), 16, right: true),
                    BenchSupport.pad(commits > 0 ? BenchSupport.fmt(Double(after.records - before.records) / Double(commits), 0) : "-", 15, right: true),
                    // How much of a commit is this process's own work (encoding, libpq, SQLite
                    // itself for SQLite) rather than waiting for the server or the disk.
                    BenchSupport.pad(
                        "\(BenchSupport.fmt(after.cpuSeconds - before.cpuSeconds, 2)) s / \(BenchSupport.fmt(after.busySeconds - before.busySeconds, 2)) s", 29,
                        right: true),
                ].joined(separator: " "))
            summary.append(("\(store)_serial_commits_per_s", Int((Double(serial) / serialWall).rounded())))
            summary.append(("\(store)_flood_records_per_s", Int((Double(2 * flood) / floodWall).rounded())))
        }
        summary.append(("load_average_end", BenchSupport.loadAverage()))
        summary.append(("ok", ok))
        print(BenchSupport.jsonLine(summary))
        return ok ? 0 : 1
    }
}
