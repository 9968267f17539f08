// `opqd-bench store`: what durability costs over HTTP, and how fast a big store restarts.
//
// (a) Durable creates/s: three release `opqd` servers side by side in the same run
//     (`--sync full`, `--sync normal`, `--store memory`), each hammered by wrk POSTing
//     `{"kind":"delay","spec":{"seconds":1}}` into a suspended queue at 50 and 256
//     connections. Afterwards every queue's operationCount is checked against the 2xx answers
//     wrk saw, live and again after `kill -9` and a restart of the two SQLite servers: an
//     acknowledged create that is missing is a lost write.
// (b) Restart: a data dir holding N operations is built in a child process exactly as the
//     server writes it (SQLiteStore + QueueEngine, suspended queue, addOperationID, durable,
//     closed); then the release `opqd` is timed from spawn until /healthz answers 200 and the
//     queue shows operationCount N.
import Dispatch
import Foundation
import QueueEngine
import QueueKinds
import SQLiteStore

#if canImport(Glibc)
import Glibc
#endif

enum StoreBench {
    static let createLua = """
        wrk.method = "POST"
        wrk.body = '{"kind":"delay","spec":{"seconds":1}}'
        wrk.headers["Content-Type"] = "application/json"
        """

    static let usage = "usage: opqd-bench store [--quick] [--duration S] [--restart-ops N] [--skip-http] [--skip-restart]\n"

    struct Mode {
        let name: String
        let extra: [String]
        let durable: Bool
    }
    static let modes = [
        Mode(name: "full", extra: ["--store", "sqlite", "--sync", "full"], durable: true),
        Mode(name: "normal", extra: ["--store", "sqlite", "--sync", "normal"], durable: true),
        Mode(name: "memory", extra: ["--store", "memory"], durable: false),
    ]

    struct Cell {
        var wrk = WrkResult()
        var held = -1
        var heldAfterCrash = -1
        var recordsPerCommit: Double? = nil
        var error: String? = nil
        var lost: Int {
            let h = heldAfterCrash >= 0 ? min(held, heldAfterCrash) : held
            return h < 0 ? 0 : max(0, wrk.ok - h)
        }
    }

    static func main(_ args: [String]) -> Int32 {
        var quick = false, duration: Int? = nil, restartOps: Int? = nil, skipHTTP = false, skipRestart = false
        var i = 0
        while i < args.count {
            switch args[i] {
            case "--quick": quick = true
            case "--duration" where i + 1 < args.count: i += 1; duration = Int(args[i])
            case "--restart-ops" where i + 1 < args.count: i += 1; restartOps = Int(args[i])
            case "--skip-http": skipHTTP = true
            case "--skip-restart": skipRestart = true
            default:
                eprint("opqd-bench store: unknown option '\(args[i])'\n" + usage)
                return 2
            }
            i += 1
        }
        let seconds = duration ?? (quick ? 2 : 8)
        let ops = restartOps ?? (quick ? 100_000 : 1_000_000)
        guard skipHTTP || Wrk.ensureInstalled() else { return 1 }

        print("opqd-bench store\(quick ? " --quick" : ""): durable creates over HTTP, and restart time")
        print(BenchSupport.machineLine())
        print("opqd: \(BenchSupport.opqdBinary())")
        var summary: [(String, Any)] = []
        var failures: [String] = []

        if !skipHTTP {
            let (pairs, fails) = creates(seconds: seconds)
            summary += pairs
            failures += fails
        }
        if !skipRestart {
            let (pairs, fails) = restart(ops: ops)
            summary += pairs
            failures += fails
        }
        summary.append(("quick", quick))
        summary.append(("load_average_end", BenchSupport.loadAverage()))
        summary.append(("ok", failures.isEmpty))
        if !failures.isEmpty {
            print("")
            print("PROBLEMS:")
            for f in failures { print("  !! \(f)") }
        }
        print(BenchSupport.jsonLine(summary))
        return failures.isEmpty ? 0 : 1
    }

    // MARK: - (a) creates over HTTP

