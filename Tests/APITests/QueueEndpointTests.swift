import Foundation
import QueueTesting
import Testing

@Suite("Queue endpoints")
struct QueueEndpointTests {
    @Test("creating a queue answers 201 with the queue and a Location that serves it")
    func createQueue() async throws {
        try await withLiveServer { server in
            let r = try await server.request("POST", "/v1/queues", json: #"{"name":"downloads","maxConcurrentOperationCount":2}"#)
            #expect(r.status == 201)
            #expect(r.mediaType == "application/json")
            #expect(r.headers["Location"] == "/v1/queues/downloads")
            #expect(r.string("name") == "downloads")
            #expect(r.int("maxConcurrentOperationCount") == 2)
            #expect(r.bool("isSuspended") == false)
            #expect(r.int("operationCount") == 0)
            let location = try #require(r.headers["location"])
            let again = try await server.request("GET", location)
            #expect(again.status == 200)
            #expect(again.string("name") == "downloads")
            #expect(again.int("maxConcurrentOperationCount") == 2)
        }
    }

    @Test("a queue created without settings is a running queue with the server's default concurrency")
    func createQueueDefaults() async throws {
        try await withLiveServer({ $0.defaultMaxConcurrent = 3 }) { server in
            let r = try await server.createQueue("plain")
            #expect(r.int("maxConcurrentOperationCount") == -1)
            #expect(r.int("effectiveMaxConcurrentOperationCount") == 3)
            #expect(r.bool("isSuspended") == false)
            let suspended = try await server.createQueue("held", suspended: true)
            #expect(suspended.bool("isSuspended") == true)
            let dotted = try await server.createQueue("A.b-c_9")
            #expect(dotted.headers["Location"] == "/v1/queues/A.b-c_9")
            #expect(try await server.request("GET", "/v1/queues/A.b-c_9").status == 200)
            let longest = String(repeating: "z", count: 64)
            try await server.createQueue(longest)
            for name in ["A.b-c_9", "held", "plain", longest] {
                #expect(try await server.request("GET", "/v1/queues/\(name)").string("name") == name)
            }
        }
    }

    @Test("listing queues returns every queue with its counts")
    func listQueues() async throws {
        try await withLiveServer { server in
            try await server.createQueue("alpha")
            try await server.createQueue("beta", suspended: true)
            _ = try await server.addDelay("beta")
            _ = try await server.addDelay("beta")
            let r = try await server.request("GET", "/v1/queues")
            #expect(r.status == 200)
            let queues = r.objects("queues")
            #expect(queues.compactMap { $0["name"] as? String }.sorted() == ["alpha", "beta"])
            let beta = try #require(queues.first { $0["name"] as? String == "beta" })
            #expect(beta["operationCount"] as? Int == 2)
            #expect((beta["counts"] as? [String: Any])?["ready"] as? Int == 2)
            let alpha = try #require(queues.first { $0["name"] as? String == "alpha" })
            #expect(alpha["operationCount"] as? Int == 0)
        }
    }

    @Test("getting a queue shows its settings, counts per state and revision")
    func getQueue() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 1, suspended: true)
            let first = try await server.addDelay("q")
            _ = try await server.addDelay("q", dependencies: [first])
            let r = try await server.request("GET", "/v1/queues/q")
            #expect(r.status == 200)
            #expect(r.headers["ETag"] != nil)
            #expect(r.string("name") == "q")
            #expect(r.int("maxConcurrentOperationCount") == 1)
            #expect(r.bool("isSuspended") == true)
            #expect(r.int("operationCount") == 2)
            let counts = try #require(r.object["counts"] as? [String: Any])
            #expect(counts["ready"] as? Int == 1)
            #expect(counts["pending"] as? Int == 1)
            #expect(counts["executing"] as? Int == 0)
            #expect(r.int("revision") != nil)
        }
    }

    @Test("patching a queue changes its settings at once")
    func patchQueue() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 1)
            let r = try await server.request("PATCH", "/v1/queues/q", json: #"{"maxConcurrentOperationCount":3,"isSuspended":true}"#)
            #expect(r.status == 200)
            #expect(r.int("maxConcurrentOperationCount") == 3)
            #expect(r.bool("isSuspended") == true)
            let q = try await server.queue("q")
            #expect(q["maxConcurrentOperationCount"] as? Int == 3)
            #expect(q["effectiveMaxConcurrentOperationCount"] as? Int == 3)
            #expect(q["isSuspended"] as? Bool == true)
            // Takes effect at once: an operation added now stays ready, and runs after un-suspending.
            let id = try await server.addDelay("q", seconds: 0.01)
            try await Task.sleep(nanoseconds: 100_000_000)
            #expect(try await server.state(id) == "ready")
            _ = try await server.request("PATCH", "/v1/queues/q", json: #"{"isSuspended":false}"#).expecting(200)
            #expect(try await server.waitForState(id, "finished"))
        }
    }

    @Test("raising maxConcurrentOperationCount lets more operations run at once")
    func patchConcurrencyStartsMore() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 1)
            // a holds the only slot for 300 s: b executing within the 60 s limit can only be the
            // raised count (a limit of 1 s measured a loaded machine, not the start).
            let a = try await server.addDelay("q", seconds: 300)
            let b = try await server.addDelay("q", seconds: 300)
            #expect(try await server.waitForState(a, "executing"))
            #expect(try await server.state(b) == "ready")
            _ = try await server.request("PATCH", "/v1/queues/q", json: #"{"maxConcurrentOperationCount":2}"#).expecting(200)
            #expect(try await server.waitForState(b, "executing", timeout: 60))
            #expect(try await server.state(a) == "executing", "both at once")
            _ = try await server.request("POST", "/v1/queues/q/cancel-all").expecting(200)
        }
    }

    @Test("deleting an idle queue answers 204 and the queue is gone")
    func deleteIdleQueue() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let id = try await server.addDelay("q", seconds: 0)
            #expect(try await server.waitForState(id, "finished"))
            let r = try await server.request("DELETE", "/v1/queues/q")
            #expect(r.status == 204)
            #expect(r.body.isEmpty)
            #expect(try await server.request("GET", "/v1/queues/q").status == 404)
            #expect(try await server.queueNames() == [])
            // The name is free again.
            try await server.createQueue("q")
        }
    }

    @Test("deleting a busy queue with force cancels its operations and removes the queue")
    func deleteBusyQueueWithForce() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 1)
            let running = try await server.addDelay("q", seconds: 30)
            let waiting = try await server.addDelay("q", seconds: 30)
            try await server.createQueue("other", suspended: true)
            let dependent = try await server.addDelay("other", dependencies: [waiting])
            #expect(try await server.waitForState(running, "executing"))
            let r = try await server.request("DELETE", "/v1/queues/q?force=true")
            #expect(r.status == 204)
            #expect(try await server.request("GET", "/v1/queues/q").status == 404)
            #expect(try await server.queueNames() == ["other"])
            // The deleted queue's operations were cancelled (or are gone with it) ...
            for id in [running, waiting] {
                let op = try await server.request("GET", "/v1/operations/\(id)")
                if op.status == 200 {
                    #expect(op.string("state") == "finished", "\(op)")
                    #expect(op.string("outcome") == "cancelled", "\(op)")
                } else {
                    #expect(op.status == 404, "\(op)")
                }
            }
            // ... and a dependent in another queue is released: its dependency finished. (A limit to
            // give up at: left alone, its dependency would run for 60 s.)
            #expect(try await server.waitForState(dependent, "ready", timeout: 30))
        }
    }

    @Test("suspend and resume flip isSuspended and answer the queue")
    func suspendAndResume() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let s = try await server.request("POST", "/v1/queues/q/suspend")
            #expect(s.status == 200)
            #expect(s.string("name") == "q")
            #expect(s.bool("isSuspended") == true)
            #expect(try await server.queue("q")["isSuspended"] as? Bool == true)
            let r = try await server.request("POST", "/v1/queues/q/resume")
            #expect(r.status == 200)
            #expect(r.bool("isSuspended") == false)
            #expect(try await server.queue("q")["isSuspended"] as? Bool == false)
        }
    }

    @Test("cancel-all finishes every unfinished operation as cancelled")
    func cancelAll() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 1)
            let running = try await server.addDelay("q", seconds: 30)
            let ready = try await server.addDelay("q", seconds: 30)
            let pending = try await server.addDelay("q", seconds: 30, dependencies: [ready])
            #expect(try await server.waitForState(running, "executing"))
            let r = try await server.request("POST", "/v1/queues/q/cancel-all")
            #expect(r.status == 200)
            #expect(r.string("name") == "q")
            for id in [running, ready, pending] {
                // A limit to give up at; the outcome below tells cancelled from ran.
                #expect(try await server.waitForState(id, "finished", timeout: 20))
                let op = try await server.operation(id)
                #expect(op["outcome"] as? String == "cancelled")
                #expect(op["isCancelled"] as? Bool == true)
            }
            #expect(try await server.queue("q")["operationCount"] as? Int == 0)
        }
    }

    @Test("wait answers as soon as the queue has no unfinished operation")
    func waitAnswersWhenIdle() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            // The create itself waits for a commit; leave the long poll plenty of delay to cover.
            let id = try await server.addDelay("q", seconds: 1.5)
            let start = Date()
            // A 300 s timeout, so that answering when idle stands far apart from answering at the
            // timeout however slowly a loaded machine serves (6 s against 10 s measured its load).
            let r = try await server.patient(330).request("GET", "/v1/queues/q/wait?timeout=300")
            let took = elapsed(since: start)
            #expect(r.status == 200)
            #expect(r.bool("idle") == true, "\(r)")
            #expect(r.bool("timedOut") != true, "\(r)")
            #expect(r.int("operationCount") == 0)
            // idle == true with operationCount 0 already shows it did not answer early.
            #expect(took < 60, "answered after \(took) s")
            #expect(try await server.state(id) == "finished")
        }
    }

    @Test("wait on an idle queue answers at once")
    func waitOnIdleQueue() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let start = Date()
            // At once, not at the timeout: 300 s, so a loaded machine's slow request (3.3 s seen
            // against a bound of 3 s and a 5 s timeout) cannot be taken for it.
            let r = try await server.patient(330).request("GET", "/v1/queues/q/wait?timeout=300")
            #expect(r.status == 200)
            #expect(r.bool("idle") == true)
            #expect(r.bool("timedOut") != true, "\(r)")
            #expect(elapsed(since: start) < 60, "well before the 300 s timeout")
        }
    }

    @Test("wait answers idle false at the timeout when operations remain")
    func waitTimesOut() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            _ = try await server.addDelay("q")
            let start = Date()
            // Not before the timeout; after it, by a limit that only tells an answer from none (a
            // loaded machine's timers fire late, and the client would give up at 60 s).
            let r = try await server.patient(60).request("GET", "/v1/queues/q/wait?timeout=0.3")
            let took = elapsed(since: start)
            #expect(r.status == 200)
            #expect(r.bool("idle") == false, "\(r)")
            #expect(r.bool("timedOut") == true)
            #expect(r.int("operationCount") == 1)
            #expect(took >= 0.25 && took < 45, "answered after \(took) s")
        }
    }

    @Test("a barrier starts after every earlier operation finished, and later ones wait for it")
    func barrier() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 4, suspended: true)
            let a = try await server.addDelay("q", seconds: 0.2)
            let b = try await server.addDelay("q", seconds: 0.25)
            let r = try await server.request("POST", "/v1/queues/q/barrier", json: #"{"name":"checkpoint"}"#)
            #expect(r.status == 201, "\(r)")
            let barrier = try #require(r.string("id"))
            #expect(r.headers["Location"] == "/v1/operations/\(barrier)")
            #expect(r.string("name") == "checkpoint")
            #expect(r.bool("isExecuting") == false)
            let c = try await server.request("POST", "/v1/queues/q/operations", json: #"{"kind":"delay","spec":{"seconds":0.05}}"#)
            #expect(c.status == 201)
            // Not merely held by the suspended queue (that would be ready): c waits for the barrier,
            // and the barrier for a and b.
            #expect(r.string("state") == "pending", "\(r)")
            #expect(c.string("state") == "pending", "\(c)")
            let cID = try #require(c.string("id"))
            _ = try await server.request("POST", "/v1/queues/q/resume").expecting(200)
            _ = try await server.request("GET", "/v1/queues/q/wait?timeout=5").expecting(200)
            let ops = try await [server.operation(a), server.operation(b), server.operation(barrier), server.operation(cID)]
            for op in ops { #expect(op["outcome"] as? String == "succeeded", "\(op)") }
            let aEnd = try #require(parseTime(ops[0]["finishedAt"]))
            let bEnd = try #require(parseTime(ops[1]["finishedAt"]))
            let barrierStart = try #require(parseTime(ops[2]["startedAt"]))
            let barrierEnd = try #require(parseTime(ops[2]["finishedAt"]))
            let cStart = try #require(parseTime(ops[3]["startedAt"]))
            #expect(barrierStart >= max(aEnd, bEnd))
            #expect(cStart >= barrierEnd)
        }
    }
}
