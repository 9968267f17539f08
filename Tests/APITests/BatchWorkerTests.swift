import Foundation
import QueueTesting
import Testing

/// Workers in batches over real HTTP: `claim?max=N`, `POST /v1/operations:finish`, and a claim
/// whose client left before the answer, which must not be handed out.
@Suite("Batch claims and finishes")
struct BatchWorkerTests {
    struct Claim {
        let id: String
        let token: String
        let attempt: Int
        let worker: String
    }

    static func claims(_ r: TestResponse) -> [Claim] {
        r.objects("claims").compactMap { c in
            let op = c["operation"] as? [String: Any] ?? [:]
            let lease = c["lease"] as? [String: Any] ?? [:]
            guard let id = op["id"] as? String, let token = lease["token"] as? String else { return nil }
            return Claim(id: id, token: token, attempt: (op["attempt"] as? NSNumber)?.intValue ?? 0, worker: lease["worker"] as? String ?? "")
        }
    }

    func addExternal(_ server: LiveServer, _ queue: String, count: Int, lease: Int = 30) async throws -> [String] {
        var ids: [String] = []
        for i in 0..<count {
            let r = try await server.request(
                "POST", "/v1/queues/\(queue)/operations",
                json: "{\"kind\":\"external\",\"name\":\"job-\(i)\",\"spec\":{\"lease\":\(lease)},\"retry\":{\"maxAttempts\":1}}")
            ids.append(try #require(try r.expecting(201).string("id")))
        }
        return ids
    }

    @Test("claim?max=N hands up to N operations at once, oldest first, each to this worker only")
    func batchClaim() async throws {
        try await withLiveServer { server in
            _ = try await server.createQueue("jobs", maxConcurrent: 100)
            let ids = try await addExternal(server, "jobs", count: 7)
            // Started operations become claimable as the engine starts them.
            #expect(try await eventually { (try await server.queue("jobs")["counts"] as? [String: Any])?["executing"] as? Int == 7 })
            let first = try await server.request("POST", "/v1/queues/jobs/claim?max=5", json: #"{"worker":"w1"}"#).expecting(200)
            let got = Self.claims(first)
            #expect(got.map(\.id) == Array(ids.prefix(5)), "oldest first: \(first.text)")
            #expect(Set(got.map(\.token)).count == 5, "one lease token per operation")
            #expect(got.allSatisfy { $0.worker == "w1" && $0.attempt == 1 })
            let rest = Self.claims(try await server.request("POST", "/v1/queues/jobs/claim?max=5&wait=1", json: #"{"worker":"w2"}"#).expecting(200))
            #expect(rest.map(\.id) == Array(ids.suffix(2)), "what is left, not more")
            // Without max the answer keeps its single form.
            let none = try await server.request("POST", "/v1/queues/jobs/claim?max=3", json: #"{"worker":"w3"}"#)
            #expect(none.status == 204)
            let workers = try await server.request("GET", "/v1/workers").expecting(200).objects("workers")
            #expect(workers.first { $0["worker"] as? String == "w1" }.map { ($0["leases"] as? [Any])?.count } == 5)
        }
    }

    @Test("max outside 1 to 100 or not a number is 422 naming max, and hands out nothing")
    func batchClaimLimits() async throws {
        try await withLiveServer { server in
            _ = try await server.createQueue("jobs")
            _ = try await addExternal(server, "jobs", count: 1)
            for bad in ["0", "101", "x", "-1", "1.5", ""] {
                expectProblem(try await server.request("POST", "/v1/queues/jobs/claim?max=\(bad)", json: "{}"), 422, mentioning: ["max"])
            }
            let one = try await server.request("POST", "/v1/queues/jobs/claim?max=100&wait=2", json: "{}").expecting(200)
            #expect(Self.claims(one).count == 1, "the operation was still claimable after the refusals")
            expectProblem(try await server.request("POST", "/v1/queues/nope/claim?max=2", json: "{}"), 404)
        }
    }

    @Test("a long poll with max wakes when operations come and takes several of a burst")
    func batchClaimLongPoll() async throws {
        try await withLiveServer { server in
            _ = try await server.createQueue("jobs", maxConcurrent: 100, suspended: true)
            let ids = try await addExternal(server, "jobs", count: 20)
            async let polled = server.request("POST", "/v1/queues/jobs/claim?max=50&wait=10", json: #"{"worker":"poller"}"#)
            try await Task.sleep(nanoseconds: 300_000_000)
            _ = try await server.request("POST", "/v1/queues/jobs/resume").expecting(200)
            let got = Self.claims(try await polled.expecting(200))
            #expect(!got.isEmpty)
            var all = got.map(\.id)
            while all.count < ids.count {
                let more = Self.claims(try await server.request("POST", "/v1/queues/jobs/claim?max=50&wait=2", json: "{}").expecting(200))
                if more.isEmpty { break }
                all += more.map(\.id)
            }
            #expect(Set(all) == Set(ids) && all.count == ids.count, "every operation exactly once: \(all.count) of \(ids.count)")
        }
    }

    @Test("operations:finish answers each element: 200 with its status, or its problem, and changes only those")
    func batchFinish() async throws {
        try await withLiveServer { server in
            _ = try await server.createQueue("jobs", maxConcurrent: 100)
            let ids = try await addExternal(server, "jobs", count: 4)
            #expect(try await eventually { (try await server.queue("jobs")["counts"] as? [String: Any])?["executing"] as? Int == 4 })
            let got = Self.claims(try await server.request("POST", "/v1/queues/jobs/claim?max=4", json: "{}").expecting(200))
            try #require(got.count == 4)
            let before = try await server.lastSeq()
            // A malformed element refuses the whole request, naming it; nothing changes.
            for (bad, words) in [
                (#"{"id":"\#(got[3].id)","result":4}"#, ["finishes[1].leaseToken"]),
                ("7", ["finishes[1]"]),
                (#"{"id":"\#(got[3].id)","leaseToken":"t","extra":1}"#, ["finishes[1]", "extra"]),
                (#"{"id":5,"leaseToken":"t"}"#, ["finishes[1].id"]),
            ] {
                let r = try await server.request(
                    "POST", "/v1/operations:finish", json: #"{"finishes":[{"id":"\#(got[0].id)","leaseToken":"\#(got[0].token)"},\#(bad)]}"#)
                expectProblem(r, 422, mentioning: words)
            }
            #expect(try await server.state(got[0].id) == "executing", "a refused request changed nothing")
            let body = """
                {"finishes":[
                  {"id":"\(got[0].id)","leaseToken":"\(got[0].token)","result":{"n":0}},
                  {"id":"\(got[1].id)","leaseToken":"\(got[1].token)","error":{"type":"boom","detail":"it broke"}},
                  {"id":"\(got[2].id)","leaseToken":"not-the-token","result":2},
                  {"id":"op-00000000ffffffff","leaseToken":"x","result":3},
                  {"id":"nonsense","leaseToken":"x"},
                  {"id":"\(got[0].id)","leaseToken":"\(got[0].token)","result":"again"}
                ]}
                """
            let r = try await server.request("POST", "/v1/operations:finish", json: body).expecting(200)
            let answers = r.objects("finishes")
            try #require(answers.count == 6, "\(r.text)")
            let statuses = answers.map { ($0["status"] as? NSNumber)?.intValue ?? -1 }
            #expect(statuses == [200, 200, 409, 404, 404, 409], "\(r.text)")
            #expect((answers[0]["operation"] as? [String: Any])?["outcome"] as? String == "succeeded")
            #expect((answers[1]["operation"] as? [String: Any])?["outcome"] as? String == "failed")
            #expect(answers[0]["id"] as? String == got[0].id)
            #expect(answers[4]["id"] as? String == "nonsense")
            let p2 = answers[2]["problem"] as? [String: Any] ?? [:]
            #expect((p2["detail"] as? String)?.hasPrefix("finishes[2]: ") == true, "\(p2)")
            #expect(p2["status"] as? Int == 409)
            // Only the two accepted finishes changed anything.
            #expect(try await server.state(got[0].id) == "finished")
            #expect(try await server.state(got[1].id) == "finished")
            #expect(try await server.state(got[2].id) == "executing")
            #expect(try await server.state(got[3].id) == "executing")
            let events = try await server.request("GET", "/v1/events?after=\(before)").expecting(200).objects("events")
            let touched = Set(events.compactMap { $0["operation"] as? String })
            #expect(touched == Set([got[0].id, got[1].id]), "events only for the two finished: \(touched)")
            #expect(Set(ids) == Set(got.map(\.id)))
        }
    }

    @Test("operations:finish refuses a malformed envelope as a whole, changing nothing")
    func batchFinishEnvelope() async throws {
        try await withLiveServer({ $0.limits.batch = 3 }) { server in
            expectProblem(try await server.request("POST", "/v1/operations:finish", json: "{}"), 422, mentioning: ["finishes"])
            expectProblem(try await server.request("POST", "/v1/operations:finish", json: #"{"finishes":[]}"#), 422, mentioning: ["finishes"])
            expectProblem(try await server.request("POST", "/v1/operations:finish", json: #"{"finishes":{}}"#), 422, mentioning: ["finishes"])
            expectProblem(
                try await server.request("POST", "/v1/operations:finish", json: #"{"finishes":[1,2,3,4]}"#), 422, mentioning: ["finishes", "--max-batch"])
            expectProblem(try await server.request("POST", "/v1/operations:finish", json: #"{"finishes":[],"x":1}"#), 422, mentioning: ["x"])
            expectProblem(try await server.request("POST", "/v1/operations:finish", json: "[1]"), 422)
            expectProblem(try await server.request("POST", "/v1/operations:finish", json: "{\"finishes\":"), 400)
        }
    }

    /// Sends a claim long poll on its own connection and closes it without reading the answer.
    func abandonClaim(port: Int, path: String) throws {
        let c = try RawConnection(port: port, timeout: 5)
        let body = #"{"worker":"gone"}"#
        c.send(RawConnection.head("POST", path, headers: ["Content-Type": "application/json"], contentLength: body.utf8.count) + body)
        // Give the server time to suspend the long poll before the client leaves.
        usleep(200_000)
        c.close()
    }

    @Test("a claim long poll whose client left is not handed anything: the next claimer gets it at once")
    func disconnectedClaimIsReoffered() async throws {
        try await withLiveServer { server in
            _ = try await server.createQueue("jobs", maxConcurrent: 100)
            try abandonClaim(port: server.port, path: "/v1/queues/jobs/claim?wait=30")
            try abandonClaim(port: server.port, path: "/v1/queues/jobs/claim?wait=30&max=10")
            let ids = try await addExternal(server, "jobs", count: 3)
            #expect(try await eventually { (try await server.queue("jobs")["counts"] as? [String: Any])?["executing"] as? Int == 3 })
            let got = Self.claims(try await server.request("POST", "/v1/queues/jobs/claim?max=10", json: #"{"worker":"here"}"#).expecting(200))
            #expect(got.map(\.id) == ids, "all three at once, none leased to the clients that left")
            #expect(got.allSatisfy { $0.attempt == 1 }, "no lease had to expire")
            let workers = try await server.request("GET", "/v1/workers").expecting(200).objects("workers")
            #expect(workers.map { $0["worker"] as? String } == ["here"], "\(workers)")
            // The abandoned long polls were ended, not left holding their connections until
            // their 30 s ran out: only this scrape is in flight.
            #expect(
                try await eventually(timeout: 5) {
                    let m = try await server.request("GET", "/metrics").text
                    return m.split(separator: "\n").contains { $0 == "opqd_http_requests_in_flight 1" }
                }, "requests still in flight")
        }
    }

    @Test("examples/worker.py claims in batches, runs jobs at once and finishes every one in batches")
    func pythonWorker() async throws {
        try await withLiveServer { server in
            _ = try await server.createQueue("jobs", maxConcurrent: 100)
            let ids = try await addExternal(server, "jobs", count: 40)
            let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
            let started = Date()
            // 40 jobs of 2 steps x 0.2 s: 16 s one after another, under 2 s 20 at a time.
            let (code, output) = try ChildProcess.capture(
                "/usr/bin/timeout",
                [
                    "60", "python3", root + "/examples/worker.py", "--url", "http://127.0.0.1:\(server.port)", "--queue", "jobs",
                    "--name", "py", "--concurrency", "20", "--batch", "10", "--steps", "2", "--step-seconds", "0.2", "--drain",
                ], stderr: .inherit)
            let wall = elapsed(since: started)
            let text = String(decoding: output, as: UTF8.self)
            #expect(code == 0, "\(text)")
            #expect(text.contains("py: finished 40"), "\(text.suffix(400))")
            #expect(wall < 8, "took \(wall) s: the jobs did not run at once")
            for id in ids {
                let op = try await server.operation(id)
                #expect(op["outcome"] as? String == "succeeded", "\(op)")
                #expect((op["result"] as? [String: Any])?["worker"] as? String == "python")
            }
        }
    }
}