    static func creates(seconds: Int) -> ([(String, Any)], [String]) {
        var failures: [String] = []
        let connections = [50, 256]
        print("")
        print("(a) creates/s over HTTP: wrk -t2 -d\(seconds)s POST {\"kind\":\"delay\",\"spec\":{\"seconds\":1}} into a suspended queue;")
        print("    servers started side by side, each with a fresh temp --data dir, default --threads")
        var servers: [String: OpqdServer] = [:]
        defer { for s in servers.values { s.stop() } }
        for m in modes {
            do { servers[m.name] = try OpqdServer(label: "store-\(m.name)", extra: m.extra) } catch {
                failures.append("cannot start opqd \(m.name): \(error)")
                return ([], failures)
            }
        }
        var cells: [String: Cell] = [:]
        func key(_ m: String, _ c: Int) -> String { "\(m)/\(c)" }
        for c in connections {
            for m in modes {
                let s = servers[m.name]!
                var cell = Cell()
                let q = "creates-c\(c)"
                do {
                    try s.createQueue(q, suspended: true)
                    let before = s.storeMetrics()
                    eprint("wrk \(m.name) c=\(c) \(seconds)s...\n")
                    cell.wrk = try Wrk.run(url: s.url + "/v1/queues/\(q)/operations", connections: c, seconds: seconds, lua: createLua)
                    usleep(300_000)
                    cell.held = BenchSupport.int(try s.queue(q)["operationCount"]) ?? -1
                    cell.recordsPerCommit = batchSize(before: before, after: s.storeMetrics())
                } catch {
                    cell.error = "\(error)"
                    failures.append("\(m.name) c=\(c): \(error)")
                }
                cells[key(m.name, c)] = cell
            }
        }
        // kill -9 the SQLite servers and restart them on the same data: every acknowledged create must be there.
        var crashRestart: [String: Double] = [:]
        for m in modes where m.durable {
            guard let s = servers[m.name] else { continue }
            s.process.killNow()
            do {
                let t0 = BenchSupport.now()
                let again = try OpqdServer(label: "store-\(m.name)-again", extra: m.extra, dataDir: s.dataDir, startTimeout: 120)
                crashRestart[m.name] = BenchSupport.now() - t0
                for c in connections {
                    cells[key(m.name, c)]!.heldAfterCrash = BenchSupport.int(try again.queue("creates-c\(c)")["operationCount"]) ?? -1
                }
                again.stop()
            } catch {
                failures.append("\(m.name): restart after kill -9 failed: \(error)")
            }
        }

        // Table.
        print("")
        let cols: [(String, Int)] = [
            ("store", 8), ("conns", 6), ("creates/s", 11), ("p50 ms", 8), ("p99 ms", 8), ("2xx seen", 10),
            ("held", 10), ("after -9", 10), ("lost", 6), ("non-2xx", 8), ("recs/commit", 12), ("socket errors", 0),
        ]
        print(cols.map { BenchSupport.pad($0.0, $0.1, right: $0.1 > 0 && $0.0 != "store") }.joined(separator: " "))
        var lostTotal = 0
        for c in connections {
            for m in modes {
                let cell = cells[key(m.name, c)]!
                lostTotal += cell.lost
                let w = cell.wrk
                let row = [
                    BenchSupport.pad(m.name, 8), BenchSupport.pad(String(c), 6, right: true),
                    BenchSupport.pad(BenchSupport.grouped(w.rps), 11, right: true),
                    BenchSupport.pad(BenchSupport.fmt(w.p50ms, 2), 8, right: true), BenchSupport.pad(BenchSupport.fmt(w.p99ms, 2), 8, right: true),
                    BenchSupport.pad(String(w.ok), 10, right: true), BenchSupport.pad(String(cell.held), 10, right: true),
                    BenchSupport.pad(m.durable ? String(cell.heldAfterCrash) : "-", 10, right: true),
                    BenchSupport.pad(String(cell.lost), 6, right: true), BenchSupport.pad(String(w.non2xx), 8, right: true),
                    BenchSupport.pad(cell.recordsPerCommit.map { BenchSupport.fmt($0, 1) } ?? "n/a", 12, right: true),
                    w.socketErrors.isEmpty ? "-" : w.socketErrors,
                ]
                print(row.joined(separator: " "))
                if cell.lost > 0 {
                    let msg =
                        "LOST ACKNOWLEDGED CREATES: \(m.name) c=\(c): wrk saw \(w.ok) 2xx, server holds \(cell.held) live, \(cell.heldAfterCrash) after kill -9 + restart"
                    print("!!!! " + msg)
                    failures.append(msg)
                }
                if w.non2xx > 0 { failures.append("\(m.name) c=\(c): \(w.non2xx) non-2xx answers to creates") }
                if cell.held >= 0 && cell.held - w.ok > c {
                    failures.append(
                        "\(m.name) c=\(c): server holds \(cell.held - w.ok) more operations than wrk saw answered (more than the \(c) possibly in flight)")
                }
            }
        }
        print("('held' = operationCount live after the run; 'after -9' = after SIGKILL and a restart on the same --data;")
        print(" 'held' may exceed '2xx seen' by up to the in-flight requests wrk dropped when its clock ran out)")
        var ratios: [String: Double] = [:]
        for c in connections {
            let mem = cells[key("memory", c)]!.wrk.rps
            for m in ["full", "normal"] {
                let r = mem > 0 ? cells[key(m, c)]!.wrk.rps / mem : 0
                ratios["\(m)/\(c)"] = r
            }
            print("ratio to memory at c=\(c): full \(BenchSupport.fmt(ratios["full/\(c)"]!, 3)), normal \(BenchSupport.fmt(ratios["normal/\(c)"]!, 3))")
        }
        if cells.values.allSatisfy({ $0.recordsPerCommit == nil }) {
            print("group-commit batch size: not exposed by /metrics (no store/commit series); skipped")
        }
        for (m, s) in crashRestart.sorted(by: { $0.key < $1.key }) {
            print("restart after kill -9 (\(m)): listening after \(BenchSupport.fmt(s, 3)) s")
        }
        let full256 = cells[key("full", 256)]!.wrk.rps
        print(
            "targets: durable (full) creates >= 40,000/s: \(full256 >= 40_000 || cells[key("full", 50)]!.wrk.rps >= 40_000 ? "MET" : "NOT MET");"
                + " full/memory >= 0.5 at c=256: \(ratios["full/256"]! >= 0.5 ? "MET" : "NOT MET")")

        var out: [(String, Any)] = []
        for m in modes {
            for c in connections {
                let cell = cells[key(m.name, c)]!
                let prefix = m.durable ? "durable_\(m.name)" : "memory"
                out.append(("\(prefix)_rps_c\(c)", Int(cell.wrk.rps.rounded())))
                out.append(("\(prefix)_p99_ms_c\(c)", BenchSupport.round3(cell.wrk.p99ms)))
            }
        }
        out.append(("full_to_memory_ratio_c50", BenchSupport.round3(ratios["full/50"]!)))
        out.append(("full_to_memory_ratio_c256", BenchSupport.round3(ratios["full/256"]!)))
        out.append(("normal_to_memory_ratio_c50", BenchSupport.round3(ratios["normal/50"]!)))
        out.append(("normal_to_memory_ratio_c256", BenchSupport.round3(ratios["normal/256"]!)))
        out.append(("lost_acknowledged", lostTotal))
        out.append(("non2xx_creates", cells.values.reduce(0) { $0 + $1.wrk.non2xx }))
        out.append(("create_seconds", seconds))
        let batch = cells.filter { $0.key.hasPrefix("full/") }.compactMap { $0.value.recordsPerCommit }
        if let b = batch.max() { out.append(("full_records_per_commit", BenchSupport.round3(b))) }
        return (out, failures)
    }

