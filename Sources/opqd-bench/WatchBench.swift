// `opqd-bench watch`: how fast a change reaches those who watch.
//
//   1. change -> SSE client latency: a probe operation in a suspended queue is paused and
//      resumed; the time from sending the request to the `isPaused` event arriving on an open
//      `GET /v1/events/stream` is one sample. On an idle server, then while a load of ~10,000
//      changes/s runs (paced creates of `delay` operations on other connections), for the
//      durable store (`--sync full`) and `--store memory`.
//   2. 1,000 concurrent SSE clients: the server's RSS before and after they connect (RSS per
//      client), then how long one change takes to reach all of them (p50/p99 over clients).
//   3. webhook fan-out: 100 queue-wide observers on one queue POST to a receiver in this process;
//      deliveries/s from the first to the last, every observer's deliveries in seq order, none
//      missing. Target >= 5,000 deliveries/s.
import Dispatch
import Foundation
import MicroHTTP
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

enum WatchBench {
    static let usage = "usage: opqd-bench watch [--quick] [--clients 1000] [--observers 100] [--rate 10000]\n"

    static func main(_ args: [String]) -> Int32 {
        var quick = false, clients = 1000, observers = 100, rate = 10_000.0
        var i = 0
        while i < args.count {
            switch args[i] {
            case "--quick": quick = true
            case "--clients" where i + 1 < args.count: i += 1; clients = max(1, min(Int(args[i]) ?? 1000, 10_000))
            case "--observers" where i + 1 < args.count: i += 1; observers = max(1, min(Int(args[i]) ?? 100, 10_000))
            case "--rate" where i + 1 < args.count: i += 1; rate = max(100, min(Double(args[i]) ?? 10_000, 1e6))
            default:
                eprint("opqd-bench watch: unknown option '\(args[i])'\n" + usage)
                return 2
            }
            i += 1
        }
        print(
            "opqd-bench watch\(quick ? " --quick" : ""): SSE latency idle and at \(BenchSupport.grouped(rate)) changes/s, \(clients) SSE clients, \(observers) webhook observers"
        )
        print(BenchSupport.machineLine())
        print("opqd: \(BenchSupport.opqdBinary())")
        var problems: [String] = []
        var summary: [(String, Any)] = []
        let samples = quick ? 50 : 200

        // 1. latency
        print("")
        print("1. change -> SSE client latency (request sent -> event read; includes the durable commit)")
        print(
            ["store", "load", "changes/s", "p50", "p99", "max", "samples"].enumerated().map {
                BenchSupport.pad($0.1, [8, 6, 10, 9, 9, 9, 8][$0.0], right: $0.0 > 1)
            }.joined(separator: " "))
        for (name, extra) in [("full", ["--sync", "full"]), ("memory", ["--store", "memory"])] {
            for loaded in [false, true] {
                let r = latency(extra: extra, label: name, loaded: loaded, rate: rate, samples: samples, seconds: quick ? 3 : 8)
                problems += r.problems.map { "latency \(name) \(loaded ? "loaded" : "idle"): \($0)" }
                let row = [
                    BenchSupport.pad(name, 8), BenchSupport.pad(loaded ? "load" : "idle", 6),
                    BenchSupport.pad(loaded ? BenchSupport.grouped(r.changesPerSecond) : "-", 10, right: true),
                    BenchSupport.pad(BenchSupport.fmt(r.p50 * 1000, 2) + "ms", 9, right: true),
                    BenchSupport.pad(BenchSupport.fmt(r.p99 * 1000, 2) + "ms", 9, right: true),
                    BenchSupport.pad(BenchSupport.fmt(r.max * 1000, 1) + "ms", 9, right: true),
                    BenchSupport.pad(String(r.samples), 8, right: true),
                ]
                print(row.joined(separator: " "))
                let tag = "\(name)_\(loaded ? "loaded" : "idle")"
                summary += [
                    ("sse_p50_ms_\(tag)", BenchSupport.round3(r.p50 * 1000)), ("sse_p99_ms_\(tag)", BenchSupport.round3(r.p99 * 1000)),
                ]
                if loaded { summary.append(("changes_per_s_\(name)", Int(r.changesPerSecond.rounded()))) }
            }
        }

        // 2. many SSE clients
        print("")
        print("2. \(clients) concurrent SSE clients (default store)")
        let many = manyClients(count: clients, rounds: quick ? 5 : 20)
        problems += many.problems.map { "sse clients: \($0)" }
        print(
            "   connected \(many.connected)/\(clients); server RSS \(many.rssBefore / 1024) MiB -> \(many.rssAfter / 1024) MiB: "
                + "\(BenchSupport.fmt(Double(many.rssAfter - many.rssBefore) / Double(max(1, many.connected)), 1)) KiB per client")
        print(
            "   one change to all clients: p50 \(BenchSupport.fmt(many.p50 * 1000, 2)) ms, p99 \(BenchSupport.fmt(many.p99 * 1000, 2)) ms, "
                + "last client \(BenchSupport.fmt(many.max * 1000, 2)) ms (\(many.rounds) changes)")
        summary += [
            ("sse_clients", many.connected),
            ("rss_kib_per_client", BenchSupport.round3(Double(many.rssAfter - many.rssBefore) / Double(max(1, many.connected)))),
            ("fanout_p50_ms", BenchSupport.round3(many.p50 * 1000)), ("fanout_p99_ms", BenchSupport.round3(many.p99 * 1000)),
        ]

        // 3. webhooks
        print("")
        print("3. webhook fan-out: \(observers) queue observers -> a receiver in this process (default store)")
        let hooks = webhookFanOut(observers: observers, operations: quick ? 30 : 100)
        problems += hooks.problems.map { "webhooks: \($0)" }
        print(
            "   \(BenchSupport.grouped(Double(hooks.delivered))) of \(BenchSupport.grouped(Double(hooks.expected))) deliveries in \(BenchSupport.fmt(hooks.seconds, 2)) s: "
                + "\(BenchSupport.grouped(hooks.perSecond)) deliveries/s; out of order: \(hooks.outOfOrder); duplicates: \(hooks.duplicates)")
        print("   target: >= 5,000 deliveries/s with \(observers) observers: \(hooks.perSecond >= 5000 ? "MET" : "NOT MET")")
        summary += [("webhook_deliveries_per_s", Int(hooks.perSecond.rounded())), ("webhook_delivered", hooks.delivered), ("webhook_expected", hooks.expected)]

        if !problems.isEmpty {
            print("")
            print("PROBLEMS:")
            for p in problems { print("  !! \(p)") }
        }
        summary += [("quick", quick), ("load_average_end", BenchSupport.loadAverage()), ("ok", problems.isEmpty)]
        print(BenchSupport.jsonLine(summary))
        return problems.isEmpty ? 0 : 1
    }

