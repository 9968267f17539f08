// `opqd-bench workers`: end-to-end throughput of `external` operations driven by workers over
// HTTP, one at a time and in batches, side by side. For each store (`--store memory`,
// `--sync normal`, `--sync full`) and each mode, a fresh release `opqd` gets a suspended queue
// holding N external operations (created through `POST /v1/operations:batch`); the queue is
// resumed and W worker loops, each on its own keep-alive HTTP/1.1 connection (raw sockets),
// repeat until a claim answers 204:
//   single: claim (`POST /v1/queues/q/claim?wait=1`) -> finish (`POST /v1/operations/{id}/finish`)
//   batch:  claim (`…/claim?wait=1&max=B`) -> finish them all (`POST /v1/operations:finish`)
// Jobs/s is measured from the first claim to the last finish. Afterwards: counts.finished
// must be N, every finish must have answered 200 and no operation may have been handed out
// twice.
import Dispatch
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

enum WorkersBench {
    static let usage =
        "usage: opqd-bench workers [--workers 8] [--jobs N] [--batch 100] [--max-concurrent M] [--stores memory,normal,full] [--modes single,batch] [--baseline OLD_OPQD] [--postgres URL] [--quick]\n"

    struct Mode {
        let name: String
        let extra: [String]
    }
    static let stores = [
        Mode(name: "memory", extra: ["--store", "memory"]),
        Mode(name: "normal", extra: ["--store", "sqlite", "--sync", "normal"]),
        Mode(name: "full", extra: ["--store", "sqlite", "--sync", "full"]),
    ]

    /// What one worker loop saw.
    final class WorkerLog: @unchecked Sendable {
        var claimLatencies: [Double] = []
        var finishLatencies: [Double] = []
        var claimed: [String] = []
        var finishStatus: [Int: Int] = [:]
        var claimStatus: [Int: Int] = [:]
        var lastFinish = 0.0
        var claimAnswers = 0
        var error: String? = nil
        var sample409: String? = nil
    }

    struct Outcome {
        var jobsPerSecond = 0.0
        var wall = 0.0
        var claimP50 = 0.0, claimP99 = 0.0, claimMax = 0.0
        var finishP50 = 0.0, finishP99 = 0.0
        var finishedOK = 0
        var finishConflicts = 0
        var otherFinish: [Int: Int] = [:]
        var otherClaim: [Int: Int] = [:]
        var doubleHandouts = 0
        var queueFinished = -1
        var queueUnfinished = -1
        var precreateSeconds = 0.0
        var jobsPerClaim = 0.0
        /// Store commits during the run: how many, records each, and seconds each (mean).
        var commits = 0.0, recordsPerCommit = 0.0, commitMs = 0.0
        var problems: [String] = []
    }

