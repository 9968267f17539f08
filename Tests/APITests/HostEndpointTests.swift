import Foundation
import QueueAPI
import QueueEngine
import QueueTesting
import Testing

/// Hosts through HTTP (API.md "Hosts"): real `http` operations against a local target switched
/// between up, refusing, 503, slow, 429 with `Retry-After`, and 404, on a live server whose
/// breakers open after 3 failures for a second or a few (doubled up to 8 s). Times are
/// generous: the suite runs beside others on 2 cores.
@Suite("Hosts: a breaker per target host", .serialized)
struct HostEndpointTests {
    static func configure(_ c: inout OpqdConfiguration) { breaker(open: 1)(&c) }

    static func breaker(open: Double) -> (inout OpqdConfiguration) -> Void {
        { c in c.limits.breaker = BreakerSettings(failures: 3, openSeconds: open, maxOpenSeconds: 8) }
    }

    func create(_ server: LiveServer, _ url: String, queue: String = "q", extra: String = "") async throws -> String {
        let r = try await server.request(
            "POST", "/v1/queues/\(queue)/operations", json: #"{"kind":"http","spec":{"method":"GET","url":"\#(url)","timeout":0.5}\#(extra)}"#)
        guard r.status == 201, let id = r.string("id") else { throw Unexpected("create", r) }
        return id
    }

    func host(_ server: LiveServer, _ name: String) async throws -> TestResponse { try await server.request("GET", "/v1/hosts/\(name)") }

    func waitForState(_ server: LiveServer, _ name: String, _ state: String, timeout: Double = 5) async throws -> Bool {
        try await eventually(timeout: timeout, every: 0.01) { try await host(server, name).string("state") == state }
    }

    func breakerEvents(_ server: LiveServer) async throws -> [String] {
        let r = try await server.request("GET", "/v1/events?after=0&limit=1000")
        let events = (r.object["events"] as? [[String: Any]]) ?? []
        return events.filter { $0["key"] as? String == "breaker" }.map { "\($0["old"] as? String ?? "?")->\($0["new"] as? String ?? "?")" }
    }

    @Test("failures open the host; nothing reaches the target while it is open; one canary; a ramp of 2^k a second; the events")
    func tripCanaryAndRamp() async throws {
        let target = try SwitchableTarget()
        defer { target.stop() }
        try target.set(.refusing)
        // Open for 60 s: the test, not a timer, ends it (with auto after a hand open), so a busy
        // machine cannot end it before the held operations are in.
        try await withLiveServer(Self.breaker(open: 60)) { server in
            try await server.createQueue("q", maxConcurrent: 50)
            for _ in 0..<2 { _ = try await create(server, target.url()) }
            #expect(try await eventually { try await host(server, target.host).int("consecutiveFailures") == 2 })
            #expect(try await host(server, target.host).string("state") == "closed", "two failures of three do not open it")
            _ = try await create(server, target.url())
            #expect(try await waitForState(server, target.host, "open"))
            let open = try await host(server, target.host)
            #expect(open.int("trips") == 1 && open.string("openedAt") != nil && open.string("until") != nil)
            #expect((open.object["lastError"] as? [String: Any])?["type"] as? String == "connection-refused")
            // The target comes back slow (0.3 s, within the operations' timeout of 0.5 s):
            // nothing reaches it while open, then one canary.
            try target.set(.slow(seconds: 0.3))
            var held: [String] = []
            for _ in 0..<15 { held.append(try await create(server, target.url())) }
            let status = try await server.request("GET", "/v1/operations/\(held[0])")
            #expect(status.string("state") == "ready")
            let waiting = (status.object["waitingOn"] as? [[String: Any]]) ?? []
            #expect(waiting.contains { $0["type"] as? String == "host" && $0["host"] as? String == target.host && $0["state"] as? String == "open" })
            #expect(try await host(server, target.host).int("held") == 15)
            #expect(target.count == 0, "nothing reached the target while it was open")
            // Held by hand, then handed back to the rules: it goes on as halfOpen at once.
            #expect(try await server.request("PATCH", "/v1/hosts/\(target.host)", json: #"{"breaker":"open"}"#).status == 200)
            #expect(try await server.request("PATCH", "/v1/hosts/\(target.host)", json: #"{"breaker":"auto"}"#).string("state") == "halfOpen")
            #expect(try await eventually(timeout: 6) { target.count >= 1 })
            // One canary: nothing else reaches the target while it runs (0.3 s).
            #expect(try await eventually(timeout: 5) { target.count >= 2 })
            let early = target.arrivals
            #expect(early[1] - early[0] >= 0.25, "one canary while halfOpen: the next request came \(early[1] - early[0]) s after it")
            // The canary answers after 0.3 s: the ramp lets 2^k go in its k-th second.
            #expect(try await eventually(timeout: 15) { target.count >= 15 }, "the 15 held: the canary, then 1, 2, 4, 8")
            let arrivals = target.arrivals
            let start = arrivals[1]
            for k in 0..<4 {
                let inSecond = arrivals.dropFirst().filter { $0 >= start + Double(k) - 0.05 && $0 < start + Double(k) + 0.95 }.count
                #expect(inSecond <= 1 << k, "second \(k) of the ramp: \(inSecond) starts, at most \(1 << k)")
            }
            #expect(try await waitForState(server, target.host, "closed", timeout: 5))
            #expect(try await breakerEvents(server) == ["closed->open", "open->halfOpen", "halfOpen->ramping", "ramping->closed"])
            let ids = held
            #expect(
                try await eventually(timeout: 5) {
                    var done = 0
                    for id in ids where try await server.request("GET", "/v1/operations/\(id)").string("outcome") == "succeeded" { done += 1 }
                    return done == ids.count
                })
            // The feed's host events have the contract's shape.
            let feed = try await server.request("GET", "/v1/events?after=0&limit=1000")
            let first = ((feed.object["events"] as? [[String: Any]]) ?? []).first { $0["key"] as? String == "breaker" } ?? [:]
            #expect(Set(first.keys) == ["seq", "time", "host", "key", "old", "new"])
            #expect(first["host"] as? String == target.host)
        }
    }