    // MARK: - an SSE reader for many streams on one thread

    /// Open event streams read by one poll() thread; each event's `data:` line is handed to
    /// `onEvent(stream index, data bytes, arrival time)`.
    final class StreamReader: @unchecked Sendable {
        private var fds: [Int32] = []
        private var buffers: [[UInt8]] = []
        private var connections: [RawConnection] = []
        private let stop = Atomic<Bool>(false)
        private let done = DispatchSemaphore(value: 0)
        let onEvent: @Sendable (Int, ArraySlice<UInt8>, Double) -> Void

        init(onEvent: @escaping @Sendable (Int, ArraySlice<UInt8>, Double) -> Void) { self.onEvent = onEvent }

        /// Opens `count` streams (before `start`); returns how many answered 200.
        func open(port: Int, count: Int) -> Int {
            var ok = 0
            for _ in 0..<count {
                guard let c = try? RawConnection(port: port, timeout: 10) else { continue }
                guard c.send("GET /v1/events/stream HTTP/1.0\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n") else { continue }
                connections.append(c)
            }
            // Read each head (status line .. blank line) before handing the fd to poll().
            for c in connections {
                var head: [UInt8] = []
                var byte = [UInt8](repeating: 0, count: 1)
                while !(head.count >= 4 && head.suffix(4) == [13, 10, 13, 10]) && head.count < 4096 {
                    if read(c.fd, &byte, 1) != 1 { break }
                    head.append(byte[0])
                }
                if String(decoding: head.prefix(12), as: UTF8.self).hasSuffix("200") {
                    ok += 1
                    fds.append(c.fd)
                    buffers.append([])
                }
            }
            return ok
        }