    static func main(_ args: [String]) -> Int32 {
        var workers = 8, jobs: Int? = nil, quick = false, maxConcurrent: Int? = nil, batch = 100
        var only: [String]? = nil, onlyModes = ["single", "batch"], baseline: String? = nil, postgres: String? = nil
        var i = 0
        while i < args.count {
            switch args[i] {
            case "--quick": quick = true
            case "--workers" where i + 1 < args.count: i += 1; workers = max(1, Int(args[i]) ?? 8)
            case "--jobs" where i + 1 < args.count: i += 1; jobs = max(1, Int(args[i]) ?? 50_000)
            case "--max-concurrent" where i + 1 < args.count: i += 1; maxConcurrent = max(1, Int(args[i]) ?? 64)
            case "--batch" where i + 1 < args.count: i += 1; batch = min(100, max(1, Int(args[i]) ?? 100))
            case "--stores" where i + 1 < args.count: i += 1; only = args[i].split(separator: ",").map(String.init)
            case "--baseline" where i + 1 < args.count: i += 1; baseline = args[i]
            case "--postgres" where i + 1 < args.count: i += 1; postgres = args[i]
            case "--modes" where i + 1 < args.count: i += 1; onlyModes = args[i].split(separator: ",").map(String.init)
            default:
                eprint("opqd-bench workers: unknown option '\(args[i])'\n" + usage)
                return 2
            }
            i += 1
        }
        let n = jobs ?? (quick ? 10_000 : 50_000)
        // Room for every worker's whole batch at once; the same limit in both modes.
        let limit = maxConcurrent ?? max(64, workers * batch)
        print(
            "opqd-bench workers\(quick ? " --quick" : ""): \(workers) workers, \(BenchSupport.grouped(Double(n))) external jobs per run,"
                + " queue maxConcurrentOperationCount \(limit)")
        print("each worker: own keep-alive HTTP/1.1 connection, until a claim answers 204:")
        print("  single: claim?wait=1 -> POST /v1/operations/{id}/finish {leaseToken, result}")
        print("  batch:  claim?wait=1&max=\(batch) -> POST /v1/operations:finish {finishes: [all of them]}")
        print(BenchSupport.machineLine())
        print("opqd: \(BenchSupport.opqdBinary())")
        var results: [(String, Outcome)] = []
        if let baseline { print("baseline: \(baseline) (single mode only; it runs first for each store)") }
        // `--postgres URL`: also the PostgreSQL store, each run on a database of its own.
        let all = stores + (postgres.map { [Mode(name: "postgres", extra: ["--store", $0])] } ?? [])
        for m in all where only == nil || only!.contains(m.name) || m.name == "postgres" {
            if let baseline, m.name != "postgres" {
                eprint("workers: store \(m.name), single, baseline...\n")
                results.append(
                    ("\(m.name) base", run(mode: m, workers: workers, jobs: n, maxConcurrent: limit, batch: 0, timeLimit: quick ? 60 : 180, binary: baseline)))
            }
            for mode in ["single", "batch"] where onlyModes.contains(mode) {
                eprint("workers: store \(m.name), \(mode)...\n")
                let b = mode == "batch" ? batch : 0
                results.append(
                    ("\(m.name) \(mode)", run(mode: m, workers: workers, jobs: n, maxConcurrent: limit, batch: b, timeLimit: quick ? 60 : 180)))
            }
        }

        print("")
        let header = [
            ("store mode", 13), ("jobs/s", 9), ("wall s", 8), ("claim p50", 10), ("claim p99", 10), ("claim max", 10), ("finish p99", 11),
            ("per claim", 10), ("commits", 8), ("rec/commit", 11), ("ms/commit", 10), ("finished", 9), ("fin 200", 8), ("fin 409", 8), ("double", 7),
            ("pre-create s", 13),
        ]
        print(header.map { BenchSupport.pad($0.0, $0.1, right: $0.0 != "store mode") }.joined(separator: " "))
        for (name, o) in results {
            let cells = [
                BenchSupport.pad(name, 13), BenchSupport.pad(BenchSupport.grouped(o.jobsPerSecond), 9, right: true),
                BenchSupport.pad(BenchSupport.fmt(o.wall, 2), 8, right: true),
                BenchSupport.pad(BenchSupport.fmt(o.claimP50, 2) + "ms", 10, right: true),
                BenchSupport.pad(BenchSupport.fmt(o.claimP99, 2) + "ms", 10, right: true),
                BenchSupport.pad(BenchSupport.fmt(o.claimMax, 1) + "ms", 10, right: true),
                BenchSupport.pad(BenchSupport.fmt(o.finishP99, 2) + "ms", 11, right: true),
                BenchSupport.pad(BenchSupport.fmt(o.jobsPerClaim, 1), 10, right: true),
                BenchSupport.pad(BenchSupport.grouped(o.commits), 8, right: true),
                BenchSupport.pad(BenchSupport.fmt(o.recordsPerCommit, 0), 11, right: true),
                BenchSupport.pad(BenchSupport.fmt(o.commitMs, 2), 10, right: true),
                BenchSupport.pad(String(o.queueFinished), 9, right: true), BenchSupport.pad(String(o.finishedOK), 8, right: true),
                BenchSupport.pad(String(o.finishConflicts), 8, right: true), BenchSupport.pad(String(o.doubleHandouts), 7, right: true),
                BenchSupport.pad(BenchSupport.fmt(o.precreateSeconds, 2), 13, right: true),
            ]
            print(cells.joined(separator: " "))
        }
        print("(jobs/s = finishes answered 200 / time from the first claim to the last finish; 'finished' = counts.finished of the queue;")
        print(" 'per claim' = operations per claim answer; 'double' = operations handed out by more than one claim;")
        print(" claim latencies exclude the final 204 long polls; a batch's finish latency is that of its one request)")
        for m in all {
            if let b = results.first(where: { $0.0 == "\(m.name) base" })?.1, let s = results.first(where: { $0.0 == "\(m.name) single" })?.1,
                b.jobsPerSecond > 0
            {
                print("\(m.name): single now/baseline = \(BenchSupport.fmt(s.jobsPerSecond / b.jobsPerSecond, 2))x")
            }
            if let s = results.first(where: { $0.0 == "\(m.name) single" })?.1, let b = results.first(where: { $0.0 == "\(m.name) batch" })?.1,
                s.jobsPerSecond > 0
            {
                print("\(m.name): batch/single = \(BenchSupport.fmt(b.jobsPerSecond / s.jobsPerSecond, 2))x")
            }
        }
        var failures: [String] = []
        for (name, o) in results { for p in o.problems { failures.append("\(name): \(p)") } }
        if let full = results.first(where: { $0.0 == "full batch" })?.1 {
            print("target: >= 20,000 durable jobs/s with \(workers) workers (sync full, batch): \(full.jobsPerSecond >= 20_000 ? "MET" : "NOT MET")")
        }
        if !failures.isEmpty {
            print("")
            print("PROBLEMS:")
            for f in failures { print("  !! \(f)") }
        }
        var summary: [(String, Any)] = []
        for (name, o) in results {
            let key = name.replacingOccurrences(of: " ", with: "_")
            summary.append(("jobs_per_s_\(key)", Int(o.jobsPerSecond.rounded())))
        }
        for (name, o) in results {
            let key = name.replacingOccurrences(of: " ", with: "_")
            summary.append(("claim_p50_ms_\(key)", BenchSupport.round3(o.claimP50)))
            summary.append(("claim_p99_ms_\(key)", BenchSupport.round3(o.claimP99)))
            summary.append(("finish_p99_ms_\(key)", BenchSupport.round3(o.finishP99)))
            summary.append(("finished_\(key)", o.queueFinished))
        }
        summary.append(("double_handouts", results.reduce(0) { $0 + $1.1.doubleHandouts }))
        summary.append(("finish_409", results.reduce(0) { $0 + $1.1.finishConflicts }))
        summary.append(("workers", workers))
        summary.append(("jobs", n))
        summary.append(("batch", batch))
        summary.append(("max_concurrent", limit))
        summary.append(("quick", quick))
        summary.append(("load_average_end", BenchSupport.loadAverage()))
        summary.append(("ok", failures.isEmpty))
        print(BenchSupport.jsonLine(summary))
        return failures.isEmpty ? 0 : 1
    }

