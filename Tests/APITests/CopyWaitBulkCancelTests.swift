import Foundation
import QueueTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Issue 12's first part through HTTP: `GET /v1/operations/{id}/wait`, `POST
/// /v1/operations/{id}/copy`, `POST /v1/queues/{name}/operations:cancel`, and the listing's
/// `kind` and `namePrefix` filters.
@Suite("Operation wait, copy, bulk cancel and filters")
struct CopyWaitBulkCancelTests {
    // MARK: - wait

    @Test("wait answers the status as soon as the operation finishes, well before the timeout")
    func waitAnswersOnFinish() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let id = try await server.addDelay("q", seconds: 0.5)
            let start = Date()
            // A 300 s timeout, so that answering on the finish stands far apart from answering at
            // the timeout however slowly a loaded machine runs the half-second delay.
            let r = try await server.patient(330).request("GET", "/v1/operations/\(id)/wait?timeout=300")
            let took = elapsed(since: start)
            #expect(r.status == 200, "\(r)")
            #expect(r.string("id") == id && r.bool("isFinished") == true && r.string("outcome") == "succeeded", "\(r)")
            #expect(r.headers["ETag"] != nil)
            // Not a lower bound: on a slow machine (or under TSan) the half second may be spent
            // before the wait arrives.
            #expect(took < 60, "answered on the finish, not at the 300 s timeout; took \(took) s")
        }
    }

    @Test("wait answers 200 with isFinished false at the timeout, and at once when the operation has finished or timeout is 0")
    func waitTimesOut() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let slow = try await server.addDelay("q", seconds: 30)
            var start = Date()
            // Not before the timeout; after it, by a limit that only tells an answer from none (a
            // loaded machine's timers fire late, and the client would give up at 60 s).
            let r = try await server.patient(60).request("GET", "/v1/operations/\(slow)/wait?timeout=0.5")
            var took = elapsed(since: start)
            #expect(r.status == 200 && r.bool("isFinished") == false && r.string("id") == slow, "\(r)")
            #expect(took >= 0.45 && took < 45, "took \(took) s")
            start = Date()
            let now = try await server.request("GET", "/v1/operations/\(slow)/wait?timeout=0")
            #expect(now.status == 200 && now.bool("isFinished") == false)
            _ = try await server.request("POST", "/v1/operations/\(slow)/cancel").expecting(200)
            #expect(try await server.waitForState(slow, "finished"))
            start = Date()
            // The default timeout is 30 s: waiting for it would take 30 s, answering at once any
            // load's worth less (2 s was within reach of a loaded machine's plain request).
            let done = try await server.patient(45).request("GET", "/v1/operations/\(slow)/wait")
            took = elapsed(since: start)
            #expect(done.status == 200 && done.bool("isFinished") == true && done.string("outcome") == "cancelled", "\(done)")
            #expect(took < 15, "a finished operation is answered at once, not at the default 30 s timeout; took \(took) s")
        }
    }

    @Test("wait refuses a bad timeout or an unknown parameter (422 naming it) and an unknown operation (404)")
    func waitRefusals() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let id = try await server.addDelay("q", seconds: 5)
            for bad in ["-1", "3601", "abc", "nan", "inf"] {
                expectProblem(try await server.request("GET", "/v1/operations/\(id)/wait?timeout=\(bad)"), 422, mentioning: ["timeout"])
            }
            expectProblem(try await server.request("GET", "/v1/operations/\(id)/wait?wait=1"), 422, mentioning: ["wait"])
            expectProblem(try await server.request("GET", "/v1/operations/op-00000000000000ff/wait?timeout=1"), 404)
            expectProblem(try await server.request("GET", "/v1/operations/nope/wait"), 404)
            expectProblem(try await server.request("POST", "/v1/operations/\(id)/wait"), 405)
        }
    }

    @Test("a wait on an operation whose queue is force-deleted answers at once: the operation is gone (404)")
    func waitQueueDeleted() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            let id = try await server.addDelay("q", seconds: 1)
            // A 300 s timeout: answering at the delete stands far apart from answering at it.
            async let waited = server.patient(330).request("GET", "/v1/operations/\(id)/wait?timeout=300")
            try await Task.sleep(nanoseconds: 300_000_000)
            let start = Date()
            _ = try await server.request("DELETE", "/v1/queues/q?force=true").expecting(204)
            let r = try await waited
            expectProblem(r, 404, mentioning: [id])
            #expect(elapsed(since: start) < 60, "answered \(elapsed(since: start)) s after the delete")
            #expect(server.application.engine.operationObserverCount == 0)
        }
    }

    @Test("a wait whose client went away is let go at its timeout: no observer is left behind")
    func waitClientGoneIsReleased() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let id = try await server.addDelay("q", seconds: 30)
            let engine = server.application.engine
            let base = engine.operationObserverCount
            let port = server.port
            // Each client goes away once the server has taken its wait on (the server's own count,
            // not a 50 ms sleep: a loaded machine read some requests only after their client had
            // gone, or let 1 s waits run out before the last was sent). 10 s waits outlast that.
            try await onThread {
                for i in 0..<5 {
                    let c = try RawConnection(port: port, timeout: 5)
                    c.send(RawConnection.head("GET", "/v1/operations/\(id)/wait?timeout=10", headers: [:], contentLength: nil))
                    _ = waitUntil(timeout: 10) { engine.operationObserverCount >= base + i + 1 }
                    c.close()
                }
            }
            #expect(engine.operationObserverCount == base + 5, "the five waits are registered")
            // A limit to give up at: their 10 s timeout, and a loaded machine's late timers.
            #expect(try await eventually(timeout: 60) { engine.operationObserverCount == base }, "released at their timeout")
            // The server still answers waits on that operation.
            let r = try await server.request("GET", "/v1/operations/\(id)/wait?timeout=0.1")
            #expect(r.status == 200 && r.bool("isFinished") == false)
        }
    }

    // MARK: - copy

    @Test("copy answers 201 with a Location and a new operation of the same kind, name, spec and options at attempt 1")
    func copyCreates() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            try await server.createQueue("other", suspended: true)
            let src = try await server.request(
                "POST", "/v1/queues/q/operations",
                json:
                    #"{"kind":"delay","name":"nap","spec":{"seconds":0.05},"timeout":9,"retry":{"maxAttempts":2,"backoff":0.5,"multiplier":3},"queuePriority":"low"}"#
            ).expecting(201)
            let id = try #require(src.string("id"))
            #expect(try await server.waitForState(id, "finished"))
            let r = try await server.request("POST", "/v1/operations/\(id)/copy", json: "{}")
            #expect(r.status == 201, "\(r)")
            let copy = try #require(r.string("id"))
            #expect(copy != id)
            #expect(r.headers["Location"] == "/v1/operations/\(copy)")
            #expect(r.headers["ETag"] != nil)
            #expect(r.string("kind") == "delay" && r.string("name") == "nap" && r.string("queue") == "q" && r.string("queuePriority") == "low")
            #expect((r.object["spec"] as? [String: Any])?["seconds"] as? Double == 0.05)
            #expect(r.object["timeout"] as? Double == 9, "\(r)")
            let retry = r.object["retry"] as? [String: Any]
            #expect(retry?["maxAttempts"] as? Int == 2 && retry?["backoff"] as? Double == 0.5 && retry?["multiplier"] as? Double == 3, "\(r)")
            #expect(r.bool("isFinished") == false && r.object["outcome"] == nil && r.object["result"] == nil)
            #expect(try await server.waitForState(copy, "finished"))
            let done = try await server.operation(copy)
            #expect(done["attempt"] as? Int == 1 && done["outcome"] as? String == "succeeded")

            // Another queue, priority and no body at all.
            let moved = try await server.request(
                "POST", "/v1/operations/\(id)/copy", json: #"{"queue":"other","queuePriority":"veryHigh","notBefore":null}"#
            ).expecting(201)
            #expect(moved.string("queue") == "other" && moved.string("queuePriority") == "veryHigh" && moved.string("state") == "ready")
            let bare = try await server.request("POST", "/v1/operations/\(id)/copy").expecting(201, "a copy without a body")
            #expect(bare.string("queue") == "q")
        }
    }

    @Test("copy runs a cancelled or failed operation again; the source keeps its outcome")
    func copyRunsAgain() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let cancelled = try await server.addDelay("q", seconds: 30)
            _ = try await server.request("POST", "/v1/operations/\(cancelled)/cancel").expecting(200)
            #expect(try await server.waitForState(cancelled, "finished"))
            let failing = try await server.request(
                "POST", "/v1/queues/q/operations",
                json: #"{"kind":"http","spec":{"method":"GET","url":"http://127.0.0.1:1/"},"name":"flaky"}"#
            ).expecting(201).string("id")
            let failed = try #require(failing)
            #expect(try await server.waitForState(failed, "finished", timeout: 10))
            #expect(try await server.operation(failed)["outcome"] as? String == "failed")

            let again = try await server.request("POST", "/v1/operations/\(cancelled)/copy", json: "{}").expecting(201).string("id")
            let copy = try #require(again)
            #expect(try await server.waitForState(copy, "executing"))
            let c = try await server.operation(copy)
            #expect(c["isCancelled"] as? Bool == false)
            #expect(try await server.operation(cancelled)["outcome"] as? String == "cancelled")
            let retried = try await server.request("POST", "/v1/operations/\(failed)/copy", json: "{}").expecting(201)
            #expect(retried.string("name") == "flaky" && retried.object["error"] == nil)
            _ = try await server.request("POST", "/v1/operations/\(copy)/cancel").expecting(200)
        }
    }

    @Test("copy with an Idempotency-Key creates one copy and replays its answer; another body with the key is 422")
    func copyIdempotency() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            let id = try await server.addDelay("q")
            let first = try await server.request("POST", "/v1/operations/\(id)/copy", json: "{}", headers: ["Idempotency-Key": "c-1"])
            #expect(first.status == 201)
            let again = try await server.request("POST", "/v1/operations/\(id)/copy", json: "{}", headers: ["Idempotency-Key": "c-1"])
            #expect(again.status == 201 && again.string("id") == first.string("id"))
            #expect(again.headers["Idempotent-Replayed"] == "true")
            #expect(try await server.operations(in: "q").count == 2)
            let before = try await server.fingerprint()
            let other = try await server.request(
                "POST", "/v1/operations/\(id)/copy", json: #"{"queuePriority":"high"}"#, headers: ["Idempotency-Key": "c-1"])
            expectProblem(other, 422, mentioning: ["Idempotency-Key"])
            #expect(try await server.fingerprint() == before)
        }
    }

    @Test("copy refuses like create, naming the field, and a refusal changes nothing")
    func copyRefusals() async throws {
        try await withLiveServer({ $0.limits.unfinishedPerQueue = 3 }) { server in
            try await server.createQueue("q", suspended: true)
            let id = try await server.addDelay("q")
            let barrier = try await server.request("POST", "/v1/queues/q/barrier").expecting(201).string("id") ?? ""
            let before = try await server.fingerprint()
            let cases: [(String, Int, [String])] = [
                (#"{"queue":"nope"}"#, 404, ["nope"]),
                (#"{"queue":7}"#, 422, ["queue"]),
                (#"{"queuePriority":"urgent"}"#, 422, ["queuePriority"]),
                (#"{"dependencies":"x"}"#, 422, ["dependencies"]),
                (#"{"dependencies":[3]}"#, 422, ["dependencies[0]"]),
                (#"{"dependencies":["op-00000000000000ff"]}"#, 404, ["op-00000000000000ff"]),
                (#"{"notBefore":"tomorrow"}"#, 422, ["notBefore"]),
                (#"{"kind":"delay"}"#, 422, ["kind"]),
                (#"{"queue":"q","queue":"q"}"#, 422, ["queue"]),
                (#"[1]"#, 422, ["body"]),
                (#"{"#, 400, []),
            ]
            for (body, status, words) in cases {
                expectProblem(try await server.request("POST", "/v1/operations/\(id)/copy", json: body), status, mentioning: words)
            }
            expectProblem(try await server.request("POST", "/v1/operations/op-00000000000000ff/copy", json: "{}"), 404)
            expectProblem(try await server.request("POST", "/v1/operations/\(barrier)/copy", json: "{}"), 409, mentioning: ["barrier"])
            expectProblem(try await server.request("POST", "/v1/operations/\(id)/copy?x=1", json: "{}"), 422, mentioning: ["x"])
            #expect(try await server.fingerprint() == before, "no refusal changed anything")
            // Two unfinished plus one copy is the queue's limit of three.
            _ = try await server.request("POST", "/v1/operations/\(id)/copy", json: "{}").expecting(201)
            let full = try await server.request("POST", "/v1/operations/\(id)/copy", json: "{}")
            expectProblem(full, 429, mentioning: ["3"])
            #expect(full.headers["Retry-After"] != nil)
        }
    }

    // MARK: - bulk cancel

    @Test("bulk cancel answers how many it cancelled, by state, kind and name prefix, and all unfinished with {}")
    func bulkCancelCounts() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 1)
            let running = try await server.addDelay("q", seconds: 30, name: "run")
            #expect(try await server.waitForState(running, "executing"))
            var img: [String] = []
            for i in 0..<3 { img.append(try await server.addDelay("q", seconds: 30, name: "img-\(i)")) }
            let doc = try await server.addDelay("q", seconds: 30, name: "doc")
            let paused = try await server.addDelay("q", seconds: 30, name: "img-p")
            _ = try await server.request("POST", "/v1/operations/\(paused)/pause").expecting(200)
            let ext = try await server.request("POST", "/v1/queues/q/operations", json: #"{"kind":"external","name":"ext"}"#).expecting(201)
            let extID = try #require(ext.string("id"))

            var r = try await server.request("POST", "/v1/queues/q/operations:cancel", json: #"{"state":"paused"}"#)
            #expect(r.status == 200 && r.int("cancelled") == 1, "\(r)")
            #expect(r.object.count == 1, "the answer is {\"cancelled\": n}: \(r)")
            r = try await server.request("POST", "/v1/queues/q/operations:cancel", json: #"{"kind":"external"}"#)
            #expect(r.int("cancelled") == 1)
            #expect(try await server.operation(extID)["outcome"] as? String == "cancelled")
            r = try await server.request("POST", "/v1/queues/q/operations:cancel", json: #"{"namePrefix":"img-","state":"ready"}"#)
            #expect(r.int("cancelled") == 3, "\(r)")
            for id in img { #expect(try await server.operation(id)["outcome"] as? String == "cancelled") }
            #expect(try await server.state(doc) == "ready")
            // Nothing matches: 0, and nothing changes.
            r = try await server.request("POST", "/v1/queues/q/operations:cancel", json: #"{"namePrefix":"zzz"}"#)
            #expect(r.status == 200 && r.int("cancelled") == 0)
            // Everything left: the executing one is asked to stop and finishes cancelled.
            r = try await server.request("POST", "/v1/queues/q/operations:cancel", json: "{}")
            #expect(r.int("cancelled") == 2, "\(r)")
            #expect(try await server.waitForState(running, "finished"))
            #expect(try await server.operation(running)["outcome"] as? String == "cancelled")
            #expect(try await server.operation(doc)["startedAt"] == nil, "a cancelled queued operation never runs")
            r = try await server.request("POST", "/v1/queues/q/operations:cancel")
            #expect(r.status == 200 && r.int("cancelled") == 0, "an empty body is {}: \(r)")
        }
    }

    @Test("bulk cancel refuses a finished or unknown state, an unknown kind, a bad prefix or field (422 naming it), an unknown queue (404)")
    func bulkCancelRefusals() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            _ = try await server.addDelay("q", name: "a")
            let before = try await server.fingerprint()
            let cases: [(String, Int, [String])] = [
                (#"{"state":"finished"}"#, 422, ["state", "pending"]),
                (#"{"state":"done"}"#, 422, ["state"]),
                (#"{"state":1}"#, 422, ["state"]),
                (#"{"kind":"teleport"}"#, 422, ["kind", "delay"]),
                (#"{"namePrefix":""}"#, 422, ["namePrefix"]),
                (#"{"namePrefix":5}"#, 422, ["namePrefix"]),
                ("{\"namePrefix\":\"\(String(repeating: "é", count: 65))\"}", 422, ["namePrefix", "64"]),
                (#"{"name":"a"}"#, 422, ["name"]),
                (#"[]"#, 422, ["body"]),
                (#"nope"#, 400, []),
            ]
            for (body, status, words) in cases {
                expectProblem(try await server.request("POST", "/v1/queues/q/operations:cancel", json: body), status, mentioning: words)
            }
            expectProblem(try await server.request("POST", "/v1/queues/nope/operations:cancel", json: "{}"), 404, mentioning: ["nope"])
            expectProblem(try await server.request("GET", "/v1/queues/q/operations:cancel"), 405)
            #expect(try await server.fingerprint() == before)
            // The create beside it still routes.
            _ = try await server.request("POST", "/v1/queues/q/operations", json: #"{"kind":"delay","spec":{"seconds":1}}"#).expecting(201)
        }
    }

    // MARK: - listing filters

    @Test("the listing filters by kind and name prefix (with state), and paging by cursor visits every match once")
    func listFilters() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            var reports: [String] = []
            for i in 0..<7 {
                reports.append(try await server.addDelay("q", name: "report-\(i)"))
                _ = try await server.addDelay("q", name: "other-\(i)")
            }
            let ext = try await server.request("POST", "/v1/queues/q/operations", json: #"{"kind":"external","name":"report-x"}"#).expecting(201)
            let extID = try #require(ext.string("id"))
            var seen: [String] = []
            var after: String? = nil
            var pages = 0
            repeat {
                let path = "/v1/queues/q/operations?namePrefix=report-&kind=delay&limit=3" + (after.map { "&after=\($0)" } ?? "")
                let page = try await server.request("GET", path).expecting(200)
                seen += page.objects("operations").compactMap { $0["id"] as? String }
                after = page.object["next"] as? String
                pages += 1
            } while after != nil && pages < 20
            #expect(seen == reports)
            #expect(pages == 3)
            let byKind = try await server.request("GET", "/v1/queues/q/operations?kind=external").expecting(200)
            #expect(byKind.objects("operations").compactMap { $0["id"] as? String } == [extID])
            #expect(byKind.object["next"] is NSNull)
            let readyReports = try await server.request("GET", "/v1/queues/q/operations?state=ready&namePrefix=report-x").expecting(200)
            #expect(readyReports.objects("operations").compactMap { $0["id"] as? String } == [extID])
            let encoded = try await server.request("GET", "/v1/queues/q/operations?namePrefix=report%2D6").expecting(200)
            #expect(encoded.objects("operations").compactMap { $0["id"] as? String } == [reports[6]])
            expectProblem(try await server.request("GET", "/v1/queues/q/operations?kind=teleport"), 422, mentioning: ["kind"])
            expectProblem(try await server.request("GET", "/v1/queues/q/operations?namePrefix="), 422, mentioning: ["namePrefix"])
        }
    }

    @Test("a filter that matches rarely ends a page after a bounded scan with a next that carries on")
    func listRareFilterIsBounded() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", suspended: true)
            // Over 10,000 operations (the per-request scan budget), created in-process for speed.
            let engine = server.application.engine
            for i in 0..<12_000 {
                _ = try engine.addOperationID(
                    to: "q", .init(kind: "delay", name: i == 11_500 ? "needle" : "hay", spec: .object([("seconds", .number(1))])))
            }
            let first = try await server.request("GET", "/v1/queues/q/operations?namePrefix=needle").expecting(200)
            #expect(first.objects("operations").isEmpty)
            let next = try #require(first.object["next"] as? String, "the budget ran out: a next to carry on from")
            let second = try await server.request("GET", "/v1/queues/q/operations?namePrefix=needle&after=\(next)").expecting(200)
            #expect(second.objects("operations").compactMap { $0["name"] as? String } == ["needle"])
            #expect(second.object["next"] is NSNull)
        }
    }
}

/// kill -9 of the real binary right after a copy and a bulk cancel were acknowledged: both are
/// there after the restart.
@Suite("Copy and bulk cancel survive kill -9")
struct CopyBulkCancelDurabilityTests {
    @Test("an acknowledged copy and an acknowledged bulk cancel survive kill -9")
    func survivesKillNine() async throws {
        let binary = try OpqdBinary.locate()
        let data = try makeTemporaryDirectory(prefix: "opqd-copy-data")
        let logs = try makeTemporaryDirectory(prefix: "opqd-copy-logs")
        defer {
            try? FileManager.default.removeItem(atPath: data)
            try? FileManager.default.removeItem(atPath: logs)
        }
        try await onThread {
            let server = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-0.log")
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"q","isSuspended":true}"#).expecting(201)
            var ids: [String] = []
            for i in 0..<50 {
                let r = try server.request("POST", "/v1/queues/q/operations", json: #"{"kind":"delay","name":"n-\#(i % 2)","spec":{"seconds":1}}"#)
                ids.append(try #require(try r.expecting(201).string("id")))
            }
            let copy = try #require(try server.request("POST", "/v1/operations/\(ids[0])/copy", json: #"{"queuePriority":"high"}"#).expecting(201).string("id"))
            let bulk = try server.request("POST", "/v1/queues/q/operations:cancel", json: #"{"namePrefix":"n-1"}"#).expecting(200)
            #expect(bulk.int("cancelled") == 25)
            // No pause: the answers above were sent only after their commits.
            server.signal(SIGKILL)
            #expect(server.waitForExit(timeout: 10) == .signaled(SIGKILL))

            let again = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-1.log")
            defer {
                again.signal(SIGTERM)
                _ = again.waitForExit(timeout: 10)
            }
            let c = try again.request("GET", "/v1/operations/\(copy)").expecting(200, "the copy after the restart")
            #expect(c.string("queuePriority") == "high" && c.string("name") == "n-0")
            for (i, id) in ids.enumerated() {
                let s = try again.request("GET", "/v1/operations/\(id)").expecting(200)
                if i % 2 == 1 {
                    #expect(s.string("outcome") == "cancelled", "\(id) was cancelled in bulk before the kill")
                } else {
                    #expect(s.bool("isFinished") == false, "\(id) was not in the bulk cancel")
                }
            }
        }
    }
}