    /// Records per commit over a run, if `/metrics` carries the store's counters.
    static func batchSize(before: [String: Double], after: [String: Double]) -> Double? {
        func find(_ m: [String: Double], _ word: String) -> Double? {
            m.first { $0.key.lowercased().contains(word) && !$0.key.lowercased().contains("per") && !$0.key.lowercased().contains("largest") }?.value
        }
        guard let c1 = find(after, "commits"), let r1 = find(after, "records") else { return nil }
        let c0 = find(before, "commits") ?? 0, r0 = find(before, "records") ?? 0
        return c1 - c0 > 0 ? (r1 - r0) / (c1 - c0) : nil
    }

    // MARK: - (b) restart

    static let restartQueue = "restart"

    static func restart(ops: Int) -> ([(String, Any)], [String]) {
        var failures: [String] = []
        print("")
        print("(b) restart with \(BenchSupport.grouped(Double(ops))) stored operations (delay, suspended queue)")
        let dir = BenchSupport.makeTempDir("opqd-bench-restart")
        defer { BenchSupport.removeTree(dir) }
        // Build in a child process so its heap is gone before the server starts.
        eprint("building a store of \(ops) operations in \(dir)...\n")
        let buildStart = BenchSupport.now()
        var built: [String: Any] = [:]
        do {
            let p = try ChildProcess(bench: ["/proc/self/exe", "store-build", dir, String(ops)], stdoutPath: nil, stderrPath: nil)
            var last = ""
            while let line = p.readLine(timeout: 900) { last = line }
            p.wait(timeout: 60)
            guard p.exitedNormally, let j = BenchSupport.parseJSON(Array(last.utf8)) else {
                failures.append("store-build child failed: \(last)")
                return ([("restart_ops", ops)], failures)
            }
            built = j
        } catch {
            failures.append("store-build: \(error)")
            return ([("restart_ops", ops)], failures)
        }
        let buildSeconds = BenchSupport.now() - buildStart
        let size = BenchSupport.treeSize(dir)
        let createSecs = (built["seconds"] as? Double) ?? 0
        print(
            "built in \(BenchSupport.fmt(buildSeconds, 1)) s (engine adds + durable: \(BenchSupport.fmt(createSecs, 2)) s, "
                + "\(BenchSupport.grouped(Double(ops) / max(createSecs, 1e-9))) creates/s in-process, "
                + "\(BenchSupport.fmt((built["records_per_commit"] as? Double) ?? 0, 0)) records/commit); data dir \(BenchSupport.fmt(Double(size) / 1e6, 1)) MB"
        )
        print("(the files were just written, so they are in the page cache: a warm restart)")

        var restartSeconds = -1.0, listenSeconds = -1.0, healthzSeconds = -1.0, hwmKB = -1, rssKB = -1
        var held = -1
        let t0 = BenchSupport.now()
        do {
            let server = try OpqdServer(label: "restart", extra: [], dataDir: dir, startTimeout: 300)
            defer { server.stop(keepData: true) }
            listenSeconds = BenchSupport.now() - t0
            let deadline = t0 + 300
            while BenchSupport.now() < deadline {
                if let r = try? server.request("GET", "/healthz"), r.status == 200 { healthzSeconds = BenchSupport.now() - t0; break }
                usleep(2_000)
            }
            while BenchSupport.now() < deadline {
                if let j = try? server.queue(restartQueue), let n = BenchSupport.int(j["operationCount"]) {
                    held = n
                    if n == ops { restartSeconds = BenchSupport.now() - t0; break }
                }
                usleep(5_000)
            }
            hwmKB = BenchSupport.statusKB(server.pid, "VmHWM") ?? -1
            rssKB = BenchSupport.statusKB(server.pid, "VmRSS") ?? -1
        } catch {
            failures.append("restart: \(error)")
        }
        if restartSeconds < 0 {
            failures.append("restart: the queue never showed operationCount \(ops) (last seen \(held))")
        }
        print("")
        print("\(BenchSupport.pad("restart of", 24)) \(BenchSupport.pad("seconds", 9, right: true))")
        print("\(BenchSupport.pad("  listening line", 24)) \(BenchSupport.pad(BenchSupport.fmt(listenSeconds, 3), 9, right: true))")
        print("\(BenchSupport.pad("  /healthz 200", 24)) \(BenchSupport.pad(BenchSupport.fmt(healthzSeconds, 3), 9, right: true))")
        print("\(BenchSupport.pad("  queue shows \(ops)", 24)) \(BenchSupport.pad(BenchSupport.fmt(restartSeconds, 3), 9, right: true))")
        print(
            "server peak RSS (VmHWM) \(BenchSupport.fmt(Double(hwmKB) / 1024, 0)) MiB, RSS after \(BenchSupport.fmt(Double(rssKB) / 1024, 0)) MiB"
                + " (\(BenchSupport.fmt(Double(hwmKB) * 1024 / Double(max(ops, 1)), 0)) bytes/operation at peak)")
        if ops == 1_000_000 {
            print("target: restart of 1,000,000 operations < 5 s: \(restartSeconds >= 0 && restartSeconds < 5 ? "MET" : "NOT MET")")
        }
        let k = ops == 1_000_000 ? "1m" : "\(ops / 1000)k"
        var out: [(String, Any)] = [("restart_seconds_1m", ops == 1_000_000 ? BenchSupport.round3(restartSeconds) as Any : NSNull())]
        if ops != 1_000_000 { out.append(("restart_seconds_\(k)", BenchSupport.round3(restartSeconds))) }
        return (
            out + [
                ("restart_ops", ops),
                ("restart_listen_seconds", BenchSupport.round3(listenSeconds)),
                ("restart_peak_rss_mib", Int((Double(hwmKB) / 1024).rounded())),
                ("restart_data_mb", BenchSupport.round3(Double(size) / 1e6)),
                ("store_build_creates_per_s", Int((Double(ops) / max(createSecs, 1e-9)).rounded())),
            ], failures
        )
    }

