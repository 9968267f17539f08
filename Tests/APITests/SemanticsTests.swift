import Foundation
import QueueTesting
import Testing

@Suite("Semantics over HTTP")
struct SemanticsTests {
    @Test("a dependency in another queue holds the dependent pending until it finishes")
    func crossQueueDependency() async throws {
        try await withLiveServer { server in
            try await server.createQueue("first", suspended: true)
            try await server.createQueue("second")
            // Long enough that b is looked at while a runs, even when a loaded machine takes
            // seconds per request (1 s was not: a finished before b was read, in the full run).
            let a = try await server.addDelay("first", seconds: 5.0)
            let b = try await server.addDelay("second", seconds: 0.01, dependencies: [a])
            let early = try await server.operation(b)
            #expect(early["state"] as? String == "pending", "\(early)")
            #expect(early["isReady"] as? Bool == false)
            #expect(early["dependencies"] as? [String] == [a])
            _ = try await server.request("POST", "/v1/queues/first/resume").expecting(200)
            #expect(try await server.waitForState(a, "executing", timeout: 10))
            let during = try await server.state(b)
            // b was read while a ran only if a is still running now: otherwise there is nothing to tell.
            try #require(try await server.state(a) == "executing", "a finished before b could be looked at during its run")
            #expect(during == "pending")
            #expect(try await server.waitForState(b, "finished", timeout: 20))
            let aDone = try await server.operation(a)
            let bDone = try await server.operation(b)
            #expect(aDone["outcome"] as? String == "succeeded")
            #expect(bDone["outcome"] as? String == "succeeded")
            let aEnd = try #require(parseTime(aDone["finishedAt"]))
            let bStart = try #require(parseTime(bDone["startedAt"]))
            #expect(bStart >= aEnd)
        }
    }

