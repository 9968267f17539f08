import Foundation
import QueueTesting
import Testing

/// Workers of `external` operations over real HTTP: claim, heartbeat, progress, finish,
/// lease expiry, and many claimers at once.
@Suite("External operations and their workers")
struct ExternalWorkerTests {
    func claim(_ server: LiveServer, _ queue: String, wait: Double = 0, worker: String = "w") async throws -> (id: String, token: String, attempt: Int)? {
        let r = try await server.patient(wait + 15).request("POST", "/v1/queues/\(queue)/claim?wait=\(wait)", json: "{\"worker\":\"\(worker)\"}")
        if r.status == 204 { return nil }
        #expect(r.status == 200, "\(r)")
        let op = r.object["operation"] as? [String: Any] ?? [:]
        let lease = r.object["lease"] as? [String: Any] ?? [:]
        guard let id = op["id"] as? String, let token = lease["token"] as? String else { return nil }
        return (id, token, (op["attempt"] as? NSNumber)?.intValue ?? 0)
    }

    @Test("many claimers at once never get the same operation, and every one is handed out")
    func concurrentClaimsAreExclusive() async throws {
        try await withLiveServer { server in
            _ = try await server.createQueue("jobs", maxConcurrent: 1000)
            var created: Set<String> = []
            for _ in 0..<60 {
                let r = try await server.request("POST", "/v1/queues/jobs/operations", json: #"{"kind":"external","spec":{"lease":30}}"#)
                created.insert(try #require(r.expecting(201).string("id")))
            }
            let claimed = try await withThrowingTaskGroup(of: [String].self) { group in
                for c in 0..<16 {
                    group.addTask {
                        var mine: [String] = []
                        while let got = try await claim(server, "jobs", worker: "w\(c)") { mine.append(got.id) }
                        return mine
                    }
                }
                var all: [String] = []
                for try await part in group { all += part }
                return all
            }
            #expect(claimed.count == created.count, "claimed \(claimed.count) of \(created.count)")
            #expect(Set(claimed).count == claimed.count, "an operation was handed to two claimers")
            #expect(Set(claimed) == created)
            let workers = try await server.request("GET", "/v1/workers").expecting(200)
            #expect(workers.objects("workers").count == 16)
        }
    }

    @Test("a worker heartbeats, reports progress and finishes; a foreign token gets 409")
    func workerLifecycle() async throws {
        try await withLiveServer { server in
            _ = try await server.createQueue("jobs")
            let id = try #require(try await server.request("POST", "/v1/queues/jobs/operations", json: #"{"kind":"external"}"#).expecting(201).string("id"))
            let got = try #require(try await claim(server, "jobs", wait: 1))
            #expect(got.id == id)
            let hb = try await server.request("POST", "/v1/operations/\(id)/heartbeat", json: "{\"leaseToken\":\"\(got.token)\"}").expecting(200)
            #expect(hb.bool("isCancelled") == false)
            #expect(hb.bool("isPaused") == false)
            let pr = try await server.request("POST", "/v1/operations/\(id)/progress", json: "{\"leaseToken\":\"\(got.token)\",\"completed\":3,\"total\":4}")
                .expecting(200)
            #expect((pr.object["progress"] as? [String: Any])?["fractionCompleted"] as? Double == 0.75)
            let foreign = try await server.request("POST", "/v1/operations/\(id)/finish", json: #"{"leaseToken":"not-mine","result":1}"#)
            #expect(foreign.status == 409)
            #expect(try await server.state(id) == "executing", "a refused finish changes nothing")
            let done = try await server.request("POST", "/v1/operations/\(id)/finish", json: "{\"leaseToken\":\"\(got.token)\",\"result\":{\"ok\":true}}")
                .expecting(200)
            #expect(done.string("outcome") == "succeeded")
            let again = try await server.request("POST", "/v1/operations/\(id)/finish", json: "{\"leaseToken\":\"\(got.token)\",\"result\":2}")
            #expect(again.status == 409)
            let events = try await server.request("GET", "/v1/operations/\(id)/events").expecting(200)
            #expect(events.objects("events").contains { $0["key"] as? String == "progress" })
        }
    }

    @Test("an expired lease is offered again with attempt + 1, and the old token is refused")
    func leaseExpiry() async throws {
        try await withLiveServer { server in
            _ = try await server.createQueue("jobs")
            let id = try #require(
                try await server.request(
                    "POST", "/v1/queues/jobs/operations",
                    json: #"{"kind":"external","spec":{"lease":1},"retry":{"maxAttempts":2,"backoff":0}}"#
                ).expecting(201).string("id"))
            // The claims' waits are limits to give up at (a claim answers as soon as there is
            // work): the 1 s lease's expiry fires on a timer a loaded machine runs late.
            let first = try #require(try await claim(server, "jobs", wait: 10))
            #expect(first.attempt == 1)
            let second = try #require(try await claim(server, "jobs", wait: 60), "the operation came back after its lease ran out")
            #expect(second.id == id)
            #expect(second.attempt == 2)
            let stale = try await server.request("POST", "/v1/operations/\(id)/finish", json: "{\"leaseToken\":\"\(first.token)\",\"result\":1}")
            #expect(stale.status == 409)
            // The last allowed attempt expiring too fails the operation.
            #expect(try await server.waitForState(id, "finished", timeout: 60))
            let op = try await server.operation(id)
            #expect(op["outcome"] as? String == "failed")
            #expect((op["error"] as? [String: Any])?["type"] as? String == "lease-expired")
        }
    }

    @Test("cancel finishes a claimed operation at once and its worker's heartbeat says so")
    func cancelTellsTheWorker() async throws {
        try await withLiveServer { server in
            _ = try await server.createQueue("jobs")
            let id = try #require(try await server.request("POST", "/v1/queues/jobs/operations", json: #"{"kind":"external"}"#).expecting(201).string("id"))
            let got = try #require(try await claim(server, "jobs", wait: 1))
            let c = try await server.request("POST", "/v1/operations/\(id)/cancel").expecting(200)
            #expect(c.string("state") == "finished")
            #expect(c.string("outcome") == "cancelled")
            let hb = try await server.request("POST", "/v1/operations/\(id)/heartbeat", json: "{\"leaseToken\":\"\(got.token)\"}").expecting(200)
            #expect(hb.bool("isCancelled") == true)
            let fin = try await server.request("POST", "/v1/operations/\(id)/finish", json: "{\"leaseToken\":\"\(got.token)\",\"result\":1}")
            #expect(fin.status == 409)
        }
    }
}

@Suite("Operation history")
struct OperationHistoryTests {
    @Test("an operation's own events stay complete after the server-wide ring has moved on")
    func historyOutlivesTheRing() async throws {
        try await withLiveServer({ $0.eventCapacity = 16 }) { server in
            _ = try await server.createQueue("q", suspended: true)
            let first = try #require(
                try await server.request("POST", "/v1/queues/q/operations", json: #"{"kind":"delay","spec":{"seconds":1}}"#).expecting(201).string("id"))
            for _ in 0..<40 {
                _ = try await server.request("POST", "/v1/queues/q/operations", json: #"{"kind":"delay","spec":{"seconds":1}}"#).expecting(201)
            }
            _ = try await server.request("POST", "/v1/operations/\(first)/cancel").expecting(200)
            let events = try await server.request("GET", "/v1/operations/\(first)/events").expecting(200).objects("events")
            let keys = events.map { $0["key"] as? String ?? "?" }
            #expect(events.first?["old"] is NSNull, "the creation event is kept: \(keys)")
            #expect(keys.contains("isFinished"), "the newest change is there too: \(keys)")
            let seqs = events.compactMap { ($0["seq"] as? NSNumber)?.intValue }
            #expect(seqs == seqs.sorted() && Set(seqs).count == seqs.count, "in order, once each: \(seqs)")
            // The server-wide feed has really moved on past the creation event.
            let feed = try await server.request("GET", "/v1/events?after=0")
            #expect(feed.status == 410)
        }
    }
}