    /// Hidden child: `store-build DIR N`: a store holding N delay operations in a suspended
    /// queue, written as the server writes it (the engine's records and events, sync full).
    static func buildChild(_ args: [String]) -> Int32 {
        guard args.count == 2, let n = Int(args[1]) else { eprint("usage: opqd-bench store-build DIR N\n"); return 2 }
        do {
            let store = try SQLiteStore(directory: args[0], sync: .full)
            var kinds = standardKinds()
            kinds["external"] = ExternalKind()
            let engine = QueueEngine(kinds: kinds, store: store)
            try engine.createQueue(name: restartQueue, isSuspended: true)
            let request = OperationRequest(kind: "delay", spec: .object([("seconds", .number(1))]))
            let t0 = BenchSupport.now()
            for _ in 0..<n { _ = try engine.addOperationID(to: restartQueue, request) }
            let done = DispatchSemaphore(value: 0)
            engine.whenDurable { done.signal() }
            done.wait()
            let seconds = BenchSupport.now() - t0
            let stats = store.stats
            store.close()
            outLine(
                BenchSupport.jsonLine([
                    ("seconds", seconds), ("ops", n), ("commits", stats.commits), ("records", stats.records),
                    ("records_per_commit", stats.recordsPerCommit),
                ]))
            return 0
        } catch {
            eprint("store-build: \(error)\n")
            return 1
        }
    }
}
