import Foundation
import QueueTesting
import Testing

/// Flow control through HTTP on a real server (API.md "Flow control", "Why is it not running?").
@Suite("Flow control endpoints")
struct FlowEndpointTests {
    /// The times of every start (`isExecuting` false → true) of `queue`'s operations, from the feed.
    static func starts(_ server: LiveServer, queue: String) async throws -> [Date] {
        var after = 0
        var out: [Date] = []
        while true {
            let page = try await server.request("GET", "/v1/events?after=\(after)&limit=10000").expecting(200)
            let events = page.objects("events")
            if events.isEmpty { return out }
            for e in events where e["queue"] as? String == queue && e["key"] as? String == "isExecuting" && e["new"] as? Bool == true {
                if let t = parseTime(e["time"]) { out.append(t) }
            }
            after = page.int("next") ?? after
        }
    }

    static func createOp(_ server: LiveServer, _ queue: String, seconds: Double = 0, limits: String? = nil, fairness: String? = nil, extra: String = "")
        async throws -> String
    {
        var body = #"{"kind":"delay","spec":{"seconds":\#(seconds)}"#
        if let limits { body += #","limits":\#(limits)"# }
        if let fairness { body += #","fairnessKey":"\#(fairness)""# }
        body += extra + "}"
        let r = try await server.request("POST", "/v1/queues/\(queue)/operations", json: body).expecting(201, body)
        return try #require(r.string("id"))
    }

    @Test("a queue's rate: at most burst + perSecond × t starts in any window of t seconds, and not much fewer")
    func queueRate() async throws {
        try await withLiveServer { server in
            try await server.request(
                "POST", "/v1/queues", json: #"{"name":"paced","maxConcurrentOperationCount":100,"rateLimit":{"perSecond":20,"burst":5}}"#
            ).expecting(201)
            var batch: [String] = []
            for _ in 0..<45 { batch.append(#"{"queue":"paced","kind":"delay","spec":{"seconds":0}}"#) }
            let begin = Date()
            try await server.request("POST", "/v1/operations:batch", json: #"{"operations":[\#(batch.joined(separator: ","))]}"#).expecting(201)
            #expect(try await eventually(timeout: 10) { (try await server.queue("paced")["operationCount"] as? Int) == 0 })
            let took = elapsed(since: begin)
            let times = try await Self.starts(server, queue: "paced").sorted()
            #expect(times.count == 45)
            // Over-delivery: every window [times[i], times[j]] holds j - i + 1 starts; the feed's
            // times are in milliseconds, so each window gets 2 ms of slack.
            var worst = 0.0
            for i in times.indices {
                for j in i..<times.count {
                    let t = times[j].timeIntervalSince(times[i]) + 0.002
                    let allowed = 5 + 20 * t
                    worst = max(worst, Double(j - i + 1) - allowed)
                }
            }
            #expect(worst <= 0.0001, "a window held \(worst) more starts than burst + perSecond × t")
            // Under-delivery: 45 starts need (45 - 5) / 20 = 2 s; allow scheduling slack.
            let span = (times.last ?? Date()).timeIntervalSince(times.first ?? Date())
            #expect(span >= 1.9 && span < 2.6, "45 starts took \(span) s from the first; the bucket allows them in 2.0 s")
            #expect(took < 5)
            let q = try await server.queue("paced")
            let rate = try #require(q["rateLimit"] as? [String: Any])
            #expect(rate["perSecond"] as? Double == 20 && rate["burst"] as? Int == 5)
        }
    }

    @Test("a limiter's concurrency is per key across queues; an override; a blocked key does not stall another")
    func limiterPerKey() async throws {
        try await withLiveServer { server in
            let l = try await server.request(
                "POST", "/v1/limiters", json: #"{"name":"stripe","concurrency":2,"overrides":{"vip":{"concurrency":3}}}"#
            ).expecting(201)
            #expect(l.headers["Location"] == "/v1/limiters/stripe")
            try await server.createQueue("a", maxConcurrent: 50)
            try await server.createQueue("b", maxConcurrent: 50)
            var busy: [String] = []
            for i in 0..<6 {
                busy.append(try await Self.createOp(server, i % 2 == 0 ? "a" : "b", seconds: 30, limits: #"[{"limiter":"stripe","key":"acct-1"}]"#))
            }
            var vip: [String] = []
            for _ in 0..<4 { vip.append(try await Self.createOp(server, "a", seconds: 30, limits: #"[{"limiter":"stripe","key":"vip"}]"#)) }
            let free = try await Self.createOp(server, "b", seconds: 30, limits: #"[{"limiter":"stripe","key":"acct-2"}]"#)
            var states: [String] = []
            for id in busy + vip + [free] { states.append(try await server.state(id) ?? "?") }
            #expect(
                states == ["executing", "executing", "ready", "ready", "ready", "ready", "executing", "executing", "executing", "ready", "executing"],
                "\(states)")
            let waiting = try await server.operation(busy[2])
            let w = try #require(waiting["waitingOn"] as? [[String: Any]])
            #expect(w.count == 1)
            #expect(w.first?["type"] as? String == "limiter" && w.first?["limiter"] as? String == "stripe")
            #expect(w.first?["key"] as? String == "acct-1" && w.first?["reason"] as? String == "concurrency")
            let s = try await server.request("GET", "/v1/limiters/stripe").expecting(200)
            #expect(s.int("running") == 6 && s.int("waiting") == 5 && s.int("keys") == 3)
            let keys = try await server.request("GET", "/v1/limiters/stripe/keys?limit=2").expecting(200)
            #expect(keys.objects("keys").map { $0["key"] as? String } == ["acct-1", "acct-2"])
            #expect(keys.string("next") == "acct-2")
            expectProblem(try await server.request("DELETE", "/v1/limiters/stripe"), 409, mentioning: ["stripe"])
            // A slot freed on one queue lets the oldest parked operation of the key go, on the other.
            try await server.request("POST", "/v1/operations/\(busy[0])/cancel").expecting(200)
            #expect(try await server.waitForState(busy[2], "executing"))
            // A wider budget takes effect at once: 4 slots for acct-1 (busy 1 to 4).
            try await server.request("PATCH", "/v1/limiters/stripe", json: #"{"concurrency":4}"#).expecting(200)
            #expect(try await server.waitForState(busy[3], "executing"))
            #expect(try await server.waitForState(busy[4], "executing"))
            #expect(try await server.state(busy[5]) == "ready")
            try await server.request("POST", "/v1/queues/a/cancel-all").expecting(200)
            try await server.request("POST", "/v1/queues/b/cancel-all").expecting(200)
            #expect(try await eventually(timeout: 5) { try await server.request("DELETE", "/v1/limiters/stripe").status == 204 })
            expectProblem(try await server.request("GET", "/v1/limiters/stripe"), 404, mentioning: ["stripe"])
        }
    }

    @Test("one tenant's 100,000 operations delay another tenant's one by a few starts")
    func fairness() async throws {
        try await withLiveServer({
            $0.limits.unfinishedPerQueue = 200_000
            $0.limits.batch = 10_000
        }) { plain in
            // Patient: under ThreadSanitizer a batch of 10,000 or a page of the feed takes seconds.
            let server = plain.patient(120)
            try await server.request("POST", "/v1/queues", json: #"{"name":"shared","maxConcurrentOperationCount":1,"isSuspended":true}"#)
                .expecting(201)
            let element = #"{"queue":"shared","kind":"delay","spec":{"seconds":0},"fairnessKey":"big"}"#
            let body = #"{"operations":[\#(Array(repeating: element, count: 10_000).joined(separator: ","))]}"#
            // Ten batches of 10,000: patient, for the ThreadSanitizer run, where one takes seconds.
            for _ in 0..<10 { try await server.request("POST", "/v1/operations:batch", json: body).expecting(201) }
            let small = try await Self.createOp(server, "shared", fairness: "small")
            let resumedAt = try await server.lastSeq()
            try await server.request("POST", "/v1/queues/shared/resume").expecting(200)
            #expect(try await server.waitForState(small, "finished", timeout: 10))
            try await server.request("POST", "/v1/queues/shared/suspend").expecting(200)
            // The starts after the resume, in order, from the feed.
            var order: [String] = []
            var after = resumedAt
            while !order.contains(small) {
                let page = try await server.request("GET", "/v1/events?after=\(after)&limit=1000").expecting(200)
                let events = page.objects("events")
                if events.isEmpty { break }
                for e in events where e["key"] as? String == "isExecuting" && e["new"] as? Bool == true {
                    if let id = e["operation"] as? String { order.append(id) }
                }
                after = page.int("next") ?? after
            }
            let before = order.firstIndex(of: small)
            #expect((before ?? 99) <= 2, "the small tenant's one operation started after \(before ?? -1) of the big tenant's")
            try await server.request("POST", "/v1/queues/shared/cancel-all").expecting(200)
        }
    }

    @Test("waitingOn names every reason an operation waits, and is empty for one that runs")
    func waitingOnReasons() async throws {
        try await withLiveServer { server in
            try await server.request("POST", "/v1/queues", json: #"{"name":"w","maxConcurrentOperationCount":1}"#).expecting(201)
            try await server.request("POST", "/v1/limiters", json: #"{"name":"api","rate":{"perSecond":0.01,"burst":1}}"#).expecting(201)
            func reasons(_ id: String) async throws -> [String] {
                let op = try await server.operation(id)
                return (op["waitingOn"] as? [[String: Any]] ?? []).compactMap { $0["type"] as? String }
            }
            let running = try await Self.createOp(server, "w", seconds: 30)
            #expect(try await reasons(running) == [])
            let dep = try await Self.createOp(server, "w", extra: #","dependencies":["\#(running)"]"#)
            #expect(try await reasons(dep) == ["dependencies"])
            #expect(((try await server.operation(dep))["waitingOn"] as? [[String: Any]])?.first?["count"] as? Int == 1)
            let later = try await Self.createOp(server, "w", extra: #","notBefore":"2100-01-01T00:00:00Z""#)
            #expect(try await reasons(later) == ["notBefore"])
            let queued = try await Self.createOp(server, "w")
            #expect(try await reasons(queued) == ["concurrency"])
            try await server.request("POST", "/v1/operations/\(queued)/pause").expecting(200)
            #expect(try await reasons(queued) == ["paused"])
            try await server.request("POST", "/v1/operations/\(queued)/resume").expecting(200)
            try await server.request("POST", "/v1/queues/w/suspend").expecting(200)
            #expect(try await reasons(queued) == ["suspended", "concurrency"])
            try await server.request("POST", "/v1/queues/w/resume").expecting(200)
            // A limiter's rate: the first takes the one token, the second waits for the next.
            try await server.request("POST", "/v1/queues", json: #"{"name":"r","maxConcurrentOperationCount":10}"#).expecting(201)
            _ = try await Self.createOp(server, "r", seconds: 30, limits: #"[{"limiter":"api","key":"k"}]"#)
            let limited = try await Self.createOp(server, "r", limits: #"[{"limiter":"api","key":"k"}]"#)
            let w = try #require((try await server.operation(limited))["waitingOn"] as? [[String: Any]])
            #expect(w.first?["type"] as? String == "limiter" && w.first?["reason"] as? String == "rate" && w.first?["until"] is String)
            // A queue's rate.
            try await server.request("POST", "/v1/queues", json: #"{"name":"qr","rateLimit":{"perSecond":0.01}}"#).expecting(201)
            _ = try await Self.createOp(server, "qr", seconds: 30)
            let paced = try await Self.createOp(server, "qr")
            #expect(try await reasons(paced) == ["rate"])
            // A retry's backoff, while it is still executing.
            try await server.request("POST", "/v1/queues", json: #"{"name":"b"}"#).expecting(201)
            let failing = try await server.request(
                "POST", "/v1/queues/b/operations",
                json: #"{"kind":"http","spec":{"method":"GET","url":"http://127.0.0.1:1/"},"retry":{"maxAttempts":3,"backoff":60}}"#
            ).expecting(201).string("id")
            let f = try #require(failing)
            #expect(try await eventually(timeout: 5) { try await reasons(f) == ["backoff"] })
            // An ETag that names waitingOn: the same revision with another reason is another tag.
            let r1 = try await server.request("GET", "/v1/operations/\(queued)")
            let tag = try #require(r1.headers["ETag"])
            try await server.request("POST", "/v1/queues/w/suspend").expecting(200)
            let r2 = try await server.request("GET", "/v1/operations/\(queued)", headers: ["If-None-Match": tag])
            #expect(r2.status == 200, "waitingOn changed: the old tag must not match")
            let finishedOne = try await Self.createOp(server, "r")
            _ = finishedOne
            for q in ["w", "r", "qr", "b"] { try await server.request("POST", "/v1/queues/\(q)/cancel-all").expecting(200) }
            #expect((try await server.operation(running))["waitingOn"] == nil, "a finished operation has no waitingOn")
        }
    }

    @Test("bad flow input is refused naming the field, and changes nothing")
    func badInput() async throws {
        try await withLiveServer({ $0.limits.limiterKeys = 2 }) { server in
            try await server.createQueue("q", maxConcurrent: 1)
            try await server.request("POST", "/v1/limiters", json: #"{"name":"l","concurrency":1}"#).expecting(201)
            _ = try await Self.createOp(server, "q", seconds: 30)
            let before = try await server.fingerprint()
            let cases: [(String, String, String, Int, String)] = [
                ("POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":{"seconds":1},"limits":[{"limiter":"nope"}]}"#, 422, "limits[0].limiter"),
                (
                    "POST", "/v1/queues/q/operations",
                    #"{"kind":"delay","spec":{"seconds":1},"limits":[\#(Array(repeating: #"{"limiter":"l"}"#, count: 9).joined(separator: ","))]}"#, 422,
                    "limits"
                ),
                (
                    "POST", "/v1/queues/q/operations",
                    #"{"kind":"delay","spec":{"seconds":1},"limits":[{"limiter":"l","key":"\#(String(repeating: "k", count: 129))"}]}"#, 422, "limits[0].key"
                ),
                ("POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":{"seconds":1},"limits":[{"limiter":"l","key":7}]}"#, 422, "limits[0].key"),
                ("POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":{"seconds":1},"limits":[{"limiter":"l"},{"limiter":"l"}]}"#, 422, "limits[1]"),
                (
                    "POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":{"seconds":1},"fairnessKey":"\#(String(repeating: "f", count: 129))"}"#, 422,
                    "fairnessKey"
                ),
                (
                    "POST", "/v1/operations:batch",
                    #"{"operations":[{"queue":"q","kind":"delay","spec":{"seconds":1}},{"queue":"q","kind":"delay","spec":{"seconds":1},"limits":[{"limiter":"nope"}]}]}"#,
                    422, "operations[1].limits[0].limiter"
                ),
                ("POST", "/v1/queues", #"{"name":"x","rateLimit":{"perSecond":0}}"#, 422, "rateLimit.perSecond"),
                ("POST", "/v1/queues", #"{"name":"x","rateLimit":{"perSecond":1e400}}"#, 400, ""),
                ("POST", "/v1/queues", #"{"name":"x","rateLimit":{"perSecond":5,"burst":0}}"#, 422, "rateLimit.burst"),
                ("POST", "/v1/queues", #"{"name":"x","rateLimit":{"perSecond":5,"burst":1.5}}"#, 422, "rateLimit.burst"),
                ("POST", "/v1/queues", #"{"name":"x","rateLimit":"fast"}"#, 422, "rateLimit"),
                ("POST", "/v1/queues", #"{"name":"x","fairnessWeights":{"a":0}}"#, 422, "fairnessWeights.a"),
                ("PATCH", "/v1/queues/q", #"{"rateLimit":{"perSecond":100001}}"#, 422, "rateLimit.perSecond"),
                ("POST", "/v1/limiters", #"{"name":"m"}"#, 422, "concurrency"),
                ("POST", "/v1/limiters", #"{"name":"m","concurrency":-1}"#, 422, "concurrency"),
                ("POST", "/v1/limiters", #"{"name":"m","concurrency":1,"overrides":{"k":{}}}"#, 422, "overrides.k"),
                ("POST", "/v1/limiters", #"{"name":"bad name","concurrency":1}"#, 422, "name"),
                ("POST", "/v1/limiters", #"{"name":"l","concurrency":1}"#, 409, "l"),
                ("PATCH", "/v1/limiters/l", #"{"concurrency":null}"#, 422, "concurrency"),
                ("PATCH", "/v1/limiters/nope", #"{"concurrency":2}"#, 404, "nope"),
                ("GET", "/v1/limiters/l/keys?limit=0", "", 422, "limit"),
            ]
            for (method, path, body, status, field) in cases {
                let r = try await server.request(method, path, json: body.isEmpty ? nil : body)
                expectProblem(r, status, mentioning: field.isEmpty ? [] : [field])
            }
            #expect(try await server.fingerprint() == before, "a refused request changed something")
            // The keys in use are bounded: a third key is 429.
            _ = try await Self.createOp(server, "q", limits: #"[{"limiter":"l","key":"1"}]"#)
            _ = try await Self.createOp(server, "q", limits: #"[{"limiter":"l","key":"2"}]"#)
            let third = try await server.request(
                "POST", "/v1/queues/q/operations", json: #"{"kind":"delay","spec":{"seconds":1},"limits":[{"limiter":"l","key":"3"}]}"#)
            expectProblem(third, 429, mentioning: ["--max-limiter-keys"])
        }
    }

    @Test("limits and fairnessKey travel with a copy and an archive")
    func copyAndArchive() async throws {
        try await withLiveServer { server in
            try await server.request("POST", "/v1/limiters", json: #"{"name":"l","concurrency":1}"#).expecting(201)
            try await server.request(
                "POST", "/v1/queues", json: #"{"name":"src","isSuspended":true,"rateLimit":{"perSecond":3},"fairnessWeights":{"t":2}}"#
            ).expecting(201)
            let id = try await Self.createOp(server, "src", limits: #"[{"limiter":"l","key":"k"}]"#, fairness: "t")
            let copy = try await server.request("POST", "/v1/operations/\(id)/copy", json: "{}").expecting(201)
            #expect((copy.object["limits"] as? [[String: Any]])?.first?["key"] as? String == "k")
            #expect(copy.string("fairnessKey") == "t")
            let cleared = try await server.request("POST", "/v1/operations/\(id)/copy", json: #"{"limits":[],"fairnessKey":null}"#).expecting(201)
            #expect(cleared.object["limits"] == nil && cleared.object["fairnessKey"] == nil)
            let archive = try await server.request("GET", "/v1/queues/src/archive").expecting(200)
            let restored = try await server.request("POST", "/v1/queues/dst/archive", body: Array(archive.text.utf8)).expecting(201)
            let q = try #require(restored.object["queue"] as? [String: Any])
            #expect((q["rateLimit"] as? [String: Any])?["burst"] as? Int == 3)
            #expect((q["fairnessWeights"] as? [String: Any])?["t"] as? Int == 2)
            let ops = try await server.operations(in: "dst")
            #expect(ops.count == 3)
            #expect(ops.filter { $0["fairnessKey"] as? String == "t" }.count == 2)
        }
    }
}