    @Test("a dependency that finished cancelled still counts as finished")
    func cancelledDependencyReleases() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            try await server.createQueue("held", suspended: true)
            let a = try await server.addDelay("held")
            let b = try await server.addDelay("q", seconds: 0.01, dependencies: [a])
            _ = try await server.request("POST", "/v1/operations/\(a)/cancel").expecting(200)
            #expect(try await server.waitForState(b, "finished"))
            #expect(try await server.operation(b)["outcome"] as? String == "succeeded")
        }
    }

    @Test("a suspended queue keeps new operations ready but not executing until resumed")
    func suspendedQueue() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            _ = try await server.request("POST", "/v1/queues/q/suspend").expecting(200)
            let id = try await server.addDelay("q", seconds: 0.05)
            try await Task.sleep(nanoseconds: 200_000_000)
            let op = try await server.operation(id)
            #expect(op["state"] as? String == "ready", "\(op)")
            #expect(op["isReady"] as? Bool == true)
            #expect(op["isExecuting"] as? Bool == false)
            #expect(op["startedAt"] == nil)
            #expect((try await server.queue("q")["counts"] as? [String: Any])?["executing"] as? Int == 0)
            _ = try await server.request("POST", "/v1/queues/q/resume").expecting(200)
            #expect(try await server.waitForState(id, "finished"))
        }
    }

    @Test("suspending a queue lets executing operations finish and starts no new one")
    func suspendLetsRunningFinish() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 1)
            // Long enough that the suspend lands while it runs, even on a machine whose disk
            // makes every commit slow (2 s was not, beside the other suites, on a busy disk).
            let running = try await server.addDelay("q", seconds: 5.0)
            let next = try await server.addDelay("q", seconds: 0.01)
            #expect(try await server.waitForState(running, "executing"))
            let suspended = try await server.request("POST", "/v1/queues/q/suspend").expecting(200)
            let counts = suspended.object["counts"] as? [String: Any]
            try #require(counts?["executing"] as? Int == 1 && counts?["ready"] as? Int == 1, "suspended too late to tell: \(suspended)")
            #expect(try await server.waitForState(running, "finished", timeout: 15))
            #expect(try await server.operation(running)["outcome"] as? String == "succeeded")
            try await Task.sleep(nanoseconds: 150_000_000)
            let held = try await server.operation(next)
            #expect(held["state"] as? String == "ready", "\(held)")
            _ = try await server.request("POST", "/v1/queues/q/resume").expecting(200)
            #expect(try await server.waitForState(next, "finished"))
        }
    }

    @Test("a serial queue runs ready operations by priority, then in the order they were added")
    func priorityOrder() async throws {
        try await withLiveServer { server in
            try await server.createQueue("serial", maxConcurrent: 1, suspended: true)
            let plan: [(String, String)] = [
                ("low", "low-1"), ("normal", "normal-1"), ("veryHigh", "veryHigh-1"), ("high", "high-1"),
                ("veryLow", "veryLow-1"), ("normal", "normal-2"), ("high", "high-2"),
            ]
            var names: [String: String] = [:]
            for (priority, name) in plan {
                names[try await server.addDelay("serial", seconds: 0.02, priority: priority, name: name)] = name
            }
            _ = try await server.request("POST", "/v1/queues/serial/resume").expecting(200)
            let waited = try await server.request("GET", "/v1/queues/serial/wait?timeout=10")
            #expect(waited.bool("idle") == true)
            // The order they started, from the change feed (seq order). The feed shows committed
            // events only, and the idle answer does not wait for the last commit: read it until
            // every start is there (a loaded machine once showed six of seven).
            var started: [String] = []
            _ = try await eventually(timeout: 10) {
                let feed = try await server.request("GET", "/v1/events?after=0&limit=10000").objects("events")
                started = feed.filter { $0["key"] as? String == "isExecuting" && $0["new"] as? Bool == true }
                    .compactMap { ($0["operation"] as? String).flatMap { names[$0] } }
                return started.count == plan.count
            }
            #expect(started == ["veryHigh-1", "high-1", "high-2", "normal-1", "normal-2", "low-1", "veryLow-1"])
            // Serial: no two ran at once.
            var intervals: [(Date, Date)] = []
            for id in names.keys {
                let op = try await server.operation(id)
                intervals.append((try #require(parseTime(op["startedAt"])), try #require(parseTime(op["finishedAt"]))))
            }
            intervals.sort { $0.0 < $1.0 }
            for (a, b) in zip(intervals, intervals.dropFirst()) { #expect(b.0 >= a.1) }
        }
    }

    @Test("an operation's ETag answers If-None-Match with 304 until it changes")
    func operationETag() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            let id = try await server.addDelay("q")
            let first = try await server.request("GET", "/v1/operations/\(id)")
            let etag = try #require(first.headers["ETag"])
            let same = try await server.request("GET", "/v1/operations/\(id)", headers: ["If-None-Match": etag])
            #expect(same.status == 304)
            #expect(same.body.isEmpty)
            #expect(same.headers["ETag"] == etag)
            _ = try await server.request("PATCH", "/v1/operations/\(id)", json: #"{"queuePriority":"low"}"#).expecting(200)
            let changed = try await server.request("GET", "/v1/operations/\(id)", headers: ["If-None-Match": etag])
            #expect(changed.status == 200)
            #expect(changed.string("queuePriority") == "low")
            let newTag = try #require(changed.headers["ETag"])
            #expect(newTag != etag)
            #expect(try await server.request("GET", "/v1/operations/\(id)", headers: ["If-None-Match": newTag]).status == 304)
        }
    }

    @Test("a queue's ETag answers If-None-Match with 304 until it changes")
    func queueETag() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            let first = try await server.request("GET", "/v1/queues/q")
            let etag = try #require(first.headers["ETag"])
            let same = try await server.request("GET", "/v1/queues/q", headers: ["If-None-Match": etag])
            #expect(same.status == 304)
            #expect(same.body.isEmpty)
            _ = try await server.addDelay("q")
            let changed = try await server.request("GET", "/v1/queues/q", headers: ["If-None-Match": etag])
            #expect(changed.status == 200, "adding an operation changes the queue's counts")
            let newTag = try #require(changed.headers["ETag"])
            #expect(newTag != etag)
            _ = try await server.request("POST", "/v1/queues/q/resume").expecting(200)
            let resumed = try await server.request("GET", "/v1/queues/q", headers: ["If-None-Match": newTag])
            #expect(resumed.status == 200)
            #expect(resumed.headers["ETag"] != newTag)
        }
    }

    @Test("a retried create with the same Idempotency-Key returns the first operation and creates no second")
    func idempotencyReplay() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            let body = #"{"kind":"delay","spec":{"seconds":0.05}}"#
            let first = try await server.request("POST", "/v1/queues/q/operations", json: body, headers: ["Idempotency-Key": "k-1"])
            #expect(first.status == 201)
            let id = try #require(first.string("id"))
            let again = try await server.request("POST", "/v1/queues/q/operations", json: body, headers: ["Idempotency-Key": "k-1"])
            #expect(again.status == 201)
            #expect(again.string("id") == id)
            #expect(again.headers["Location"] == "/v1/operations/\(id)")
            #expect(try await server.operations(in: "q").count == 1)
            // A different key is a different request.
            let other = try await server.request("POST", "/v1/queues/q/operations", json: body, headers: ["Idempotency-Key": "k-2"])
            #expect(other.status == 201)
            #expect(other.string("id") != id)
            #expect(try await server.operations(in: "q").count == 2)
        }
    }

    @Test("reusing an Idempotency-Key with a different body is refused with 422 and creates nothing")
    func idempotencyMismatch() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            _ = try await server.request(
                "POST", "/v1/queues/q/operations", json: #"{"kind":"delay","spec":{"seconds":0.05}}"#,
                headers: ["Idempotency-Key": "same"]
            ).expecting(201)
            let before = try await server.fingerprint()
            let r = try await server.request(
                "POST", "/v1/queues/q/operations", json: #"{"kind":"delay","spec":{"seconds":9}}"#,
                headers: ["Idempotency-Key": "same"])
            expectProblem(r, 422, mentioning: ["Idempotency-Key"])
            #expect(try await server.fingerprint() == before)
            #expect(try await server.operations(in: "q").count == 1)
        }
    }

    @Test("a retried queue create with the same Idempotency-Key replays the 201 instead of a 409")
    func idempotentQueueCreate() async throws {
        try await withLiveServer { server in
            let body = #"{"name":"once"}"#
            let first = try await server.request("POST", "/v1/queues", json: body, headers: ["Idempotency-Key": "q-1"])
            #expect(first.status == 201)
            let again = try await server.request("POST", "/v1/queues", json: body, headers: ["Idempotency-Key": "q-1"])
            #expect(again.status == 201)
            #expect(again.headers["Location"] == "/v1/queues/once")
            #expect(try await server.queueNames() == ["once"])
        }
    }
}

