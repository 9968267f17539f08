import Foundation
import QueueAPI
import QueueEngine
import QueueTesting
import Testing

/// Hosts (API.md "Hosts: hold the work while a target is down") end to end: real `http`
/// operations against a ``SwitchableTarget`` switched between up, refusing, 503, slow, 429 or 503
/// with `Retry-After`, and 404, on a live server whose breakers open after 3 failures in a row
/// for 1 s (doubled at each reopening, up to 8 s). What the target received is the proof of
/// what was held.
@Suite("Hosts: a circuit breaker per target host, through HTTP")
struct HostEndpointTests {
    static func breaker(open seconds: Double = 1) -> (inout OpqdConfiguration) -> Void {
        { $0.limits.breaker = BreakerSettings(failures: 3, openSeconds: seconds, maxOpenSeconds: 8) }
    }

    /// `date` as the API writes times: RFC 3339, UTC, milliseconds.
    static func rfc3339(_ date: Date) -> String {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return f.string(from: Date(timeIntervalSince1970: (date.timeIntervalSince1970 * 1000).rounded(.down) / 1000))
    }

    @Test("three failures open the host; nothing reaches it while open; one canary; then 2^k starts in the k-th second; the feed tells it")
    func tripCanaryRamp() async throws {
        let target = try SwitchableTarget(.refusing)
        defer { target.stop() }
        // Open for 5 s: long enough that the host is still open when it is read below, after 41
        // creates, even on a loaded machine (tests run in parallel).
        try await withLiveServer(Self.breaker(open: 5)) { server in
            let schema = try await HostSchema.served(by: server)
            try await server.createQueue("q", maxConcurrent: 100)
            let early = try await server.addHTTP("q", target.url(), count: 2)
            for id in early { #expect(try await server.waitForOutcome(id) == "failed") }
            let closed = try await server.hostJSON(target.host)
            #expect(closed.string("state") == "closed" && closed.int("consecutiveFailures") == 2 && closed.int("trips") == 0, "\(closed.text)")
            #expect((closed.object["lastError"] as? [String: Any])?["type"] as? String == "connection-refused", "\(closed.text)")
            schema.check(closed.object)

            // The third failure opens it; the 40 added then are held, ready, never started.
            let third = try await server.addHTTP("q", target.url())[0]
            #expect(try await server.waitForHostState(target.host, "open"))
            // From now on the target answers (after 0.6 s): what reaches it is what the host let go.
            try target.set(.slow(seconds: 0.6))
            #expect(try await server.waitForOutcome(third) == "failed")
            let ids = try await server.addHTTP("q", target.url(), count: 40)
            let open = try await server.hostJSON(target.host)
            schema.check(open.object)
            #expect(open.int("trips") == 1 && open.int("consecutiveFailures") == 3, "\(open.text)")
            let openedAt = try #require(parseTime(open.object["openedAt"]))
            let until = try #require(parseTime(open.object["until"]))
            #expect((4.498...5.502).contains(until.timeIntervalSince(openedAt)), "open for 5 s ± 10%: \(open.text)")

            // One canary, then the ramp from its success: 2^k starts in its k-th second until none is left.
            #expect(try await eventually(timeout: 20) { target.count == 40 }, "\(target.summary)")
            #expect(try await server.waitForHostState(target.host, "closed"))
            let events = try await server.breakerEvents(target.host)
            #expect(events.map(\.transition) == ["closed->open", "open->halfOpen", "halfOpen->ramping", "ramping->closed"])
            for e in events {
                #expect(Set(e.object.keys) == ["seq", "time", "host", "key", "old", "new"], "\(e.object)")
                #expect(e.object["host"] as? String == target.host && e.object["key"] as? String == "breaker")
            }
            let halfOpenAt = try #require(parseTime(events.first { $0.transition == "open->halfOpen" }?.object["time"]))
            let rampStart = try #require(parseTime(events.first { $0.transition == "halfOpen->ramping" }?.object["time"]))
            let hits = target.hits
            // Event times are the server's clock in whole milliseconds (rounded down).
            #expect(hits.allSatisfy { $0.time >= halfOpenAt }, "a request while the host was open: \(hits.map(\.time)), halfOpen at \(halfOpenAt)")
            #expect(hits[1].at - hits[0].at >= 0.55, "the ramp waits for the canary's answer (0.6 s): one canary")
            var perSecond = [Int](repeating: 0, count: 8)
            for hit in hits.dropFirst() {
                let k = Int(hit.time.timeIntervalSince(rampStart).rounded(.down))
                #expect(k >= 0, "a start before the canary's success")
                if (0..<perSecond.count).contains(k) { perSecond[k] += 1 }
            }
            // The bound, and that the ramp used it (the queue's 100 slots never held it back).
            for (k, n) in perSecond.enumerated() { #expect(n <= 1 << k, "second \(k) of the ramp: \(n) starts, at most \(1 << k): \(perSecond)") }
            #expect(Array(perSecond.prefix(6)) == [1, 2, 4, 8, 16, 8], "starts per second of the ramp: \(perSecond)")
            for id in ids {
                #expect(try await server.waitForOutcome(id) == "succeeded")
                #expect(try await server.operation(id)["attempt"] as? Int == 1, "one attempt each")
            }
        }
    }

    @Test("a canary that fails opens the host again for twice as long, ±10%; a retry due meanwhile waits ready with its attempt")
    func escalation() async throws {
        // Slower than the operations' timeout of 0.5 s: every request is a timeout.
        let target = try SwitchableTarget(.slow(seconds: 3))
        defer { target.stop() }
        try await withLiveServer(Self.breaker()) { server in
            let schema = try await HostSchema.served(by: server)
            try await server.createQueue("q", maxConcurrent: 10)
            _ = try await server.addHTTP("q", target.url(), count: 3, timeout: 0.5)
            #expect(try await server.waitForHostState(target.host, "open", timeout: 10))
            let retried = try await server.addHTTP("q", target.url(), timeout: 0.5, extra: #","retry":{"maxAttempts":3,"backoff":0.1}"#)[0]
            let younger = try await server.addHTTP("q", target.url(), timeout: 0.5)[0]
            // Each open period as the host shows it (until - openedAt), by its trip number (a slow
            // machine may read one late: then the events below still bound it).
            var spans: [Int: Double] = [:]
            for trips in 1...3 {
                var shown: TestResponse?
                #expect(
                    try await eventually(timeout: 10) {
                        let h = try await server.hostJSON(target.host)
                        if (h.int("trips") ?? 0) >= trips { shown = h }
                        return shown != nil
                    })
                let h = try #require(shown)
                schema.check(h.object)
                #expect((h.object["lastError"] as? [String: Any])?["type"] as? String == "timeout", "\(h.text)")
                // A slow machine may read it after its open period ended (halfOpen: no until).
                if h.string("state") == "open" {
                    let openedAt = try #require(parseTime(h.object["openedAt"]))
                    spans[h.int("trips") ?? 0] = try #require(parseTime(h.object["until"])).timeIntervalSince(openedAt)
                } else {
                    #expect(h.string("state") == "halfOpen" && h.object["until"] == nil, "\(h.text)")
                }
                if trips == 2 {
                    // The canary was the older held operation; its retry (after 0.1 s) came due while open.
                    let waited = try await eventually {
                        let op = try await server.operation(retried)
                        return op["state"] as? String == "ready" && [2, 3].contains(op["attempt"] as? Int)
                            && (op["waitingOn"] as? [[String: Any]])?.first?["state"] as? String == "open"
                    }
                    #expect(waited, "the retried canary, ready with its next attempt, waiting for the open host")
                }
            }
            for (trip, span) in spans {
                let base = Double(1 << (trip - 1))
                #expect((0.9 * base - 0.002...1.1 * base + 0.002).contains(span), "open period \(trip): \(span) s, expected \(base) s ± 10%: \(spans)")
            }
            let young = try await server.operation(younger)
            #expect(young["state"] as? String == "ready" && young["attempt"] as? Int == 0, "the younger one waits its turn, never started: \(young)")
            let events = try await server.breakerEvents(target.host)
            // The first five (a slow machine may read them after the third open period ended).
            #expect(Array(events.map(\.transition).prefix(5)) == ["closed->open", "open->halfOpen", "halfOpen->open", "open->halfOpen", "halfOpen->open"])
            // Three requests opened it; then exactly one in each halfOpen, none while open.
            let times = Array(events.compactMap { parseTime($0.object["time"]) }.prefix(5))
            let hits = target.hits
            #expect(hits.count >= 5 && times.count == 5, "\(target.summary)")
            if hits.count >= 5 && times.count == 5 {
                // Each open period from its event to the next (halfOpen comes at `until`, or later on a busy machine).
                for (i, base) in [(0, 1.0), (2, 2.0)] {
                    let open = times[i + 1].timeIntervalSince(times[i])
                    #expect((0.9 * base - 0.002...1.1 * base + 0.5).contains(open), "open period \(i / 2 + 1): \(open) s, expected \(base) s ± 10%")
                }
                #expect(hits.prefix(3).allSatisfy { $0.time <= times[0].addingTimeInterval(0.001) })
                #expect(times[1] <= hits[3].time && hits[3].time <= times[2].addingTimeInterval(0.001), "the first canary")
                #expect(times[3] <= hits[4].time && hits[4].time <= times[4].addingTimeInterval(0.001), "the second canary")
            }
        }
    }

    @Test("the canary is the first held operation that can start: one in a queue suspended meanwhile does not stall the host")
    func canaryAcrossQueues() async throws {
        let target = try SwitchableTarget(.up)
        defer { target.stop() }
        try await withLiveServer(Self.breaker()) { server in
            try await server.createQueue("a", maxConcurrent: 1)
            try await server.createQueue("b", maxConcurrent: 1)
            try await server.request("PATCH", "/v1/hosts/\(target.host)", json: #"{"breaker":"open"}"#).expecting(200)
            // Both held; the one in `a` is older, so it would be the canary, but `a` is then suspended.
            let older = try await server.addHTTP("a", target.url())[0]
            let younger = try await server.addHTTP("b", target.url())[0]
            #expect(try await eventually { try await server.hostJSON(target.host).int("held") == 2 })
            try await server.request("PATCH", "/v1/queues/a", json: #"{"isSuspended":true}"#).expecting(200)
            try await server.request("PATCH", "/v1/hosts/\(target.host)", json: #"{"breaker":"auto"}"#).expecting(200)
            // halfOpen: the held operation in `b` can start, so it is the canary.
            let outcome = try await server.waitForOutcome(younger, timeout: 2)
            let host = try await server.hostJSON(target.host).text
            // The first held operation's queue is suspended: the canary is the first one whose
            // queue can start it.
            #expect(outcome == "succeeded", "host: \(host); target: \(target.summary)")
            #expect(try await server.state(older) == "ready")
            #expect(target.count == 1, "one canary, the one in `b`: \(target.summary)")
        }
    }

    @Test("a 404 never trips; a 503 does; another host, even in the same queue, is not held back")
    func whatTrips() async throws {
        let missing = try SwitchableTarget(.notFound)
        let failing = try SwitchableTarget(.serviceUnavailable(retryAfter: nil))
        let other = try SwitchableTarget(.up)
        defer { [missing, failing, other].forEach { $0.stop() } }
        try await withLiveServer(Self.breaker(open: 5)) { server in
            let schema = try await HostSchema.served(by: server)
            try await server.createQueue("q", maxConcurrent: 1)
            let notFound = try await server.addHTTP("q", missing.url(), count: 6)
            for id in notFound { #expect(try await server.waitForOutcome(id) == "failed") }
            #expect(missing.count(.notFound) == 6)
            let m = try await server.hostJSON(missing.host)
            schema.check(m.object)
            #expect(m.string("state") == "closed" && m.int("consecutiveFailures") == 0 && m.int("trips") == 0, "\(m.text)")
            #expect(m.object["lastError"] == nil && m.object["openedAt"] == nil && m.object["until"] == nil, "\(m.text)")

            let ids = try await server.addHTTP("q", failing.url(), count: 8)
            #expect(try await server.waitForHostState(failing.host, "open"))
            let f = try await server.hostJSON(failing.host)
            schema.check(f.object)
            #expect((f.object["lastError"] as? [String: Any])?["type"] as? String == "http-status", "\(f.text)")
            #expect(try await eventually { try await server.hostJSON(failing.host).int("held") == 5 })
            // The queue's one slot is free: held operations take none.
            let fine = try await server.addHTTP("q", other.url())[0]
            #expect(try await server.waitForOutcome(fine, timeout: 2) == "succeeded")
            #expect(try await server.hostJSON(other.host).string("state") == "closed")
            #expect(failing.count == 3, "\(failing.summary)")
            for id in ids.suffix(5) { #expect(try await server.state(id) == "ready") }
            let list = try await server.request("GET", "/v1/hosts").expecting(200)
            #expect(Set(list.object.keys) == ["hosts", "next"] && list.object["next"] is NSNull, "one page: \(list.text)")
            let hosts = list.objects("hosts")
            let names = [missing.host, failing.host, other.host].sorted()
            #expect(hosts.compactMap { $0["host"] as? String } == names)
            for h in hosts { schema.check(h) }
            let etag = try #require(list.headers["etag"])
            #expect(try await server.request("GET", "/v1/hosts", headers: ["If-None-Match": etag]).status == 304)
            let one = try await server.hostJSON(failing.host)
            #expect(try await server.request("GET", "/v1/hosts/\(failing.host)", headers: ["If-None-Match": one.headers["etag"] ?? "?"]).status == 304)
            // A page at a time: `next` names the last host of a page, for `after`.
            let first = try await server.request("GET", "/v1/hosts?limit=2").expecting(200)
            #expect(first.objects("hosts").compactMap { $0["host"] as? String } == Array(names.prefix(2)) && first.string("next") == names[1], "\(first.text)")
            let rest = try await server.request("GET", "/v1/hosts?limit=2&after=\(names[1])").expecting(200)
            #expect(rest.objects("hosts").compactMap { $0["host"] as? String } == [names[2]] && rest.object["next"] is NSNull, "\(rest.text)")
        }
    }

    @Test("Retry-After in seconds (429) and as an HTTP date (503) holds the host without using an attempt")
    func retryAfter() async throws {
        let seconds = try SwitchableTarget(.tooManyRequests(retryAfter: "3"))
        let dated = try SwitchableTarget(.refusing)
        defer { [seconds, dated].forEach { $0.stop() } }
        try await withLiveServer(Self.breaker()) { server in
            let schema = try await HostSchema.served(by: server)
            try await server.createQueue("q", maxConcurrent: 10)
            // HTTP dates have whole seconds: a wait of 4 to 5 s.
            let date = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 + 5).rounded(.down))
            try dated.set(.serviceUnavailable(retryAfter: SwitchableTarget.httpDate(date)))
            // One attempt each: a request to slow down that used it would fail them.
            let a = try await server.addHTTP("q", seconds.url(), extra: #","retry":{"maxAttempts":1}"#)[0]
            let b = try await server.addHTTP("q", dated.url(), extra: #","retry":{"maxAttempts":1}"#)[0]
            // Each target answers once, then is up again: the wait it asked for is what holds the work.
            var asked: [TestResponse] = []
            for target in [seconds, dated] {
                var shown: TestResponse?
                #expect(
                    try await eventually {
                        let h = try await server.hostJSON(target.host)
                        if h.string("throttledUntil") != nil { shown = h }
                        return shown != nil
                    })
                try target.set(.up)
                asked.append(try #require(shown))
            }
            for (h, (target, id)) in zip(asked, [(seconds, a), (dated, b)]) {
                schema.check(h.object)
                #expect(h.string("state") == "closed" && h.int("consecutiveFailures") == 0 && h.int("trips") == 0, "no failure: \(h.text)")
                let until = try #require(parseTime(h.object["throttledUntil"]))
                if target === seconds {
                    // The wait runs from the answer: 3 s after the request that got it.
                    let after = until.timeIntervalSince(try #require(seconds.hits.first).time)
                    #expect((2.99...3.3).contains(after), "throttledUntil \(until), \(after) s after the 429")
                } else {
                    #expect(abs(until.timeIntervalSince(date)) < 0.05, "until the date \(date): \(until)")
                }
                // Held, ready, with the same attempt.
                let op = try await server.operation(id)
                #expect(op["state"] as? String == "ready" && op["attempt"] as? Int == 1, "\(op)")
                let waiting = op["waitingOn"] as? [[String: Any]] ?? []
                #expect(waiting.count == 1 && Set((waiting.first ?? [:]).keys) == ["type", "host", "state", "until"], "\(waiting)")
                #expect(waiting.first?["type"] as? String == "host" && waiting.first?["host"] as? String == target.host)
                #expect(waiting.first?["state"] as? String == "throttled" && waiting.first?["until"] as? String == h.string("throttledUntil"), "\(waiting)")
            }
            // A new operation to a host that asked to wait waits too.
            let c = try await server.addHTTP("q", seconds.url())[0]
            for id in [a, b, c] {
                #expect(try await server.waitForOutcome(id, timeout: 8) == "succeeded")
                #expect(try await server.operation(id)["attempt"] as? Int == 1)
            }
            // Nothing reached a target before the time it named.
            let hits = seconds.hits
            for (i, hit) in hits.enumerated().dropLast() where hit.mode != .up {
                #expect(hits[i + 1].at - hit.at >= 2.99, "a request \(hits[i + 1].at - hit.at) s after a 429 asking for 3 s: \(seconds.summary)")
            }
            #expect(
                dated.hits.allSatisfy { $0.mode == .up ? $0.time >= date.addingTimeInterval(-0.002) : $0.time < date },
                "\(dated.hits.map(\.time)), date \(date)")
            #expect(seconds.count(.up) == 2 && dated.count(.up) == 1, "\(seconds.summary); \(dated.summary)")
        }
    }

    @Test("Retry-After is obeyed up to an hour, one that cannot be read counts as none, and the 21st request to slow down in a row uses an attempt")
    func retryAfterEdges() async throws {
        let long = try SwitchableTarget(.tooManyRequests(retryAfter: "999999"))
        let unreadable = try SwitchableTarget(.tooManyRequests(retryAfter: "soon"))
        let unreadable503 = try SwitchableTarget(.serviceUnavailable(retryAfter: "soon"))
        let again = try SwitchableTarget(.tooManyRequests(retryAfter: "0"))
        defer { [long, unreadable, unreadable503, again].forEach { $0.stop() } }
        try await withLiveServer(Self.breaker()) { server in
            try await server.createQueue("q", maxConcurrent: 10)
            let one = #","retry":{"maxAttempts":1}"#
            _ = try await server.addHTTP("q", long.url(), extra: one)
            _ = try await server.addHTTP("q", unreadable.url(), extra: one)
            let failed = try await server.addHTTP("q", unreadable503.url(), extra: one)[0]
            let repeated = try await server.addHTTP("q", again.url(), extra: one)[0]
            // Times are set beside the request that got the answer (its arrival at the target).
            #expect(try await eventually { try await server.hostJSON(long.host).string("throttledUntil") != nil })
            let capped = try #require(parseTime(try await server.hostJSON(long.host).object["throttledUntil"]))
            let longHit = try #require(long.hits.first)
            #expect((3599.99...3600.5).contains(capped.timeIntervalSince(longHit.time)), "an hour at most: \(capped) for a 429 at \(longHit.time)")
            // Without a usable Retry-After: 1 s, doubled for each such answer in a row (the target
            // keeps asking, so the wait read may be a later one).
            #expect(try await eventually { try await server.hostJSON(unreadable.host).string("throttledUntil") != nil })
            let fallback = try #require(parseTime(try await server.hostJSON(unreadable.host).object["throttledUntil"]))
            let before = unreadable.hits.filter { $0.time <= fallback }
            let wait = fallback.timeIntervalSince(try #require(before.last).time)
            let expected = Double(1 << (before.count - 1))
            #expect((expected - 0.01...expected + 0.5).contains(wait), "answer \(before.count) in a row without a usable Retry-After: \(wait) s")
            // A 503 whose Retry-After cannot be read is a plain 503: a failure of the host.
            #expect(try await server.waitForOutcome(failed) == "failed")
            let h = try await server.hostJSON(unreadable503.host)
            #expect(h.object["throttledUntil"] == nil && h.int("consecutiveFailures") == 1, "\(h.text)")
            // Retry-After: 0 asks again at once: 20 in a row are free, the 21st is the attempt.
            #expect(try await server.waitForOutcome(repeated) == "failed")
            #expect(again.count == 21, "\(again.summary)")
            let op = try await server.operation(repeated)
            #expect(op["attempt"] as? Int == 1 && (op["error"] as? [String: Any])?["type"] as? String == "http-status", "\(op)")
        }
    }

    @Test("past --max-hosts, a PATCH naming a new host is 429 and operations to an untracked host run without a breaker")
    func maxHosts() async throws {
        let target = try SwitchableTarget(.up)
        defer { target.stop() }
        try await withLiveServer({ $0.limits.breaker = BreakerSettings(failures: 3, openSeconds: 1, maxOpenSeconds: 8, maxHosts: 2) }) { server in
            try await server.createQueue("q", maxConcurrent: 10)
            // A closed host with nothing held goes first: this one makes room for the two below.
            let first = try await server.addHTTP("q", target.url())[0]
            #expect(try await server.waitForOutcome(first) == "succeeded")
            try await server.request("PATCH", "/v1/hosts/one.example:443", json: #"{"breaker":"open"}"#).expecting(200)
            try await server.request("PATCH", "/v1/hosts/two.example:443", json: #"{"breaker":"closed"}"#).expecting(200)
            #expect(try await server.request("GET", "/v1/hosts/\(target.host)").status == 404, "forgotten")
            let refused = try await server.request("PATCH", "/v1/hosts/three.example:443", json: #"{"breaker":"open"}"#)
            expectProblem(refused, 429)
            #expect(refused.string("type")?.hasSuffix("too-many-hosts") == true, "\(refused.text)")
            let untracked = try await server.addHTTP("q", target.url())[0]
            #expect(try await server.waitForOutcome(untracked) == "succeeded")
            #expect(try await server.request("GET", "/v1/hosts").expecting(200).objects("hosts").count == 2)
        }
    }

    @Test("an operator opens a host (new operations held), closes it (all at once), hands it back (halfOpen); a hand open ends at its until")
    func byHand() async throws {
        let target = try SwitchableTarget(.slow(seconds: 0.5))
        defer { target.stop() }
        try await withLiveServer(Self.breaker()) { server in
            let schema = try await HostSchema.served(by: server)
            try await server.createQueue("q", maxConcurrent: 100)
            let path = "/v1/hosts/\(target.host)"
            let opened = try await server.request("PATCH", path, json: #"{"breaker":"open","reason":"maintenance"}"#).expecting(200)
            schema.check(opened.object)
            #expect(opened.string("state") == "open" && opened.int("held") == 0 && opened.object["until"] == nil, "no end: \(opened.text)")
            #expect(canonical(opened.object["manual"]) == canonical(["breaker": "open", "reason": "maintenance"]), "\(opened.text)")
            var ids = try await server.addHTTP("q", target.url(), count: 6)
            #expect(try await eventually { try await server.hostJSON(target.host).int("held") == 6 })
            let op = try await server.operation(ids[5])
            #expect(op["state"] as? String == "ready")
            let waiting = op["waitingOn"] as? [[String: Any]] ?? []
            #expect(
                canonical(waiting) == canonical([["type": "host", "host": target.host, "state": "open"]]), "no until for a hand open without end: \(waiting)")
            try await Task.sleep(nanoseconds: 300_000_000)
            #expect(target.count == 0)

            // auto from a hand open: halfOpen, one canary, then the ramp.
            let auto = try await server.request("PATCH", path, json: #"{"breaker":"auto"}"#).expecting(200)
            schema.check(auto.object)
            #expect(auto.string("state") == "halfOpen" && auto.object["manual"] == nil, "\(auto.text)")
            for id in ids { #expect(try await server.waitForOutcome(id, timeout: 8) == "succeeded") }
            #expect(try await server.waitForHostState(target.host, "closed"))
            let ramp = target.hits
            #expect(ramp.count == 6 && ramp[1].at - ramp[0].at >= 0.45, "one canary, answered after 0.5 s, before the rest: \(ramp.map(\.at))")

            // Open until a time, then closed by hand before it: everything held starts at once.
            let end = Date().addingTimeInterval(30)
            let untilText = Self.rfc3339(end)
            let again = try await server.request("PATCH", path, json: #"{"breaker":"open","until":"\#(untilText)","reason":"deploy"}"#).expecting(200)
            schema.check(again.object)
            #expect(again.string("until") == untilText && (again.object["manual"] as? [String: Any])?["until"] as? String == untilText, "\(again.text)")
            let more = try await server.addHTTP("q", target.url(), count: 5)
            ids += more
            #expect(try await eventually { try await server.hostJSON(target.host).int("held") == 5 })
            let heldAgain = try await server.operation(more[4])
            #expect(
                canonical(heldAgain["waitingOn"]) == canonical([["type": "host", "host": target.host, "state": "open", "until": untilText]]),
                "\(heldAgain)")
            let before = target.count
            let closed = try await server.request("PATCH", path, json: #"{"breaker":"closed","reason":"back"}"#).expecting(200)
            schema.check(closed.object)
            #expect(closed.string("state") == "closed" && closed.object["until"] == nil, "\(closed.text)")
            #expect(canonical(closed.object["manual"]) == canonical(["breaker": "closed", "reason": "back"]), "\(closed.text)")
            for id in more { #expect(try await server.waitForOutcome(id) == "succeeded") }
            // No canary, no ramp: started together (a ramp would take 2 s for 5: 1, 2, then 2).
            let released = target.hits.dropFirst(before).map(\.at)
            #expect(released.count == 5 && (released.max() ?? 9) - (released.min() ?? 0) < 0.8, "\(released)")

            // Held closed by hand, failures are counted but do not open it; auto lets them count.
            try target.set(.refusing)
            let failing = try await server.addHTTP("q", target.url(), count: 4)
            for id in failing { #expect(try await server.waitForOutcome(id) == "failed") }
            let counted = try await server.hostJSON(target.host)
            #expect(counted.string("state") == "closed" && counted.int("consecutiveFailures") == 4, "\(counted.text)")
            try await server.request("PATCH", path, json: #"{"breaker":"auto"}"#).expecting(200)
            _ = try await server.addHTTP("q", target.url())

            // It opens again (read from the feed: the open lasts about 1 s, which a loaded run's
            // polls of the state can miss; after it, time moves it on to halfOpen).
            let expected = ["closed->open", "open->halfOpen", "halfOpen->ramping", "ramping->closed", "closed->open", "open->closed", "closed->open"]
            var transitions = try await server.breakerEvents(target.host).map(\.transition)
            for _ in 0..<250 where transitions.count < expected.count {
                try await Task.sleep(nanoseconds: 20_000_000)
                transitions = try await server.breakerEvents(target.host).map(\.transition)
            }
            #expect(Array(transitions.prefix(expected.count)) == expected, "\(transitions)")

            // A hand open with an end goes halfOpen by itself then.
            let soon = Self.rfc3339(Date().addingTimeInterval(2))
            let other = "/v1/hosts/maintained.example:443"
            try await server.request("PATCH", other, json: #"{"breaker":"open","until":"\#(soon)"}"#).expecting(200)
            #expect(try await server.request("GET", other).string("state") == "open")
            #expect(try await eventually(timeout: 5) { try await server.request("GET", other).string("state") == "halfOpen" })
            #expect(try await server.request("GET", other).object["manual"] == nil)
        }
    }

    @Test("an unknown host is 404; a malformed one is 422 naming host; a bad body is 422 naming its field and changes nothing")
    func refusals() async throws {
        try await withLiveServer(Self.breaker()) { server in
            expectProblem(try await server.request("GET", "/v1/hosts/api.example.com:443"), 404, mentioning: ["api.example.com:443"])
            #expect(try await server.request("GET", "/v1/hosts").expecting(200).text == #"{"hosts":[],"next":null}"#)
            for bad in ["nohost", "a:0", "a:99999", "a:", "a%3", "%5B::1:80", "bad%20host:80", "a:8o"] {
                expectProblem(try await server.request("GET", "/v1/hosts/\(bad)"), 422, mentioning: ["host"])
                expectProblem(try await server.request("PATCH", "/v1/hosts/\(bad)", json: #"{"breaker":"open"}"#), 422, mentioning: ["host"])
            }
            let path = "/v1/hosts/api.example.com:443"
            for (body, field) in [
                (#"{"breaker":"ajar"}"#, "breaker"), (#"{}"#, "breaker"), (#"{"breaker":null}"#, "breaker"), (#"{"breaker":"halfOpen"}"#, "breaker"),
                (#"{"breaker":"auto","until":"2099-01-01T00:00:00Z"}"#, "until"), (#"{"breaker":"open","until":"2001-01-01T00:00:00Z"}"#, "until"),
                (#"{"breaker":"open","until":"tomorrow"}"#, "until"), (#"{"breaker":"open","reason":7}"#, "reason"),
                (#"{"breaker":"open","reason":"\#(String(repeating: "x", count: 513))"}"#, "reason"), (#"{"breaker":"auto","reason":"x"}"#, "reason"),
                (#"{"breaker":"open","color":"red"}"#, "color"),
            ] {
                expectProblem(try await server.request("PATCH", path, json: body), 422, mentioning: [field])
            }
            // None of them tracked the host.
            #expect(try await server.request("GET", path).status == 404)
            // Case and percent-encoding name the same host; an IPv6 one is kept in brackets.
            let upper = try await server.request("PATCH", "/v1/hosts/API.Example.COM%3A443", json: #"{"breaker":"open"}"#).expecting(200)
            #expect(upper.string("host") == "api.example.com:443")
            #expect(try await server.request("GET", "/v1/hosts/%5B::1%5D:8080").status == 404)
            let v6 = try await server.request("PATCH", "/v1/hosts/%5B::1%5D:8080", json: #"{"breaker":"closed"}"#).expecting(200)
            #expect(v6.string("host") == "[::1]:8080" && v6.string("state") == "closed")
        }
    }

    @Test("a breaker change reaches the SSE stream as the feed has it")
    func eventStream() async throws {
        let target = try SwitchableTarget(.refusing)
        defer { target.stop() }
        try await withLiveServer(Self.breaker()) { server in
            try await server.createQueue("q", maxConcurrent: 1)
            let after = try await server.lastSeq()
            // Read until the host goes halfOpen (1 s after it opened, by itself: nothing is held).
            async let stream = server.readEventStream(
                "/v1/events/stream?after=\(after)", count: 10_000, timeout: 10, stop: { $0.object["new"] as? String == "halfOpen" })
            _ = try await server.addHTTP("q", target.url(), count: 3)
            let sse = (try await stream).events.filter { $0.object["key"] as? String == "breaker" }
            let feed = try await server.breakerEvents(target.host)
            #expect(sse.map { "\($0.object["old"] ?? "?")->\($0.object["new"] ?? "?")" } == ["closed->open", "open->halfOpen"], "\(sse)")
            #expect(sse.map { canonical($0.object) } == feed.map { canonical($0.object) }, "the same events in the stream and the feed: \(feed.map(\.object))")
            for e in sse {
                #expect(Set(e.object.keys) == ["seq", "time", "host", "key", "old", "new"], "\(e)")
                #expect(e.object["host"] as? String == target.host && e.event == "change")
                #expect(e.id == (e.object["seq"] as? Int).map(String.init))
            }
            // openapi.yaml: `until` is when an open host goes halfOpen, or when a ramp ends: a host
            // halfOpen by time has none.
            let halfOpen = try await server.hostJSON(target.host)
            #expect(halfOpen.string("state") == "halfOpen", "\(halfOpen.text)")
            #expect(halfOpen.object["until"] == nil, "\(halfOpen.text)")
        }
    }

    @Test("an open host comes back open after kill -9, and nothing reaches its target at the start", arguments: StoreChoice.allCases)
    func killNine(store choice: StoreChoice) async throws {
        let binary = try OpqdBinary.locate()
        let store = try choice.prepare()
        let data = try makeTemporaryDirectory(prefix: "opqd-hosts-data")
        let target = try SwitchableTarget(.refusing)
        // Held by hand until a time that passes while the server is down; answers after 0.8 s.
        let maintained = try SwitchableTarget(.slow(seconds: 0.8))
        defer {
            target.stop()
            maintained.stop()
            store.remove()
            try? FileManager.default.removeItem(atPath: data)
        }
        // Open long enough (300 s, the default cap) to outlast this test under a loaded parallel run (50 s seen).
        let flags = ["--breaker-failures", "3", "--breaker-open", "300"] + store.arguments
        var server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-0.log", extraArguments: flags)
        try server.request("POST", "/v1/queues", json: #"{"name":"q","maxConcurrentOperationCount":1}"#).expecting(201)
        func add(_ n: Int, to url: String = target.url()) throws -> [String] {
            let ops = Array(repeating: #"{"queue":"q","kind":"http","spec":{"method":"GET","url":"\#(url)","timeout":2}}"#, count: n)
            let r = try server.request("POST", "/v1/operations:batch", json: #"{"operations":[\#(ops.joined(separator: ","))]}"#).expecting(201)
            return r.objects("operations").compactMap { $0["id"] as? String }
        }
        _ = try add(3)
        let opened = try await onThread { [server, target] in
            waitUntil(timeout: 5) { (try? server.request("GET", "/v1/hosts/\(target.host)"))?.string("state") == "open" }
        }
        guard opened else { throw Unexpected("the host did not open:\n\(server.logTail())") }
        try target.set(.up)
        try server.request("PATCH", "/v1/queues/q", json: #"{"maxConcurrentOperationCount":10}"#).expecting(200)
        // Acknowledged, so durable, and so is the host's change committed before them.
        let held = try add(5)
        try server.request("PATCH", "/v1/hosts/planned.example:443", json: #"{"breaker":"open","reason":"maintenance"}"#).expecting(200)
        let end = Date().addingTimeInterval(1.5)
        try server.request("PATCH", "/v1/hosts/\(maintained.host)", json: #"{"breaker":"open","until":"\#(Self.rfc3339(end))"}"#).expecting(200)
        let maintainedOps = try add(4, to: maintained.url())
        let before = try server.request("GET", "/v1/hosts/\(target.host)").expecting(200)
        #expect(before.string("state") == "open" && before.int("held") == 5, "\(before.text)")
        server.killNow()

        if end.timeIntervalSinceNow > 0 { try await Task.sleep(nanoseconds: UInt64(end.timeIntervalSinceNow * 1e9) + 50_000_000) }
        server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-1.log", extraArguments: flags)
        defer { server.killNow() }
        try await onThread { [server] in try StoreChoice.awaitOwner(server) }
        let after = try server.request("GET", "/v1/hosts/\(target.host)").expecting(200)
        #expect(after.string("state") == "open", "\(after.text)")
        for key in ["openedAt", "until", "consecutiveFailures", "lastError"] {
            #expect(before.object[key] != nil && canonical(after.object[key]) == canonical(before.object[key]), "\(key): \(before.text) then \(after.text)")
        }
        let planned = try server.request("GET", "/v1/hosts/planned.example:443").expecting(200)
        #expect(planned.string("state") == "open" && (planned.object["manual"] as? [String: Any])?["reason"] as? String == "maintenance", "\(planned.text)")
        let heldAgain = try await onThread { [server, target] in
            waitUntil(timeout: 5) { (try? server.request("GET", "/v1/hosts/\(target.host)"))?.int("held") == 5 }
        }
        #expect(heldAgain, "held again after the restart")
        for id in held {
            let op = try server.request("GET", "/v1/operations/\(id)").expecting(200)
            #expect(op.string("state") == "ready" && op.int("attempt") == 0, "never started: \(op.text)")
            let host = (op.object["waitingOn"] as? [[String: Any]])?.first { $0["type"] as? String == "host" }
            #expect(canonical(host) == canonical(["type": "host", "host": target.host, "state": "open", "until": after.string("until") ?? "?"]), "\(op.text)")
        }
        let metrics = try server.request("GET", "/metrics").expecting(200).text
        #expect(metrics.contains(#"opqd_host_breaker_state{host="\#(target.host)",state="open"} 1"#))
        #expect(metrics.contains(#"opqd_host_held{host="\#(target.host)"} 5"#))
        try await Task.sleep(nanoseconds: 700_000_000)
        #expect(target.count == 0, "nothing reached the target after the restart: \(target.summary)")
        // The hand open ended while the server was down: it comes back halfOpen, one canary first.
        let ranAll = try await onThread { [server] in
            waitUntil(timeout: 8) { maintainedOps.allSatisfy { (try? server.request("GET", "/v1/operations/\($0)"))?.string("outcome") == "succeeded" } }
        }
        let arrivals = maintained.hits.map(\.at)
        #expect(ranAll && arrivals.count == 4, "\(maintained.summary)")
        #expect(arrivals.count >= 2 && arrivals[1] - arrivals[0] >= 0.75, "one canary, answered after 0.8 s, before the rest: \(arrivals)")
        let feed = try server.request("GET", "/v1/events?after=0&limit=10000").expecting(200).objects("events")
        #expect(feed.contains { $0["host"] as? String == target.host && $0["old"] as? String == "closed" && $0["new"] as? String == "open" })
        // Released by hand, they all run: held intact.
        try server.request("PATCH", "/v1/hosts/\(target.host)", json: #"{"breaker":"closed"}"#).expecting(200)
        let ran = try await onThread { [server, held] in
            waitUntil(timeout: 5) { held.allSatisfy { (try? server.request("GET", "/v1/operations/\($0)"))?.string("outcome") == "succeeded" } }
        }
        #expect(ran, "every held operation ran once released")
        #expect(target.count == 5, "\(target.summary)")
    }
}

// MARK: - helpers

/// `value` as sorted JSON text, to compare decoded JSON values.
private func canonical(_ value: Any?) -> String {
    guard let value, let data = try? JSONSerialization.data(withJSONObject: value, options: [.sortedKeys, .fragmentsAllowed]) else { return "nil" }
    return String(decoding: data, as: UTF8.self)
}

/// One breaker event of the feed.
private struct HostEvent {
    let object: [String: Any]
    var transition: String { "\(object["old"] as? String ?? "?")->\(object["new"] as? String ?? "?")" }
}

extension LiveServer {
    /// Adds `count` `http` GET operations to `url` in one batch (in order); their ids.
    fileprivate func addHTTP(_ queue: String, _ url: String, count: Int = 1, timeout: Double = 1, extra: String = "") async throws -> [String] {
        let one = #"{"queue":"\#(queue)","kind":"http","spec":{"method":"GET","url":"\#(url)","timeout":\#(timeout)}\#(extra)}"#
        let r = try await request("POST", "/v1/operations:batch", json: #"{"operations":[\#(Array(repeating: one, count: count).joined(separator: ","))]}"#)
            .expecting(201, "adding \(count) http operations")
        let ids = r.objects("operations").compactMap { $0["id"] as? String }
        guard ids.count == count else { throw Unexpected("\(ids.count) ids for \(count) operations", r) }
        return ids
    }

    /// `GET /v1/hosts/{host}`; throws unless 200.
    fileprivate func hostJSON(_ host: String) async throws -> TestResponse {
        try await request("GET", "/v1/hosts/\(host)").expecting(200, "getting host \(host)")
    }

    fileprivate func waitForHostState(_ host: String, _ state: String, timeout: Double = 5) async throws -> Bool {
        try await eventually(timeout: timeout, every: 0.005) { try await hostJSON(host).string("state") == state }
    }

    /// The operation's outcome once finished (nil if it is not within `timeout`).
    fileprivate func waitForOutcome(_ id: String, timeout: Double = 5) async throws -> String? {
        _ = try await waitForState(id, "finished", timeout: timeout)
        return try await operation(id)["outcome"] as? String
    }

    /// The breaker events of `host` in the feed, oldest first.
    fileprivate func breakerEvents(_ host: String) async throws -> [HostEvent] {
        var out: [HostEvent] = []
        var after = 0
        while true {
            let page = try await request("GET", "/v1/events?after=\(after)&limit=1000").expecting(200)
            let events = page.objects("events")
            if events.isEmpty { return out }
            out += events.filter { $0["host"] as? String == host }.map(HostEvent.init)
            after = page.int("next") ?? after
        }
    }
}

/// The `Host` schema of the served openapi.yaml, read from its text: which members a host has,
/// which are required, and what each holds. A host's JSON is checked against it, so the test
/// and the document cannot drift apart.
private struct HostSchema {
    var required: Set<String> = []
    /// Each member's lines in the schema.
    var members: [String: [String]] = [:]
    var manualRequired: Set<String> = []
    var manualMembers: Set<String> = []
    var states: Set<String> = []
    var namePattern = ""

    static func served(by server: LiveServer) async throws -> HostSchema {
        let yaml = try await server.request("GET", "/openapi.yaml").expecting(200).text
        let lines = yaml.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        func block(_ name: String) throws -> [String] {
            guard let start = lines.firstIndex(of: "    \(name):") else { throw Unexpected("openapi.yaml has no schema \(name)") }
            let rest = lines[(start + 1)...]
            let end = rest.firstIndex { $0.hasPrefix("    ") && !$0.hasPrefix("     ") || !$0.hasPrefix(" ") && !$0.isEmpty } ?? lines.endIndex
            return Array(lines[(start + 1)..<end])
        }
        func list(_ line: String?) -> Set<String> {
            guard let line, let open = line.firstIndex(of: "["), let close = line.lastIndex(of: "]") else { return [] }
            return Set(line[line.index(after: open)..<close].split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
        }
        var s = HostSchema()
        let host = try block("Host")
        s.required = list(host.first { $0.hasPrefix("      required:") })
        var current: String?
        var inManual = false
        for line in host {
            if line.hasPrefix("        "), !line.hasPrefix("         "), line.hasSuffix(":") {
                current = line.trimmingCharacters(in: .whitespaces).dropLast().description
                inManual = current == "manual"
                s.members[current!] = []
                continue
            }
            guard let c = current else { continue }
            s.members[c]?.append(line)
            if inManual {
                if line.hasPrefix("          required:") { s.manualRequired = list(line) }
                if line.hasPrefix("            "), !line.hasPrefix("             "), line.hasSuffix(":") {
                    s.manualMembers.insert(line.trimmingCharacters(in: .whitespaces).dropLast().description)
                }
            }
        }
        s.states = list(try block("BreakerState").first { $0.contains("enum:") })
        let pattern = try block("HostName").first { $0.contains("pattern:") } ?? ""
        s.namePattern = pattern.components(separatedBy: "'").dropFirst().first ?? ""
        guard !s.required.isEmpty, !s.members.isEmpty, !s.states.isEmpty, !s.namePattern.isEmpty, !s.manualMembers.isEmpty else {
            throw Unexpected("could not read the Host schema from openapi.yaml: \(s)")
        }
        return s
    }

    /// Records an issue for every way `h` differs from the schema: a required member missing,
    /// a member the schema does not name, a null (optional members are left out instead), or a
    /// value of the wrong kind.
    func check(_ h: [String: Any], sourceLocation: SourceLocation = #_sourceLocation) {
        let text = "\(h)"
        for key in required where h[key] == nil { Issue.record("\(key) is required: \(text)", sourceLocation: sourceLocation) }
        for (key, value) in h {
            guard let lines = members[key] else {
                Issue.record("\(key) is not a member of Host in openapi.yaml: \(text)", sourceLocation: sourceLocation)
                continue
            }
            if value is NSNull {
                Issue.record("\(key) is null; an absent value is left out: \(text)", sourceLocation: sourceLocation)
                continue
            }
            // What the member itself is: its first lines (a nested member's own types come later).
            let spec = lines.prefix(2).joined(separator: "\n")
            let ok: Bool
            if spec.contains("schemas/HostName") {
                ok = (value as? String).map { $0.range(of: namePattern, options: .regularExpression) != nil } ?? false
            } else if spec.contains("schemas/BreakerState") {
                ok = (value as? String).map(states.contains) ?? false
            } else if spec.contains("schemas/Timestamp") {
                ok = parseTime(value) != nil
            } else if spec.contains("type: integer") {
                ok = (value as? Int).map { $0 >= 0 } ?? false
            } else if spec.contains("type: object") {
                ok = value is [String: Any]
            } else {
                ok = false
            }
            if !ok { Issue.record("\(key) does not hold what openapi.yaml says (\(spec)): \(text)", sourceLocation: sourceLocation) }
        }
        if let error = h["lastError"] as? [String: Any] {
            if !(error["type"] is String && error["detail"] is String) { Issue.record("lastError: \(error)", sourceLocation: sourceLocation) }
        }
        if let manual = h["manual"] as? [String: Any] {
            for key in manualRequired where manual[key] == nil { Issue.record("manual.\(key) is required: \(text)", sourceLocation: sourceLocation) }
            for key in manual.keys where !manualMembers.contains(key) {
                Issue.record("manual.\(key) is not in openapi.yaml: \(text)", sourceLocation: sourceLocation)
            }
            if let b = manual["breaker"] as? String, !["open", "closed"].contains(b) { Issue.record("manual.breaker \(b)", sourceLocation: sourceLocation) }
        }
    }
}