        func start() {
            Thread.detachNewThread { [self] in
                var pfds = fds.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
                var chunk = [UInt8](repeating: 0, count: 65536)
                while !stop.load(ordering: .relaxed) {
                    let n = poll(&pfds, nfds_t(pfds.count), 50)
                    if n <= 0 { continue }
                    let now = BenchSupport.now()
                    for k in pfds.indices where pfds[k].revents != 0 {
                        let got = read(pfds[k].fd, &chunk, chunk.count)
                        if got <= 0 {
                            pfds[k].fd = -1
                            continue
                        }
                        buffers[k].append(contentsOf: chunk[0..<got])
                        // Chunked transfer framing lines are not "data:" lines: only those are used.
                        var start = 0
                        let b = buffers[k]
                        var j = 0
                        while j < b.count {
                            if b[j] == 10 {
                                let line = b[start..<j]
                                if line.count > 6, line.starts(with: "data: ".utf8) { onEvent(k, line.dropFirst(6), now) }
                                start = j + 1
                            }
                            j += 1
                        }
                        if start > 0 { buffers[k].removeFirst(start) }
                    }
                }
                done.signal()
            }
        }

        func close() {
            stop.store(true, ordering: .relaxed)
            _ = done.wait(timeout: .now() + 2)
            for c in connections { c.close() }
        }
    }

    static func contains(_ haystack: ArraySlice<UInt8>, _ needle: [UInt8]) -> Bool {
        guard needle.count <= haystack.count, let first = needle.first else { return false }
        var i = haystack.startIndex
        let end = haystack.endIndex - needle.count
        while i <= end {
            if haystack[i] == first && haystack[i..<(i + needle.count)].elementsEqual(needle) { return true }
            i += 1
        }
        return false
    }

    // MARK: - 1. latency

    struct Latency {
        var p50 = 0.0, p99 = 0.0, max = 0.0
        var samples = 0
        var changesPerSecond = 0.0
        var problems: [String] = []
    }

