import Foundation
import Locking
import QueueTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Webhook observers against receivers on 127.0.0.1: queue-wide observers, order, retries with
/// backoff, a hanging receiver, the signature checked by Python's `hmac`, and delivery of what
/// was owed across a kill -9.
@Suite("Webhook deliveries")
struct WebhookTests {
    /// The seqs a receiver acknowledged (answered 2xx), in arrival order.
    static func seqs(_ requests: [ReceivedRequest]) -> [Int] {
        requests.compactMap { r in r.headers["x-opqd-event-seq"].flatMap { Int($0) } }
    }

    /// Seqs of a queue's events in the feed after `after`, once the feed shows every one of
    /// `finished` finishing (a status says finished before its event is committed and shown).
    static func feedSeqs(_ server: LiveServer, queue: String, after: Int, finished: [String]) async throws -> [Int] {
        var events: [[String: Any]] = []
        _ = try await eventually(timeout: 5) {
            let page = try await server.request("GET", "/v1/events?after=\(after)&limit=10000").expecting(200)
            events = page.objects("events").filter { $0["queue"] as? String == queue }
            let done = Set(events.filter { $0["key"] as? String == "isFinished" }.compactMap { $0["operation"] as? String })
            return finished.allSatisfy(done.contains)
        }
        return events.compactMap { $0["seq"] as? Int }
    }