    /// `batch` 0: one claim and one finish per job; otherwise claims of up to `batch` and one
    /// `operations:finish` for each.
    static func run(mode: Mode, workers: Int, jobs n: Int, maxConcurrent: Int, batch: Int, timeLimit: Double, binary: String? = nil) -> Outcome {
        var o = Outcome()
        var mode = mode
        var database: (server: String, name: String)? = nil
        defer { if let database { _ = try? TestPostgres.psql(database.server, "DROP DATABASE IF EXISTS \(database.name) WITH (FORCE)") } }
        if mode.name == "postgres", let url = mode.extra.last {
            let name = "opqd_bench_\(UInt64.random(in: 0...UInt64.max))"
            do { try TestPostgres.psql(url, "CREATE DATABASE \(name)") } catch {
                o.problems.append("cannot create a database on \(url): \(error)")
                return o
            }
            database = (url, name)
            mode = Mode(name: mode.name, extra: ["--store", TestPostgres.url(url, database: name)])
        }
        let server: OpqdServer
        do { server = try OpqdServer(label: "workers-\(mode.name)", extra: mode.extra, binary: binary) } catch {
            o.problems.append("cannot start opqd: \(error)")
            return o
        }
        defer { server.stop() }
        let q = "q"
        do {
            try server.createQueue(q, suspended: true, maxConcurrent: maxConcurrent)
            let t0 = BenchSupport.now()
            let bad = try precreate(server: server, queue: q, count: n, connections: 4)
            o.precreateSeconds = BenchSupport.now() - t0
            if !bad.isEmpty { o.problems.append("pre-create answered non-201: \(bad)") }
            let held = BenchSupport.int(try server.queue(q)["operationCount"]) ?? -1
            if held != n { o.problems.append("after pre-creating \(n), operationCount is \(held)") }
        } catch {
            o.problems.append("setup: \(error)")
            return o
        }

        // Workers, each connected before the clock starts.
        let logs = (0..<workers).map { _ in WorkerLog() }
        let ready = DispatchSemaphore(value: 0)
        let go = DispatchSemaphore(value: 0)
        let group = DispatchGroup()
        let startBox = Locked<Double>(0)
        let port = server.port
        let deadline = Locked<Double>(0)
        for w in 0..<workers {
            let log = logs[w]
            group.enter()
            let t = Thread {
                defer { group.leave() }
                let conn = KeepAliveClient(port: Int(port), retries: 0)
                do { try conn.connect() } catch {
                    log.error = "\(error)"; ready.signal(); return
                }
                defer { conn.close() }
                ready.signal()
                go.wait()
                let claimBody = Array("{\"worker\":\"bench-\(w)\"}".utf8)
                let claimPath = batch > 0 ? "/v1/queues/q/claim?wait=1&max=\(batch)" : "/v1/queues/q/claim?wait=1"
                let limit = deadline.withLock { $0 }
                log.claimLatencies.reserveCapacity(n / workers * 2)
                log.finishLatencies.reserveCapacity(n / workers * 2)
                var finisher: Finisher? = nil
                defer { finisher?.finishAndJoin() }
                do {
                    while true {
                        let c0 = BenchSupport.now()
                        if c0 > limit { log.error = "time limit reached"; break }
                        let r = try conn.request("POST", claimPath, body: claimBody)
                        let c1 = BenchSupport.now()
                        log.claimStatus[r.status, default: 0] += 1
                        if r.status == 204 { break }
                        guard r.status == 200 else {
                            if (log.claimStatus.filter { $0.key != 200 && $0.key != 204 }.values.reduce(0, +)) > 100 {
                                log.error = "too many failed claims"; break
                            }
                            continue
                        }
                        log.claimLatencies.append(c1 - c0)
                        let ids = scanAll(r.body, "\"operation\":{\"id\":\""), tokens = scanAll(r.body, "\"token\":\"")
                        guard !ids.isEmpty, ids.count == tokens.count, batch > 0 || ids.count == 1 else {
                            log.error = "cannot parse claim answer: \(r.text.prefix(300))"; break
                        }
                        log.claimed += ids
                        log.claimAnswers += 1
                        if batch == 0 {
                            let body = Array("{\"leaseToken\":\"\(tokens[0])\",\"result\":{\"ok\":true}}".utf8)
                            let f = try conn.request("POST", "/v1/operations/\(ids[0])/finish", body: body)
                            let f1 = BenchSupport.now()
                            log.finishLatencies.append(f1 - c1)
                            log.finishStatus[f.status, default: 0] += 1
                            if f.status == 409 && log.sample409 == nil { log.sample409 = "\(ids[0]): \(f.text.prefix(300))" }
                            log.lastFinish = f1
                            continue
                        }
                        // Batch mode: the finishing runs beside the next claim, as a real worker
                        // would (its jobs run while it asks for more); at most one batch waits.
                        if finisher == nil {
                            let f = Finisher(port: Int(port), log: log)
                            try f.start()
                            finisher = f
                        }
                        finisher?.submit(ids: ids, tokens: tokens, claimedAt: c1)
                    }
                    finisher?.finishAndJoin()
                } catch {
                    log.error = "\(error)"
                }
            }
            t.stackSize = 1 << 20
            t.start()
        }
        for _ in 0..<workers { ready.wait() }
        let storeBefore = server.storeMetrics()
        do {
            let r = try server.request("POST", "/v1/queues/\(q)/resume")
            guard r.status == 200 else { throw BenchError("resume: HTTP \(r.status) \(r.text)") }
        } catch {
            o.problems.append("\(error)")
        }
        let start = BenchSupport.now()
        startBox.withLock { $0 = start }
        deadline.withLock { $0 = start + timeLimit }
        for _ in 0..<workers { go.signal() }
        if group.wait(timeout: .now() + timeLimit + 30) == .timedOut {
            o.problems.append("workers did not stop within \(Int(timeLimit + 30)) s")
        }
        let end = logs.map(\.lastFinish).max() ?? start
        let storeAfter = server.storeMetrics()
        func delta(_ name: String) -> Double { (storeAfter[name] ?? 0) - (storeBefore[name] ?? 0) }
        o.commits = delta("opqd_store_commits_total")
        if o.commits > 0 {
            o.recordsPerCommit = delta("opqd_store_records_total") / o.commits
            o.commitMs = delta("opqd_store_commit_duration_seconds_sum") / o.commits * 1000
        }
        o.wall = max(0, end - start)

        let claims = logs.flatMap(\.claimLatencies).sorted()
        let finishes = logs.flatMap(\.finishLatencies).sorted()
        o.claimP50 = BenchSupport.percentile(claims, 0.50) * 1000
        o.claimP99 = BenchSupport.percentile(claims, 0.99) * 1000
        o.claimMax = (claims.last ?? 0) * 1000
        o.finishP50 = BenchSupport.percentile(finishes, 0.50) * 1000
        o.finishP99 = BenchSupport.percentile(finishes, 0.99) * 1000
        var finishStatus: [Int: Int] = [:], claimStatus: [Int: Int] = [:]
        for l in logs {
            for (k, v) in l.finishStatus { finishStatus[k, default: 0] += v }
            for (k, v) in l.claimStatus { claimStatus[k, default: 0] += v }
            if let e = l.error { o.problems.append("worker: \(e)") }
            if let s = l.sample409 { o.problems.append("finish answered 409, e.g. \(s)") }
        }
        o.finishedOK = finishStatus[200] ?? 0
        o.finishConflicts = finishStatus[409] ?? 0
        o.otherFinish = finishStatus.filter { $0.key != 200 && $0.key != 409 }
        o.otherClaim = claimStatus.filter { $0.key != 200 && $0.key != 204 }
        o.jobsPerSecond = o.wall > 0 ? Double(o.finishedOK) / o.wall : 0
        let answers = logs.reduce(0) { $0 + $1.claimAnswers }
        o.jobsPerClaim = answers > 0 ? Double(logs.reduce(0) { $0 + $1.claimed.count }) / Double(answers) : 0
        var seen: [String: Int] = [:]
        for l in logs { for id in l.claimed { seen[id, default: 0] += 1 } }
        o.doubleHandouts = seen.values.filter { $0 > 1 }.count
        if o.doubleHandouts > 0 {
            let ex = seen.filter { $0.value > 1 }.prefix(3).map { "\($0.key) x\($0.value)" }
            o.problems.append("DOUBLE HAND-OUT: \(o.doubleHandouts) operations claimed more than once, e.g. \(ex)")
        }
        if !o.otherFinish.isEmpty { o.problems.append("finish answered \(o.otherFinish) (status: count)") }
        if !o.otherClaim.isEmpty { o.problems.append("claim answered \(o.otherClaim) (status: count)") }
        if o.finishConflicts > 0 { o.problems.append("\(o.finishConflicts) finishes answered 409") }
        if let j = try? server.queue(q) {
            o.queueUnfinished = BenchSupport.int(j["operationCount"]) ?? -1
            o.queueFinished = BenchSupport.int((j["counts"] as? [String: Any])?["finished"]) ?? -1
        }
        if o.queueFinished != n || o.queueUnfinished != 0 {
            o.problems.append("queue shows \(o.queueFinished) finished and \(o.queueUnfinished) unfinished; expected \(n) and 0")
        }
        if o.finishedOK != n { o.problems.append("\(o.finishedOK) finishes answered 200; expected \(n)") }
        return o
    }

