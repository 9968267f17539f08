import Foundation
import QueueTesting
import Testing

@Suite("Operation endpoints")
struct OperationEndpointTests {
    @Test("creating an operation answers 201 with its status and a Location that serves it")
    func createOperation() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let r = try await server.request(
                "POST", "/v1/queues/q/operations",
                json: #"{"kind":"delay","name":"nap","queuePriority":"high","spec":{"seconds":0.05}}"#)
            #expect(r.status == 201, "\(r)")
            let id = try #require(r.string("id"))
            #expect(!id.isEmpty)
            #expect(id.allSatisfy { $0.isLetter || $0.isNumber || "-_.~".contains($0) }, "id \(id) is not URL-safe")
            #expect(r.headers["Location"] == "/v1/operations/\(id)")
            #expect(r.headers["ETag"] != nil)
            #expect(r.string("queue") == "q")
            #expect(r.string("kind") == "delay")
            #expect(r.string("name") == "nap")
            #expect(r.string("queuePriority") == "high")
            #expect(r.object["dependencies"] as? [String] == [])
            #expect(r.string("createdAt") != nil && parseTime(r.object["createdAt"]) != nil)
            #expect(["ready", "executing"].contains(r.string("state") ?? ""), "\(r)")
            let got = try await server.request("GET", try #require(r.headers["location"]))
            #expect(got.status == 200)
            #expect(got.string("id") == id)
            #expect(try await server.waitForState(id, "finished"))
            let done = try await server.operation(id)
            #expect(done["outcome"] as? String == "succeeded")
            #expect(done["isFinished"] as? Bool == true)
            #expect(done["isExecuting"] as? Bool == false)
            #expect(done["isCancelled"] as? Bool == false)
            #expect((done["result"] as? [String: Any])?["seconds"] as? Double == 0.05)
            let started = try #require(parseTime(done["startedAt"]))
            let finished = try #require(parseTime(done["finishedAt"]))
            #expect(finished.timeIntervalSince(started) >= 0.04)
        }
    }