    @Test("a failed canary opens the host again for twice as long (±10%)")
    func escalation() async throws {
        let target = try SwitchableTarget()
        defer { target.stop() }
        try target.set(.unavailable)
        try await withLiveServer(Self.configure) { server in
            try await server.createQueue("q", maxConcurrent: 10)
            for _ in 0..<3 { _ = try await create(server, target.url()) }
            #expect(try await waitForState(server, target.host, "open"))
            // One canary for each reopening.
            for _ in 0..<4 { _ = try await create(server, target.url()) }
            // The open time of the n-th opening is 2^(n-1) s, ±10%: read as the openings come,
            // whichever of them a busy machine lets this test see.
            var seen: [Int: Double] = [:]
            let deadline = Date().addingTimeInterval(12)
            while Date() < deadline && seen.keys.filter({ $0 >= 2 }).count < 2 {
                let h = try await host(server, target.host)
                if let n = h.int("trips"), let a = parseTime(h.string("openedAt")), let b = parseTime(h.string("until")), h.string("state") == "open" {
                    seen[n] = b.timeIntervalSince(a)
                }
                try await Task.sleep(nanoseconds: 20_000_000)
            }
            #expect(seen.keys.filter { $0 >= 2 }.count >= 2, "saw openings \(seen.keys.sorted())")
            for (n, span) in seen {
                let expected = Double(1 << (n - 1))
                #expect((0.89 * expected...1.11 * expected).contains(span), "opening \(n): \(span) s, expected \(expected) s ± 10%")
            }
        }
    }

    @Test("a 404 never trips; a slow answer past the timeout does; another host is not held back")
    func whatCountsAsAFailure() async throws {
        let missing = try SwitchableTarget()
        let slow = try SwitchableTarget()
        let other = try SwitchableTarget()
        defer { [missing, slow, other].forEach { $0.stop() } }
        try missing.set(.notFound)
        try slow.set(.slow(seconds: 2))
        try await withLiveServer(Self.configure) { server in
            try await server.createQueue("q", maxConcurrent: 10)
            var ids: [String] = []
            for _ in 0..<5 { ids.append(try await create(server, missing.url())) }
            #expect(try await eventually { try await server.request("GET", "/v1/operations/\(ids[4])").string("state") == "finished" })
            let h = try await host(server, missing.host)
            #expect(h.string("state") == "closed" && h.int("consecutiveFailures") == 0, "\(h.text)")
            for _ in 0..<3 { _ = try await create(server, slow.url()) }
            #expect(try await waitForState(server, slow.host, "open", timeout: 15))
            #expect((try await host(server, slow.host).object["lastError"] as? [String: Any])?["type"] as? String == "timeout")
            let fine = try await create(server, other.url())
            #expect(try await eventually { try await server.request("GET", "/v1/operations/\(fine)").string("outcome") == "succeeded" })
        }
    }