    /// Every value after `prefix`, up to the next `until` byte (a JSON string's closing quote by
    /// default; no escapes expected: ids and tokens are URL-safe).
    static func scanAll(_ bytes: [UInt8], _ prefix: String, until end: UInt8 = UInt8(ascii: "\"")) -> [String] {
        let p = Array(prefix.utf8)
        var out: [String] = []
        guard let first = p.first else { return out }
        var i = 0
        outer: while i + p.count <= bytes.count {
            if bytes[i] != first { i += 1; continue }
            for j in 1..<p.count where bytes[i + j] != p[j] { i += 1; continue outer }
            let s = i + p.count
            var e = s
            while e < bytes.count && bytes[e] != end { e += 1 }
            guard e < bytes.count else { break }
            out.append(String(decoding: bytes[s..<e], as: UTF8.self))
            i = e
        }
        return out
    }

    /// Occurrences of `needle` in `bytes`.
    static func count(_ bytes: [UInt8], _ needle: String) -> Int {
        let p = Array(needle.utf8)
        guard let first = p.first, bytes.count >= p.count else { return 0 }
        var n = 0, i = 0
        outer: while i + p.count <= bytes.count {
            if bytes[i] != first { i += 1; continue }
            for j in 1..<p.count where bytes[i + j] != p[j] { i += 1; continue outer }
            n += 1
            i += p.count
        }
        return n
    }