    @Test("operations list oldest first, a page at a time by cursor")
    func listPaginated() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            var ids: [String] = []
            for _ in 0..<5 { ids.append(try await server.addDelay("q")) }
            let first = try await server.request("GET", "/v1/queues/q/operations?limit=2")
            #expect(first.status == 200)
            #expect(first.objects("operations").compactMap { $0["id"] as? String } == Array(ids[0..<2]))
            let next1 = try #require(first.object["next"] as? String, "\(first)")
            let second = try await server.request("GET", "/v1/queues/q/operations?limit=2&after=\(next1)")
            #expect(second.objects("operations").compactMap { $0["id"] as? String } == Array(ids[2..<4]))
            let next2 = try #require(second.object["next"] as? String, "\(second)")
            let third = try await server.request("GET", "/v1/queues/q/operations?limit=2&after=\(next2)")
            #expect(third.objects("operations").compactMap { $0["id"] as? String } == [ids[4]])
            #expect(third.object.keys.contains("next"))
            #expect(third.object["next"] is NSNull, "the last page's next should be null: \(third)")
            let all = try await server.request("GET", "/v1/queues/q/operations")
            #expect(all.objects("operations").compactMap { $0["id"] as? String } == ids)
            #expect(all.object["next"] is NSNull)
        }
    }

    @Test("the state filter lists only operations in that state")
    func listByState() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 1)
            let executing = try await server.addDelay("q", seconds: 30)
            let ready = try await server.addDelay("q", seconds: 30)
            let pending = try await server.addDelay("q", seconds: 30, dependencies: [executing])
            let cancelled = try await server.addDelay("q", seconds: 30)
            let paused = try await server.addDelay("q", seconds: 30)
            _ = try await server.request("POST", "/v1/operations/\(cancelled)/cancel").expecting(200)
            _ = try await server.request("POST", "/v1/operations/\(paused)/pause").expecting(200)
            #expect(try await server.waitForState(executing, "executing"))
            let expected = ["executing": [executing], "ready": [ready], "pending": [pending], "finished": [cancelled], "paused": [paused]]
            for (state, ids) in expected {
                let r = try await server.request("GET", "/v1/queues/q/operations?state=\(state)")
                #expect(r.status == 200)
                #expect(r.objects("operations").compactMap { $0["id"] as? String } == ids, "state=\(state): \(r.text)")
                #expect(r.objects("operations").allSatisfy { $0["state"] as? String == state })
            }
            _ = try await server.request("POST", "/v1/queues/q/cancel-all").expecting(200)
        }
    }

    @Test("patching an operation before it starts changes its priority")
    func patchPriority() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            let id = try await server.addDelay("q")
            let r = try await server.request("PATCH", "/v1/operations/\(id)", json: #"{"queuePriority":"veryHigh"}"#)
            #expect(r.status == 200, "\(r)")
            #expect(r.string("queuePriority") == "veryHigh")
            #expect(try await server.operation(id)["queuePriority"] as? String == "veryHigh")
        }
    }

    @Test("patching an operation's dependencies replaces them and holds it pending")
    func patchDependencies() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            try await server.createQueue("r")
            let first = try await server.addDelay("q")
            let second = try await server.addDelay("q")
            let later = try await server.addDelay("r", seconds: 0.01, dependencies: [first])
            let r = try await server.request("PATCH", "/v1/operations/\(later)", json: #"{"dependencies":["\#(second)"]}"#)
            #expect(r.status == 200, "\(r)")
            #expect(r.object["dependencies"] as? [String] == [second])
            #expect(r.string("state") == "pending")
            // Releasing the old dependency does not start it; releasing the new one does.
            _ = try await server.request("POST", "/v1/operations/\(first)/cancel").expecting(200)
            try await Task.sleep(nanoseconds: 100_000_000)
            #expect(try await server.state(later) == "pending")
            _ = try await server.request("POST", "/v1/operations/\(second)/cancel").expecting(200)
            #expect(try await server.waitForState(later, "finished"))
            // An empty list frees an operation at once.
            let x = try await server.addDelay("q")
            let y = try await server.addDelay("r", seconds: 0.01, dependencies: [x])
            _ = try await server.request("PATCH", "/v1/operations/\(y)", json: #"{"dependencies":[]}"#).expecting(200)
            #expect(try await server.waitForState(y, "finished"))
        }
    }

    @Test("patching an operation that has started is refused with 409")
    func patchStarted() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let id = try await server.addDelay("q", seconds: 30)
            #expect(try await server.waitForState(id, "executing"))
            let r = try await server.request("PATCH", "/v1/operations/\(id)", json: #"{"queuePriority":"low"}"#)
            expectProblem(r, 409)
            #expect(try await server.operation(id)["queuePriority"] as? String == "normal")
            _ = try await server.request("POST", "/v1/operations/\(id)/cancel").expecting(200)
        }
    }

    @Test("cancelling an operation that has not started finishes it cancelled without running it")
    func cancelReady() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            let id = try await server.addDelay("q")
            let r = try await server.request("POST", "/v1/operations/\(id)/cancel")
            #expect(r.status == 200, "\(r)")
            #expect(r.string("id") == id)
            #expect(r.string("state") == "finished")
            #expect(r.string("outcome") == "cancelled")
            #expect(r.bool("isCancelled") == true)
            #expect(r.bool("isFinished") == true)
            let op = try await server.operation(id)
            #expect(op["startedAt"] == nil, "a cancelled ready operation never started: \(op)")
        }
    }

    @Test("cancelling an executing operation stops it and finishes it cancelled")
    func cancelExecuting() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            // 300 s, so that stopping at once stands far apart from running out, however slowly a
            // loaded machine serves (4 s against a 30 s delay measured its load).
            let id = try await server.addDelay("q", seconds: 300)
            #expect(try await server.waitForState(id, "executing"))
            let start = Date()
            let r = try await server.request("POST", "/v1/operations/\(id)/cancel")
            #expect(r.status == 200)
            #expect(r.bool("isCancelled") == true)
            #expect(try await server.waitForState(id, "finished", timeout: 60))
            #expect(elapsed(since: start) < 60, "a 300 s delay stops at once when cancelled")
            #expect(try await server.operation(id)["outcome"] as? String == "cancelled")
        }
    }

    @Test("cancel with cascade also cancels every operation that depends on it, across queues")
    func cancelCascade() async throws {
        try await withLiveServer { server in
            try await server.createQueue("a", suspended: true)
            try await server.createQueue("b", suspended: true)
            let root = try await server.addDelay("a")
            let child = try await server.addDelay("b", dependencies: [root])
            let grandchild = try await server.addDelay("a", dependencies: [child])
            let bystander = try await server.addDelay("b")
            let r = try await server.request("POST", "/v1/operations/\(root)/cancel?cascade=true")
            #expect(r.status == 200, "\(r)")
            for id in [root, child, grandchild] {
                let op = try await server.operation(id)
                #expect(op["state"] as? String == "finished", "\(id): \(op)")
                #expect(op["outcome"] as? String == "cancelled", "\(id): \(op)")
            }
            #expect(try await server.state(bystander) == "ready")
        }
    }

    @Test("cancel without cascade releases dependents instead of cancelling them")
    func cancelWithoutCascade() async throws {
        try await withLiveServer { server in
            try await server.createQueue("a", suspended: true)
            try await server.createQueue("b", suspended: true)
            let root = try await server.addDelay("a")
            let child = try await server.addDelay("b", dependencies: [root])
            #expect(try await server.state(child) == "pending")
            _ = try await server.request("POST", "/v1/operations/\(root)/cancel").expecting(200)
            let op = try await server.operation(child)
            #expect(op["state"] as? String == "ready", "\(op)")
            #expect(op["isCancelled"] as? Bool == false)
        }
    }

    @Test("pausing a ready operation holds it; resuming makes it ready again")
    func pauseAndResumeReady() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            let id = try await server.addDelay("q")
            let p = try await server.request("POST", "/v1/operations/\(id)/pause")
            #expect(p.status == 200, "\(p)")
            #expect(p.string("state") == "paused")
            #expect(p.bool("isPaused") == true)
            #expect(p.bool("isReady") == false)
            let r = try await server.request("POST", "/v1/operations/\(id)/resume")
            #expect(r.status == 200, "\(r)")
            #expect(r.string("state") == "ready")
            #expect(r.bool("isPaused") == false)
        }
    }

    @Test("a paused executing delay keeps its time left and finishes after resume")
    func pauseExecutingDelay() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            // Wide margins: the suite runs in parallel on 2 cores, so timings stretch. It runs 6 of
            // its 12 s before the pause: at most 6 s are left, the whole 12 s again would mean the
            // time already run was lost, and the 10.5 s bound below leaves a loaded machine 4.5 s.
            let id = try await server.addDelay("q", seconds: 12.0)
            #expect(try await server.waitForState(id, "executing"))
            try await Task.sleep(nanoseconds: 6_000_000_000)
            let p = try await server.request("POST", "/v1/operations/\(id)/pause")
            #expect(p.status == 200, "\(p)")
            #expect(p.string("state") == "paused")
            #expect(p.bool("isPaused") == true)
            #expect(p.bool("isExecuting") == false)
            try await Task.sleep(nanoseconds: 300_000_000)
            #expect(try await server.state(id) == "paused", "a paused delay must not finish")
            let resumed = Date()
            _ = try await server.request("POST", "/v1/operations/\(id)/resume").expecting(200)
            #expect(try await server.waitForState(id, "finished", timeout: 20))
            // At most 6 s were left; the whole 12 s again would mean the time already run was lost.
            #expect(elapsed(since: resumed) < 10.5, "only the time left should run")
            #expect(try await server.operation(id)["outcome"] as? String == "succeeded")
        }
    }

    @Test("a paused executing operation frees its slot in the queue")
    func pausedFreesSlot() async throws {
        try await withLiveServer { server in
            try await server.createQueue("serial", maxConcurrent: 1)
            // The first holds the only slot for 300 s: the second executing within the 60 s
            // limit can only be the pause freeing it (2 s measured a loaded machine, not that).
            let first = try await server.addDelay("serial", seconds: 300)
            let second = try await server.addDelay("serial", seconds: 300)
            #expect(try await server.waitForState(first, "executing"))
            #expect(try await server.state(second) == "ready")
            _ = try await server.request("POST", "/v1/operations/\(first)/pause").expecting(200)
            #expect(try await server.waitForState(second, "executing", timeout: 60))
            // Resuming the first while the slot is taken makes it ready, not executing.
            let resumed = try await server.request("POST", "/v1/operations/\(first)/resume").expecting(200)
            #expect(resumed.string("state") == "ready", "\(resumed)")
            _ = try await server.request("POST", "/v1/queues/serial/cancel-all").expecting(200)
        }
    }

    @Test("a paused operation with an unfinished dependency resumes to pending; a paused one can be cancelled")
    func pauseResumePendingAndCancelPaused() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            let a = try await server.addDelay("q")
            let b = try await server.addDelay("q", dependencies: [a])
            let paused = try await server.request("POST", "/v1/operations/\(b)/pause").expecting(200)
            #expect(paused.string("state") == "paused")
            let resumed = try await server.request("POST", "/v1/operations/\(b)/resume").expecting(200)
            #expect(resumed.string("state") == "pending", "\(resumed)")
            _ = try await server.request("POST", "/v1/operations/\(a)/pause").expecting(200)
            let cancelled = try await server.request("POST", "/v1/operations/\(a)/cancel")
            #expect(cancelled.status == 200, "\(cancelled)")
            #expect(cancelled.string("state") == "finished")
            #expect(cancelled.string("outcome") == "cancelled")
            #expect(try await server.state(b) == "ready")
        }
    }

    @Test("a paused operation holds back its dependents")
    func pausedHoldsDependents() async throws {
        try await withLiveServer { server in
            try await server.createQueue("held", suspended: true)
            try await server.createQueue("q")
            let first = try await server.addDelay("held", seconds: 0.05)
            _ = try await server.request("POST", "/v1/operations/\(first)/pause").expecting(200)
            let second = try await server.addDelay("q", seconds: 0.01, dependencies: [first])
            _ = try await server.request("POST", "/v1/queues/held/resume").expecting(200)
            try await Task.sleep(nanoseconds: 200_000_000)
            #expect(try await server.state(first) == "paused", "a paused operation does not start when its queue runs")
            #expect(try await server.state(second) == "pending")
            _ = try await server.request("POST", "/v1/operations/\(first)/resume").expecting(200)
            #expect(try await server.waitForState(second, "finished"))
        }
    }

    @Test("an operation's events tell its history oldest first")
    func operationEvents() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let other = try await server.addDelay("q", seconds: 0)
            let id = try await server.addDelay("q", seconds: 0.05)
            #expect(try await server.waitForState(id, "finished"))
            #expect(try await server.waitForState(other, "finished"))
            let r = try await server.request("GET", "/v1/operations/\(id)/events")
            #expect(r.status == 200)
            let events = r.objects("events")
            #expect(!events.isEmpty)
            #expect(events.allSatisfy { $0["operation"] as? String == id }, "\(r.text)")
            #expect(events.allSatisfy { $0["queue"] as? String == "q" })
            let seqs = events.compactMap { $0["seq"] as? Int }
            #expect(seqs.count == events.count && seqs == seqs.sorted() && Set(seqs).count == seqs.count)
            func index(_ key: String) -> Int? {
                events.firstIndex { $0["key"] as? String == key && $0["new"] as? Bool == true }
            }
            let executing = try #require(index("isExecuting"), "\(r.text)")
            let finished = try #require(index("isFinished"), "\(r.text)")
            #expect(executing < finished)
            #expect(events.last?["state"] as? String == "finished")
            #expect(events.allSatisfy { parseTime($0["time"]) != nil })
        }
    }
}