    @Test("a queue observer gets every change of the queue's operations, present and future, in seq order, and shows its delivery state")
    func queueObserver() async throws {
        let receiver = try WebhookReceiver()
        defer { receiver.close() }
        try await withLiveServer { server in
            try await server.createQueue("wq", suspended: true)
            try await server.createQueue("other")
            let before = try await server.addDelay("wq", seconds: 0.01, name: "before")
            let start = try await server.lastSeq()
            let r = try await server.request("POST", "/v1/queues/wq/observers", json: #"{"url":"\#(receiver.url)"}"#)
            #expect(r.status == 201, "\(r)")
            let observer = try #require(r.string("id"))
            #expect(r.headers["Location"] == "/v1/queues/wq/observers/\(observer)")
            #expect(r.string("queue") == "wq")
            #expect(r.object["operation"] == nil, "a queue observer names no operation")
            let after = try await server.addDelay("wq", seconds: 0.01, name: "after")
            _ = try await server.addDelay("other", seconds: 0.01)
            _ = try await server.request("POST", "/v1/queues/wq/resume").expecting(200)
            #expect(try await server.waitForState(before, "finished"))
            #expect(try await server.waitForState(after, "finished"))
            let expected = try await Self.feedSeqs(server, queue: "wq", after: start, finished: [before, after])
            #expect(expected.count >= 5, "both operations report changes: \(expected)")
            let arrived = await receiver.waitFor(timeout: 5) { Self.seqs($0) == expected }
            #expect(arrived, "got \(Self.seqs(receiver.requests)), want \(expected)")
            let ops = Set(receiver.requests.compactMap { $0.object["operation"] as? String })
            #expect(ops == [before, after], "present and future operations of wq only")
            for req in receiver.requests {
                #expect(req.headers["x-opqd-observer"] == observer)
                #expect(req.headers["x-opqd-event-seq"] == (req.object["seq"] as? Int).map { "\($0)" }, "the header names the body's seq")
            }

            let state = try await server.request("GET", "/v1/queues/wq/observers/\(observer)").expecting(200)
            let delivery = state.object["delivery"] as? [String: Any] ?? [:]
            #expect(delivery["lastDeliveredSeq"] as? Int == expected.last, "\(state.text)")
            #expect(delivery["delivered"] as? Int == expected.count, "\(state.text)")
            #expect(delivery["failures"] as? Int == 0)
            #expect(delivery["state"] as? String == "idle")

            // Listings carry an ETag; nothing new → 304; a change → a new ETag.
            let list = try await server.request("GET", "/v1/queues/wq/observers").expecting(200)
            #expect(list.objects("observers").map { $0["id"] as? String } == [observer])
            let etag = try #require(list.headers["ETag"])
            #expect(try await server.request("GET", "/v1/queues/wq/observers", headers: ["If-None-Match": etag]).status == 304)
            #expect(try await server.request("GET", "/v1/queues/other/observers").objects("observers").isEmpty)
            expectProblem(try await server.request("GET", "/v1/operations/\(after)/observers/\(observer)"), 404)
            expectProblem(try await server.request("GET", "/v1/queues/other/observers/\(observer)"), 404)
            expectProblem(try await server.request("POST", "/v1/queues/nope/observers", json: #"{"url":"\#(receiver.url)"}"#), 404)
            expectProblem(try await server.request("POST", "/v1/queues/wq/observers", json: #"{"url":"ftp://x"}"#), 422, mentioning: ["url"])
            expectProblem(
                try await server.request("POST", "/v1/queues/wq/observers", json: #"{"url":"\#(receiver.url)","keys":[]}"#), 422, mentioning: ["keys"])

            #expect(try await server.request("DELETE", "/v1/queues/wq/observers/\(observer)").status == 204)
            let emptied = try await server.request("GET", "/v1/queues/wq/observers", headers: ["If-None-Match": etag])
            #expect(emptied.status == 200 && emptied.objects("observers").isEmpty)
            let count = receiver.requests.count
            _ = try await server.addDelay("wq", seconds: 0.01)
            try await Task.sleep(for: .milliseconds(300))
            #expect(receiver.requests.count == count, "a deleted observer is sent nothing more")

            // Deleting the queue removes its observers at once: a new queue of that name has none.
            _ = try await server.request("POST", "/v1/queues/wq/observers", json: #"{"url":"\#(receiver.url)"}"#).expecting(201)
            _ = try await server.request("DELETE", "/v1/queues/wq?force=true").expecting(204)
            try await server.createQueue("wq")
            #expect(try await server.request("GET", "/v1/queues/wq/observers").expecting(200).objects("observers").isEmpty)
        }
    }

    @Test("a receiver that answers 500 gets the same event again after a backoff; order holds and the failures are visible")
    func retriesAfterFailures() async throws {
        let receiver = try WebhookReceiver { _, index in index < 3 ? 500 : 200 }
        defer { receiver.close() }
        try await withLiveServer({
            $0.webhookBackoff = 0.05; $0.webhookMaxBackoff = 0.2
        }) { server in
            try await server.createQueue("rq", suspended: true)
            let start = try await server.lastSeq()
            let observer = try #require(
                try await server.request("POST", "/v1/queues/rq/observers", json: #"{"url":"\#(receiver.url)"}"#).expecting(201).string("id"))
            var ids: [String] = []
            for _ in 0..<3 { ids.append(try await server.addDelay("rq", seconds: 0.01)) }
            _ = try await server.request("POST", "/v1/queues/rq/resume").expecting(200)
            for id in ids { #expect(try await server.waitForState(id, "finished")) }
            let expected = try await Self.feedSeqs(server, queue: "rq", after: start, finished: ids)
            let acked = { (requests: [ReceivedRequest]) in Array(Self.seqs(requests).dropFirst(3)) }
            #expect(await receiver.waitFor(timeout: 10) { acked($0) == expected }, "acknowledged \(acked(receiver.requests)), want \(expected)")
            let all = Self.seqs(receiver.requests)
            #expect(Array(all.prefix(4)) == Array(repeating: expected[0], count: 4), "the first event is retried until it is acknowledged: \(all)")
            let state = try await server.request("GET", "/v1/queues/rq/observers/\(observer)").expecting(200)
            let delivery = state.object["delivery"] as? [String: Any] ?? [:]
            #expect(delivery["failures"] as? Int == 3, "\(state.text)")
            #expect(delivery["consecutiveFailures"] as? Int == 0)
            #expect((delivery["lastError"] as? String)?.contains("500") == true, "\(state.text)")
            #expect(delivery["lastDeliveredSeq"] as? Int == expected.last)

            // The same counts in /metrics.
            let metrics = try await server.request("GET", "/metrics").expecting(200).text
            func value(_ name: String) -> Double? {
                metrics.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { Double($0.split(separator: " ").last ?? "") }
            }
            #expect(value("opqd_webhook_deliveries_total") == Double(expected.count), "\(metrics)")
            #expect(value("opqd_webhook_delivery_failures_total") == 3)
            #expect(value("opqd_webhook_observers") == 1)
            #expect(value("opqd_webhook_events_pending") == 0)
        }
    }

    @Test("an observer whose receiver fails while many events pass reads them back from the store: none lost, none out of order")
    func catchUpFromTheStore() async throws {
        let failing = Lock(true)
        let receiver = try WebhookReceiver { _, _ in failing.withLock { $0 } ? 503 : 200 }
        defer { receiver.close() }
        try await withLiveServer({
            $0.webhookBackoff = 0.05; $0.webhookMaxBackoff = 0.1; $0.webhookBuffer = 8
        }) { server in
            try await server.createQueue("cq", maxConcurrent: 8)
            let start = try await server.lastSeq()
            let observer = try #require(
                try await server.request("POST", "/v1/queues/cq/observers", json: #"{"url":"\#(receiver.url)"}"#).expecting(201).string("id"))
            var ids: [String] = []
            for _ in 0..<40 { ids.append(try await server.addDelay("cq", seconds: 0.001)) }
            for id in ids { #expect(try await server.waitForState(id, "finished")) }
            let expected = try await Self.feedSeqs(server, queue: "cq", after: start, finished: ids)
            #expect(expected.count >= 120)
            let state = try await server.request("GET", "/v1/queues/cq/observers/\(observer)").expecting(200)
            let delivery = state.object["delivery"] as? [String: Any] ?? [:]
            #expect((delivery["pending"] as? Int ?? 99) <= 8, "the buffer stays bounded: \(state.text)")
            failing.withLock { $0 = false }
            let acked = { (requests: [ReceivedRequest]) -> [Int] in
                var out: [Int] = []
                for r in requests where !out.contains(Self.seqs([r]).first ?? -1) { out += Self.seqs([r]) }
                return out
            }
            #expect(await receiver.waitFor(timeout: 15) { acked($0) == expected }, "delivered \(acked(receiver.requests).count) of \(expected.count)")
            let after = try await server.request("GET", "/v1/queues/cq/observers/\(observer)").expecting(200)
            let d = after.object["delivery"] as? [String: Any] ?? [:]
            #expect(d["dropped"] as? Int == 0, "\(after.text)")
            #expect(d["lastDeliveredSeq"] as? Int == expected.last)
        }
    }

    @Test("a receiver that hangs delays neither another observer nor any API call")
    func hangingReceiver() async throws {
        let hanging = try RawServer(timeout: 30) { connection, server in
            _ = try? connection.readRequest()
            while !server.isStopping { usleep(20_000) }
        }
        defer { hanging.stop() }
        let receiver = try WebhookReceiver()
        defer { receiver.close() }
        // The hanging POST's timeout is 120 s: nothing that waited for it could come within the
        // 60 s bounds below, and a loaded machine's slow requests (1.26 s seen, beside four
        // builds, against the first bounds of 0.5 s; then 3 s against 6 s) cannot pass for it.
        try await withLiveServer({ $0.webhookTimeout = 120 }) { server in
            try await server.createQueue("hq", maxConcurrent: 4)
            let start = try await server.lastSeq()
            let stuck = try #require(
                try await server.request("POST", "/v1/queues/hq/observers", json: #"{"url":"\#(hanging.url("/hook"))"}"#).expecting(201).string("id"))
            _ = try await server.request("POST", "/v1/queues/hq/observers", json: #"{"url":"\#(receiver.url)"}"#).expecting(201)
            var slowest = 0.0
            var ids: [String] = []
            for _ in 0..<20 {
                let t = Date()
                ids.append(try await server.addDelay("hq", seconds: 0.01))
                slowest = max(slowest, elapsed(since: t))
            }
            for id in ids { #expect(try await server.waitForState(id, "finished")) }
            let expected = try await Self.feedSeqs(server, queue: "hq", after: start, finished: ids)
            let t = Date()
            #expect(
                await receiver.waitFor(timeout: 60) { Self.seqs($0) == expected },
                "the healthy observer got \(Self.seqs(receiver.requests).count) of \(expected.count)")
            #expect(elapsed(since: t) < 60, "well inside the hanging POST's 120 s timeout: nothing waited for it")
            #expect(slowest < 60, "an API call took \(slowest) s while a receiver hung (its POST's timeout is 120 s)")
            let state = try await server.request("GET", "/v1/queues/hq/observers/\(stuck)").expecting(200)
            let delivery = state.object["delivery"] as? [String: Any] ?? [:]
            #expect(delivery["lastDeliveredSeq"] is NSNull, "the hanging one acknowledged nothing: \(state.text)")
            #expect(["sending", "retrying"].contains(delivery["state"] as? String ?? ""), "\(state.text)")
        }
    }

    @Test("every delivery's X-Opqd-Signature verifies with Python's hmac over the exact body")
    func signatureVerifiedByPython() async throws {
        let receiver = try WebhookReceiver()
        defer { receiver.close() }
        let secret = "s3cret-\(UInt32.random(in: 0...UInt32.max))"
        try await withLiveServer({ $0.webhookSecret = secret }) { server in
            try await server.createQueue("sq")
            _ = try await server.request("POST", "/v1/queues/sq/observers", json: #"{"url":"\#(receiver.url)"}"#).expecting(201)
            let id = try await server.addDelay("sq", seconds: 0.01)
            #expect(try await server.waitForState(id, "finished"))
            #expect(await receiver.waitFor(timeout: 20) { $0.contains { $0.object["key"] as? String == "isFinished" } })
        }
        let requests = receiver.requests
        #expect(requests.count >= 3)
        // One line per delivery: hex body, the header; Python prints ok or bad per line.
        let lines = requests.map { r in r.body.map { String(format: "%02x", $0) }.joined() + " " + (r.headers["x-opqd-signature"] ?? "none") }
        let script = """
            import hmac, hashlib, sys
            key = sys.argv[1].encode()
            for line in sys.stdin:
                body, sig = line.split()
                want = "sha256=" + hmac.new(key, bytes.fromhex(body), hashlib.sha256).hexdigest()
                print("ok" if hmac.compare_digest(want, sig) else "bad")
            """
        let python = Process()
        python.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        python.arguments = ["-c", script, secret]
        let input = Pipe()
        let output = Pipe()
        python.standardInput = input
        python.standardOutput = output
        try python.run()
        input.fileHandleForWriting.write(Data((lines.joined(separator: "\n") + "\n").utf8))
        try input.fileHandleForWriting.close()
        let verdicts = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).split(separator: "\n")
        python.waitUntilExit()
        #expect(python.terminationStatus == 0)
        #expect(verdicts.count == requests.count && verdicts.allSatisfy { $0 == "ok" }, "python says \(verdicts)")
    }

    @Test("after a kill -9 and a restart, every event not yet acknowledged is delivered, in order")
    func deliveryAcrossKillNine() async throws {
        let binary = try OpqdBinary.locate()
        let data = try makeTemporaryDirectory(prefix: "opqd-webhook-data")
        let logs = try makeTemporaryDirectory(prefix: "opqd-webhook-logs")
        defer {
            try? FileManager.default.removeItem(atPath: data)
            try? FileManager.default.removeItem(atPath: logs)
        }
        // Acknowledges the first 5 deliveries, then refuses everything until told otherwise.
        let open = Lock(false)
        let receiver = try WebhookReceiver { _, index in index < 5 || open.withLock { $0 } ? 200 : 503 }
        defer { receiver.close() }
        let options = ["--webhook-backoff", "0.05", "--webhook-max-backoff", "0.2"]
        var server = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-0.log", extraArguments: options)
        defer { server.killNow() }
        _ = try server.request("POST", "/v1/queues", json: #"{"name":"kq"}"#)
        let start = try #require(Int(try server.request("GET", "/metrics").text.firstMatch(of: #/opqd_event_sequence (\d+)/#)?.output.1 ?? ""))
        let observer = try #require(try server.request("POST", "/v1/queues/kq/observers", json: #"{"url":"\#(receiver.url)"}"#).string("id"))
        var ids: [String] = []
        for _ in 0..<10 {
            let r = try server.request("POST", "/v1/queues/kq/operations", json: #"{"kind":"delay","spec":{"seconds":0.01}}"#)
            ids.append(try #require(r.string("id")))
        }
        #expect(await eventually(timeout: 10) { ids.allSatisfy { (try? server.request("GET", "/v1/operations/\($0)").string("state")) == "finished" } })
        var events: [[String: Any]] = []
        _ = await eventually(timeout: 5) {
            events = ((try? server.request("GET", "/v1/events?after=\(start)&limit=10000").objects("events")) ?? []).filter { $0["queue"] as? String == "kq" }
            return events.filter { $0["key"] as? String == "isFinished" }.count == ids.count
        }
        let expected = events.compactMap { $0["seq"] as? Int }
        #expect(await receiver.waitFor(timeout: 5) { $0.count > 8 }, "five acknowledged, then refusals")
        // Let a cursor write happen (once a second), so the restart proves both halves: what was
        // acknowledged and persisted is not all sent again, what was not is sent.
        try await Task.sleep(for: .milliseconds(1500))
        server.signal(SIGKILL)
        _ = server.waitForExit(timeout: 10)
        let before = receiver.requests.count
        open.withLock { $0 = true }
        server = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-1.log", extraArguments: options)
        let acknowledged = { (requests: [ReceivedRequest]) -> [Int] in
            // The 2xx ones: the first five, then everything after the restart.
            Array(Self.seqs(Array(requests.prefix(5)))) + Self.seqs(Array(requests.dropFirst(before)))
        }
        let arrived = await receiver.waitFor(timeout: 15) { requests in
            Set(acknowledged(requests)) == Set(expected)
        }
        #expect(arrived, "acknowledged \(acknowledged(receiver.requests)), want \(expected)\n\(server.logTail())")
        let resent = Self.seqs(Array(receiver.requests.dropFirst(before)))
        #expect(resent == resent.sorted(), "in seq order after the restart: \(resent)")
        #expect(!resent.contains(expected[0]), "the persisted cursor is past the first acknowledged events: \(resent)")
        let state = try server.request("GET", "/v1/queues/kq/observers/\(observer)")
        #expect(state.status == 200, "the observer survived the crash: \(state)")
    }
}