    /// The JSON string value after `prefix` (no escapes expected: ids and tokens are URL-safe).
    static func scan(_ bytes: [UInt8], _ prefix: String) -> String? {
        let p = Array(prefix.utf8)
        guard bytes.count > p.count else { return nil }
        var i = 0
        outer: while i + p.count <= bytes.count {
            for j in 0..<p.count where bytes[i + j] != p[j] { i += 1; continue outer }
            let s = i + p.count
            var e = s
            while e < bytes.count && bytes[e] != UInt8(ascii: "\"") { e += 1 }
            return e < bytes.count ? String(decoding: bytes[s..<e], as: UTF8.self) : nil
        }
        return nil
    }

    /// `count` external operations, in batches of 1,000 through `POST /v1/operations:batch`
    /// over `connections` keep-alive connections; returns the non-201 answers (status: count).
    static func precreate(server: OpqdServer, queue: String, count: Int, connections: Int) throws -> [Int: Int] {
        let bad = Locked<[Int: Int]>([:])
        let errors = Locked<[String]>([])
        let group = DispatchGroup()
        let port = server.port
        let element = "{\"queue\":\"\(queue)\",\"kind\":\"external\",\"spec\":{\"lease\":60}}"
        let per = 1000
        let batches = (count + per - 1) / per
        let box = AtomicBox()
        for _ in 0..<min(connections, batches) {
            group.enter()
            let t = Thread {
                defer { group.leave() }
                do {
                    let c = KeepAliveClient(port: Int(port), retries: 0)
                    defer { c.close() }
                    while true {
                        let k = box.take()
                        if k >= batches { break }
                        let size = min(per, count - k * per)
                        let body = Array(("{\"operations\":[" + Array(repeating: element, count: size).joined(separator: ",") + "]}").utf8)
                        let r = try c.request("POST", "/v1/operations:batch", body: body)
                        if r.status == 404 {
                            // A baseline from before operations:batch: one create at a time.
                            let one = Array("{\"kind\":\"external\",\"spec\":{\"lease\":60}}".utf8)
                            for _ in 0..<size {
                                let r = try c.request("POST", "/v1/queues/\(queue)/operations", body: one)
                                if r.status != 201 { bad.withLock { $0[r.status, default: 0] += 1 } }
                            }
                        } else if r.status != 201 {
                            bad.withLock { $0[r.status, default: 0] += size }
                        }
                    }
                } catch {
                    errors.withLock { $0.append("\(error)") }
                }
            }
            t.stackSize = 1 << 20
            t.start()
        }
        if group.wait(timeout: .now() + 600) == .timedOut { throw BenchError("pre-create did not finish in 600 s") }
        if let e = errors.withLock({ $0.first }) { throw BenchError("pre-create: \(e)") }
        return bad.withLock { $0 }
    }
}