    @Test("Retry-After in seconds and as an HTTP date holds the host without using an attempt")
    func retryAfter() async throws {
        let target = try SwitchableTarget()
        let dated = try SwitchableTarget()
        defer { [target, dated].forEach { $0.stop() } }
        try target.set(.tooManyRequests(retryAfter: "2"))
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        try await withLiveServer(Self.configure) { server in
            try await server.createQueue("q", maxConcurrent: 10)
            let id = try await create(server, target.url(), extra: #","retry":{"maxAttempts":2}"#)
            #expect(try await eventually { try await host(server, target.host).string("throttledUntil") != nil })
            let op = try await server.request("GET", "/v1/operations/\(id)")
            #expect(op.string("state") == "ready" && op.int("attempt") == 1, "back to ready, the same attempt: \(op.text)")
            let waiting = (op.object["waitingOn"] as? [[String: Any]]) ?? []
            #expect(waiting.contains { $0["type"] as? String == "host" && $0["state"] as? String == "throttled" && $0["until"] != nil })
            let until = try #require(parseTime(try await host(server, target.host).string("throttledUntil")))
            #expect((0.5...2.1).contains(until.timeIntervalSinceNow), "held for the 2 s asked: \(until.timeIntervalSinceNow)")
            try target.set(.up)
            while Date() < until.addingTimeInterval(-0.1) {
                #expect(target.count == 1, "nothing reaches it before Retry-After")
                try await Task.sleep(nanoseconds: 50_000_000)
            }
            #expect(try await eventually(timeout: 3) { try await server.request("GET", "/v1/operations/\(id)").string("outcome") == "succeeded" })
            #expect(try await server.request("GET", "/v1/operations/\(id)").int("attempt") == 1)

            try dated.set(.unavailableRetryAfter(formatter.string(from: Date().addingTimeInterval(4))))
            let other = try await create(server, dated.url())
            #expect(try await eventually { try await host(server, dated.host).string("throttledUntil") != nil })
            let held = try #require(parseTime(try await host(server, dated.host).string("throttledUntil")))
            #expect((1.0...4.1).contains(held.timeIntervalSinceNow), "held until the date: \(held.timeIntervalSinceNow)")
            #expect(try await server.request("GET", "/v1/operations/\(other)").string("state") == "ready")
            #expect(try await host(server, dated.host).string("state") == "closed", "a request to slow down is no failure")
        }
    }

    @Test("an operator opens, closes and hands a host back; the answers and refusals follow the contract")
    func byHand() async throws {
        let target = try SwitchableTarget()
        defer { target.stop() }
        try await withLiveServer(Self.configure) { server in
            try await server.createQueue("q", maxConcurrent: 10)
            expectProblem(try await host(server, target.host), 404, mentioning: [target.host])
            let opened = try await server.request(
                "PATCH", "/v1/hosts/\(target.host)", json: #"{"breaker":"open","reason":"maintenance","until":"2099-01-01T00:00:00Z"}"#)
            #expect(opened.status == 200, "\(opened.text)")
            #expect(opened.string("state") == "open" && opened.int("held") == 0)
            let manual = opened.object["manual"] as? [String: Any] ?? [:]
            #expect(manual["breaker"] as? String == "open" && manual["reason"] as? String == "maintenance")
            #expect(opened.object["throttledUntil"] == nil && opened.object["lastError"] == nil, "optional fields are left out, never null")
            var ids: [String] = []
            for _ in 0..<3 { ids.append(try await create(server, target.url())) }
            try await Task.sleep(nanoseconds: 300_000_000)
            #expect(target.count == 0)
            let list = try await server.request("GET", "/v1/hosts")
            let hosts = (list.object["hosts"] as? [[String: Any]]) ?? []
            #expect(hosts.count == 1 && hosts.first?["held"] as? Int == 3)
            let etag = try #require(list.headers["etag"])
            #expect(try await server.request("GET", "/v1/hosts", headers: ["If-None-Match": etag]).status == 304)
            // auto from a hand open: halfOpen, one canary.
            let auto = try await server.request("PATCH", "/v1/hosts/\(target.host)", json: #"{"breaker":"auto"}"#)
            #expect(auto.status == 200 && auto.object["manual"] == nil)
            #expect(try await eventually { try await server.request("GET", "/v1/operations/\(ids[2])").string("outcome") == "succeeded" })
            #expect(try await waitForState(server, target.host, "closed"))
            // Open again by hand, then closed: at once, no canary, no ramp.
            _ = try await server.request("PATCH", "/v1/hosts/\(target.host)", json: #"{"breaker":"open"}"#)
            for _ in 0..<6 { ids.append(try await create(server, target.url())) }
            let closed = try await server.request("PATCH", "/v1/hosts/\(target.host)", json: #"{"breaker":"closed","reason":"back"}"#)
            #expect(closed.string("state") == "closed")
            #expect(try await eventually(timeout: 2) { target.count == 9 }, "all six at once after closed")
            // Refusals name the field and change nothing.
            for (body, field) in [
                (#"{"breaker":"ajar"}"#, "breaker"), (#"{}"#, "breaker"), (#"{"breaker":"auto","until":"2099-01-01T00:00:00Z"}"#, "until"),
                (#"{"breaker":"open","until":"2001-01-01T00:00:00Z"}"#, "until"), (#"{"breaker":"open","reason":7}"#, "reason"),
                (#"{"breaker":"open","color":"red"}"#, "color"),
            ] {
                expectProblem(try await server.request("PATCH", "/v1/hosts/\(target.host)", json: body), 422, mentioning: [field])
            }
            for bad in ["nohost", "a:0", "a:99999", "a%3", "%5B::1:80", "bad%20host:80"] {
                expectProblem(try await server.request("PATCH", "/v1/hosts/\(bad)", json: #"{"breaker":"open"}"#), 422, mentioning: ["host"])
            }
            #expect(try await host(server, target.host).string("state") == "closed")
            // A host named by hand before any operation, upper case and percent-encoded.
            let v6 = try await server.request("PATCH", "/v1/hosts/%5B::1%5D:8080", json: #"{"breaker":"open"}"#)
            #expect(v6.string("host") == "[::1]:8080")
            #expect(try await server.request("GET", "/v1/hosts/API.Example.com:443").status == 404)
            // A page at a time, sorted by host.
            let page1 = try await server.request("GET", "/v1/hosts?limit=1")
            #expect(((page1.object["hosts"] as? [[String: Any]]) ?? []).map { $0["host"] as? String } == [target.host])
            let next = try #require(page1.string("next"))
            let page2 = try await server.request("GET", "/v1/hosts?limit=1&after=\(next)")
            #expect(((page2.object["hosts"] as? [[String: Any]]) ?? []).map { $0["host"] as? String } == ["[::1]:8080"])
            #expect(page2.object["next"] is NSNull)
            expectProblem(try await server.request("GET", "/v1/hosts?limit=0"), 422, mentioning: ["limit"])
        }
    }

    @Test("every breaker change reaches the event stream")
    func eventStream() async throws {
        try await withLiveServer(Self.configure) { server in
            let after = try await server.lastSeq()
            async let read = server.readEventStream("/v1/events/stream?after=\(after)", count: 2, timeout: 5)
            try await Task.sleep(nanoseconds: 200_000_000)
            _ = try await server.request("PATCH", "/v1/hosts/api.example.com:443", json: #"{"breaker":"open"}"#)
            _ = try await server.request("PATCH", "/v1/hosts/api.example.com:443", json: #"{"breaker":"auto"}"#)
            let events = try await read.events
            #expect(
                events.map { "\($0.object["host"] as? String ?? "?") \($0.object["old"] as? String ?? "?")->\($0.object["new"] as? String ?? "?")" } == [
                    "api.example.com:443 closed->open", "api.example.com:443 open->halfOpen",
                ])
            #expect(events.allSatisfy { $0.object["key"] as? String == "breaker" && $0.object["queue"] == nil })
        }
    }
}