@Suite("Durability")
struct DurabilityTests {
    @Test("queues and operations a server acknowledged are there after a restart on the same data")
    func survivesRestart() async throws {
        let data = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: data) }
        let (ready, paused, finished) = try await withLiveServer({ $0.data = data }) { server in
            try await server.createQueue("kept", maxConcurrent: 2, suspended: true)
            try await server.createQueue("ran")
            let ready = try await server.addDelay("kept", priority: "high", name: "later")
            let paused = try await server.addDelay("kept", dependencies: [ready])
            _ = try await server.request("POST", "/v1/operations/\(paused)/pause").expecting(200)
            let finished = try await server.addDelay("ran", seconds: 0)
            #expect(try await server.waitForState(finished, "finished"))
            return (ready, paused, finished)
        }
        try await withLiveServer({ $0.data = data }) { server in
            let kept = try await server.queue("kept")
            #expect(kept["maxConcurrentOperationCount"] as? Int == 2)
            #expect(kept["isSuspended"] as? Bool == true)
            let r = try await server.operation(ready)
            #expect(r["state"] as? String == "ready", "\(r)")
            #expect(r["queuePriority"] as? String == "high")
            #expect(r["name"] as? String == "later")
            let p = try await server.operation(paused)
            #expect(p["state"] as? String == "paused", "\(p)")
            #expect(p["dependencies"] as? [String] == [ready])
            let f = try await server.operation(finished)
            #expect(f["state"] as? String == "finished", "\(f)")
            #expect(f["outcome"] as? String == "succeeded")
            // And it goes on: new ids do not collide with the old ones.
            let fresh = try await server.addDelay("ran", seconds: 0)
            #expect(![ready, paused, finished].contains(fresh))
        }
    }
}