/// The finishing half of a batch worker: its own connection and thread, taking claimed batches
/// from the claiming half (at most one waiting) and finishing each with one
/// `POST /v1/operations:finish`. Writes only the finish fields of the worker's log.
final class Finisher: @unchecked Sendable {
    let conn: KeepAliveClient
    let log: WorkersBench.WorkerLog
    private let pending = Locked<[(ids: [String], tokens: [String], claimedAt: Double)?]>([])
    private let items = DispatchSemaphore(value: 0)
    /// One batch may wait while another is being finished.
    private let room = DispatchSemaphore(value: 1)
    private let done = DispatchSemaphore(value: 0)
    private var joined = false

    init(port: Int, log: WorkersBench.WorkerLog) {
        conn = KeepAliveClient(port: port, retries: 0)
        self.log = log
    }

    func start() throws {
        try conn.connect()
        let t = Thread { [self] in
            run(); done.signal()
        }
        t.stackSize = 1 << 20
        t.start()
    }

    func submit(ids: [String], tokens: [String], claimedAt: Double) {
        room.wait()
        pending.withLock { $0.append((ids, tokens, claimedAt)) }
        items.signal()
    }

    /// Lets the queued batches finish, then stops the thread.
    func finishAndJoin() {
        guard !joined else { return }
        joined = true
        pending.withLock { $0.append(nil) }
        items.signal()
        done.wait()
        conn.close()
    }