    /// Pause/resume of a probe operation; each answer's event timed on one stream.
    static func latency(extra: [String], label: String, loaded: Bool, rate: Double, samples: Int, seconds: Double) -> Latency {
        var out = Latency()
        let server: OpqdServer
        do { server = try OpqdServer(label: "watch-\(label)", extra: extra) } catch {
            out.problems.append("\(error)")
            return out
        }
        defer { server.stop() }
        let probe: String
        do {
            try server.createQueue("probe", suspended: true)
            try server.createQueue("load", suspended: false, maxConcurrent: 256)
            let (s, j) = try server.json("POST", "/v1/queues/probe/operations", #"{"kind":"delay","spec":{"seconds":1}}"#)
            guard s == 201, let id = j["id"] as? String else { throw BenchError("probe create: \(s)") }
            probe = id
        } catch {
            out.problems.append("setup: \(error)")
            return out
        }
        let needle = Array("\"operation\":\"\(probe)\",\"key\":\"isPaused\"".utf8)
        let arrivals = Locked<[Double]>([])
        let events = Atomic<Int>(0)
        let reader = StreamReader { _, data, now in
            events.add(1, ordering: .relaxed)
            if contains(data, needle) { arrivals.withLock { $0.append(now) } }
        }
        guard reader.open(port: Int(server.port), count: 1) == 1 else {
            out.problems.append("the event stream did not open")
            return out
        }
        reader.start()
        defer { reader.close() }

        // The load: paced creates of delay-0 operations on 16 connections.
        let stopLoad = Atomic<Bool>(false)
        let loadGroup = DispatchGroup()
        let perOperation = 5.0  // measured: a delay-0 operation reports about five changes (isReady .. isFinished)
        if loaded {
            let connections = 16
            let interval = Double(connections) / (rate / perOperation)
            for _ in 0..<connections {
                loadGroup.enter()
                Thread.detachNewThread {
                    defer { loadGroup.leave() }
                    let c = KeepAliveClient(port: Int(server.port), retries: 0)
                    defer { c.close() }
                    let body = Array(#"{"kind":"delay","spec":{"seconds":0}}"#.utf8)
                    var next = BenchSupport.now()
                    while !stopLoad.load(ordering: .relaxed) {
                        _ = try? c.request("POST", "/v1/queues/load/operations", body: body)
                        next += interval
                        let wait = next - BenchSupport.now()
                        if wait > 0 { usleep(UInt32(wait * 1e6)) } else if wait < -1 { next = BenchSupport.now() }
                    }
                }
            }
            usleep(1_000_000)  // let the load settle
        }
        let client = KeepAliveClient(port: Int(server.port), retries: 0)
        defer { client.close() }
        var latencies: [Double] = []
        let e0 = events.load(ordering: .relaxed)
        let t0 = BenchSupport.now()
        let spacing = seconds / Double(samples)
        for k in 0..<samples {
            let before = arrivals.withLock { $0.count }
            let sent = BenchSupport.now()
            guard let r = try? client.request("POST", "/v1/operations/\(probe)/\(k % 2 == 0 ? "pause" : "resume")"), r.status == 200 else {
                out.problems.append("probe \(k) failed")
                break
            }
            let deadline = sent + 5
            var arrived: Double? = nil
            while BenchSupport.now() < deadline {
                if let a = arrivals.withLock({ $0.count > before ? $0[before] : nil }) {
                    arrived = a
                    break
                }
                usleep(100)
            }
            guard let arrived else {
                out.problems.append("probe \(k): no event within 5 s")
                break
            }
            latencies.append(arrived - sent)
            let wait = spacing - (BenchSupport.now() - sent)
            if wait > 0 { usleep(UInt32(wait * 1e6)) }
        }
        let elapsed = BenchSupport.now() - t0
        out.changesPerSecond = Double(events.load(ordering: .relaxed) - e0) / max(elapsed, 1e-9)
        stopLoad.store(true, ordering: .relaxed)
        loadGroup.wait()
        let sorted = latencies.sorted()
        out.samples = sorted.count
        out.p50 = BenchSupport.percentile(sorted, 0.5)
        out.p99 = BenchSupport.percentile(sorted, 0.99)
        out.max = sorted.last ?? 0
        if loaded && out.changesPerSecond < rate * 0.8 {
            out.problems.append("the load reached only \(Int(out.changesPerSecond)) changes/s of \(Int(rate))")
        }
        return out
    }

    // MARK: - 2. many clients

    struct Many {
        var connected = 0
        var rssBefore = 0, rssAfter = 0
        var p50 = 0.0, p99 = 0.0, max = 0.0
        var rounds = 0
        var problems: [String] = []
    }

    static func manyClients(count: Int, rounds: Int) -> Many {
        var out = Many()
        let server: OpqdServer
        do { server = try OpqdServer(label: "watch-many", extra: []) } catch {
            out.problems.append("\(error)")
            return out
        }
        defer { server.stop() }
        let probe: String
        do {
            try server.createQueue("probe", suspended: true)
            let (s, j) = try server.json("POST", "/v1/queues/probe/operations", #"{"kind":"delay","spec":{"seconds":1}}"#)
            guard s == 201, let id = j["id"] as? String else { throw BenchError("probe create: \(s)") }
            probe = id
            // Warm up the server's allocations before measuring.
            for _ in 0..<20 { _ = try server.request("GET", "/v1/queues") }
        } catch {
            out.problems.append("setup: \(error)")
            return out
        }
        usleep(300_000)
        out.rssBefore = BenchSupport.statusKB(server.pid, "VmRSS") ?? 0
        let needle = Array("\"operation\":\"\(probe)\",\"key\":\"isPaused\"".utf8)
        let arrivals = Locked<[[Double]]>(Array(repeating: [], count: count))
        let reader = StreamReader { k, data, now in
            if contains(data, needle) { arrivals.withLock { $0[k].append(now) } }
        }
        out.connected = reader.open(port: Int(server.port), count: count)
        reader.start()
        defer { reader.close() }
        usleep(500_000)
        out.rssAfter = BenchSupport.statusKB(server.pid, "VmRSS") ?? 0
        if out.connected < count { out.problems.append("only \(out.connected) of \(count) streams opened") }
        var spans: [Double] = []
        var lasts: [Double] = []
        for k in 0..<rounds {
            let sent = BenchSupport.now()
            guard let r = try? server.request("POST", "/v1/operations/\(probe)/\(k % 2 == 0 ? "pause" : "resume")"), r.status == 200 else {
                out.problems.append("change \(k) failed")
                break
            }
            let deadline = sent + 10
            var all = false
            while BenchSupport.now() < deadline {
                all = arrivals.withLock { a in a.prefix(out.connected).allSatisfy { $0.count > k } }
                if all { break }
                usleep(500)
            }
            if !all {
                out.problems.append("change \(k) did not reach every client within 10 s")
                break
            }
            let times = arrivals.withLock { a in a.prefix(out.connected).map { $0[k] - sent } }
            spans += times
            lasts.append(times.max() ?? 0)
            usleep(50_000)
        }
        out.rounds = lasts.count
        let sorted = spans.sorted()
        out.p50 = BenchSupport.percentile(sorted, 0.5)
        out.p99 = BenchSupport.percentile(sorted, 0.99)
        out.max = lasts.max() ?? 0
        return out
    }

    // MARK: - 3. webhooks

    struct Fan {
        var delivered = 0, expected = 0
        var seconds = 0.0, perSecond = 0.0
        var outOfOrder = 0, duplicates = 0
        var problems: [String] = []
    }

    static func webhookFanOut(observers: Int, operations: Int) -> Fan {
        var out = Fan()
        // The receiver: per observer path, the seqs in arrival order.
        struct Received {
            var seqs: [Int: [Int]] = [:]
            var first = 0.0, last = 0.0
            var count = 0
        }
        let received = Locked(Received())
        let receiver = HTTPServer(configuration: HTTPServerConfiguration(host: "127.0.0.1", port: 0, threads: 2)) { request in
            let now = BenchSupport.now()
            let observer = Int(request.path.split(separator: "/").last ?? "") ?? -1
            let seq = request.header("x-opqd-event-seq").flatMap { Int($0) } ?? -1
            received.withLock { r in
                if r.count == 0 { r.first = now }
                r.count += 1
                r.last = now
                r.seqs[observer, default: []].append(seq)
            }
            return .response(HTTPResponse(status: 200))
        }
        do { try receiver.start() } catch {
            out.problems.append("receiver: \(error)")
            return out
        }
        defer { receiver.shutdown(timeout: .seconds(1)) }
        let server: OpqdServer
        do { server = try OpqdServer(label: "watch-hooks", extra: ["--max-observers-per-queue", "\(max(256, observers))"]) } catch {
            out.problems.append("\(error)")
            return out
        }
        defer { server.stop() }
        do {
            try server.createQueue("fan", suspended: true, maxConcurrent: 64)
            for k in 0..<observers {
                let (s, _) = try server.json("POST", "/v1/queues/fan/observers", #"{"url":"http://127.0.0.1:\#(receiver.port)/hook/\#(k)"}"#)
                guard s == 201 else { throw BenchError("observer \(k): HTTP \(s)") }
            }
            for _ in 0..<operations {
                let (s, _) = try server.json("POST", "/v1/queues/fan/operations", #"{"kind":"delay","spec":{"seconds":0}}"#)
                guard s == 201 else { throw BenchError("operation: HTTP \(s)") }
            }
            _ = try server.request("POST", "/v1/queues/fan/resume")
        } catch {
            out.problems.append("setup: \(error)")
            return out
        }
        // The events to deliver: every one of the queue (after the observers registered).
        var events = 0
        let deadline = BenchSupport.now() + 120
        while BenchSupport.now() < deadline {
            if let (s, q) = try? server.json("GET", "/v1/queues/fan"), s == 200, BenchSupport.int((q["counts"] as? [String: Any])?["finished"]) == operations {
                break
            }
            usleep(50_000)
        }
        usleep(200_000)
        if let page = try? server.request("GET", "/v1/events?after=0&limit=10000"), let j = BenchSupport.parseJSON(page.body),
            let list = j["events"] as? [[String: Any]]
        {
            events = list.filter { $0["queue"] as? String == "fan" }.count
        }
        out.expected = events * observers
        while BenchSupport.now() < deadline, received.withLock({ $0.count }) < out.expected { usleep(20_000) }
        usleep(300_000)
        let r = received.withLock { $0 }
        out.delivered = r.count
        out.seconds = r.last - r.first
        out.perSecond = Double(r.count) / max(out.seconds, 1e-9)
        for (_, seqs) in r.seqs {
            for (a, b) in zip(seqs, seqs.dropFirst()) {
                if b < a { out.outOfOrder += 1 } else if b == a { out.duplicates += 1 }
            }
        }
        if r.seqs.count != observers { out.problems.append("\(r.seqs.count) of \(observers) observers were delivered to") }
        if out.delivered < out.expected { out.problems.append("\(out.delivered) of \(out.expected) deliveries arrived") }
        if out.outOfOrder > 0 { out.problems.append("\(out.outOfOrder) deliveries out of seq order") }
        return out
    }
}