    private func run() {
        while true {
            items.wait()
            guard let next = pending.withLock({ $0.removeFirst() }) else { return }
            room.signal()
            do { try finish(next.ids, next.tokens, claimedAt: next.claimedAt) } catch {
                if log.error == nil { log.error = "finish: \(error)" }
            }
        }
    }

    private func finish(_ ids: [String], _ tokens: [String], claimedAt c1: Double) throws {
        var body = Array("{\"finishes\":[".utf8)
        body.reserveCapacity(ids.count * 110 + 16)
        for (k, id) in ids.enumerated() {
            if k > 0 { body.append(UInt8(ascii: ",")) }
            body += Array("{\"id\":\"\(id)\",\"leaseToken\":\"\(tokens[k])\",\"result\":{\"ok\":true}}".utf8)
        }
        body += Array("]}".utf8)
        let f0 = BenchSupport.now()
        let f = try conn.request("POST", "/v1/operations:finish", body: body)
        let f1 = BenchSupport.now()
        log.finishLatencies.append(f1 - f0)
        _ = c1
        guard f.status == 200 else {
            log.finishStatus[f.status, default: 0] += ids.count
            if log.sample409 == nil { log.sample409 = "operations:finish answered \(f.status): \(f.text.prefix(300))" }
            return
        }
        // One entry per element: `{"id":…,"status":NNN,"operation"|"problem":…}`.
        let ok = WorkersBench.count(f.body, "\"status\":200,\"operation\":{")
        let refused = WorkersBench.scanAll(f.body, "\"problem\":{\"type\":\"https://opqd.dev/problems/")
        if ok + refused.count != ids.count { log.error = "operations:finish answered \(ok + refused.count) entries for \(ids.count)" }
        log.finishStatus[200, default: 0] += ok
        for slug in refused { log.finishStatus[slug.hasSuffix("conflict") || slug == "already-finished" ? 409 : 400, default: 0] += 1 }
        if !refused.isEmpty && log.sample409 == nil { log.sample409 = String(f.text.prefix(300)) }
        log.lastFinish = f1
    }
}

/// A shared counter handed to threads.
final class AtomicBox: Sendable {
    private let value = Atomic<Int>(0)
    init() {}
    /// Returns the value before incrementing.
    func take() -> Int { value.wrappingAdd(1, ordering: .relaxed).oldValue }
}
