import Foundation
import QueueTesting
import Testing

/// A queue's history through HTTP (API.md "Dashboard", **History**): the bucket sums equal
/// what was done, also after kill -9 once the flush has passed; bad `step` and `since` are
/// refused; ETags answer 304.
@Suite("History over HTTP")
struct HistoryEndpointTests {
    static func sums(_ r: TestResponse) -> [String: Int] {
        var out: [String: Int] = [:]
        for b in r.objects("buckets") {
            for k in ["created", "started", "succeeded", "failed", "cancelled"] { out[k, default: 0] += (b[k] as? Int) ?? 0 }
        }
        return out
    }

    @Test("the buckets add up to what was done, at every step and over all queues; ETags; refusals")
    func sumsAndRefusals() async throws {
        try await withLiveServer { server in
            try await server.createQueue("h", maxConcurrent: 4)
            var ids: [String] = []
            for _ in 0..<10 {
                let r = try await server.request("POST", "/v1/queues/h/operations", json: #"{"kind":"delay","spec":{"seconds":0.05}}"#)
                ids.append(try #require(r.string("id")))
            }
            for _ in 0..<2 {
                let r = try await server.request(
                    "POST", "/v1/queues/h/operations", json: #"{"kind":"http","spec":{"method":"GET","url":"http://127.0.0.1:9/","timeout":2}}"#)
                ids.append(try #require(r.string("id")))
            }
            let late = try await server.request(
                "POST", "/v1/queues/h/operations", json: #"{"kind":"delay","spec":{"seconds":1},"notBefore":"2099-01-01T00:00:00Z"}"#)
            _ = try await server.request("POST", "/v1/operations/\(late.string("id") ?? "")/cancel")
            for id in ids { #expect(try await server.waitForState(id, "finished", timeout: 10)) }
            let want = ["created": 13, "started": 12, "succeeded": 10, "failed": 2, "cancelled": 1]
            for step in [60, 300, 3600] {
                let r = try await server.request("GET", "/v1/queues/h/history?step=\(step)")
                #expect(r.status == 200 && r.int("step") == step, "\(r.text)")
                #expect(Self.sums(r) == want, "step \(step): \(r.text)")
                let b = try #require(r.objects("buckets").first)
                #expect((b["waitP95"] as? Double).map { $0 >= 0 } == true && (b["runP95"] as? Double).map { $0 >= 0.02 } == true, "\(b)")
                #expect(parseTime(b["start"]).map { Int($0.timeIntervalSince1970) % step == 0 } == true)
            }
            #expect(Self.sums(try await server.request("GET", "/v1/history")) == want)
            // Nothing before `since`.
            let future = try await server.request("GET", "/v1/queues/h/history?since=2099-01-01T00:00:00Z")
            #expect(future.status == 200 && future.objects("buckets").isEmpty)
            // ETags: the same answer is 304; a change is a new answer.
            let first = try await server.request("GET", "/v1/queues/h/history")
            let etag = try #require(first.headers["etag"])
            #expect(try await server.request("GET", "/v1/queues/h/history", headers: ["If-None-Match": etag]).status == 304)
            _ = try await server.request("POST", "/v1/queues/h/operations", json: #"{"kind":"delay","spec":{"seconds":0.01}}"#)
            let again = try await server.request("GET", "/v1/queues/h/history", headers: ["If-None-Match": etag])
            #expect(again.status == 200 && Self.sums(again)["created"] == 14)
            // Refusals name the parameter.
            for (query, field) in [
                ("step=7", "step"), ("step=60.0", "step"), ("step=", "step"), ("since=yesterday", "since"), ("since=2026-13-01T00:00:00Z", "since"),
                ("limit=5", "limit"), ("step=60&step=3600", "step"),
            ] {
                expectProblem(try await server.request("GET", "/v1/queues/h/history?\(query)"), 422, mentioning: [field])
                expectProblem(try await server.request("GET", "/v1/history?\(query)"), 422, mentioning: [field])
            }
            expectProblem(try await server.request("GET", "/v1/queues/nope/history"), 404, mentioning: ["nope"])
        }
    }

    @Test("the history survives kill -9 once its flush has passed", arguments: StoreChoice.allCases)
    func killNine(store choice: StoreChoice) async throws {
        let binary = try OpqdBinary.locate()
        let store = try choice.prepare()
        let data = try makeTemporaryDirectory(prefix: "opqd-history")
        defer {
            store.remove()
            try? FileManager.default.removeItem(atPath: data)
        }
        var server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-0.log", extraArguments: store.arguments)
        try await onThread { [server] in try StoreChoice.awaitOwner(server) }
        #expect(try server.request("POST", "/v1/queues", json: #"{"name":"h","maxConcurrentOperationCount":10}"#).status == 201)
        for _ in 0..<20 { _ = try server.request("POST", "/v1/queues/h/operations", json: #"{"kind":"delay","spec":{"seconds":0.01}}"#) }
        // Every operation finished, and the flush (every 2 s) has written the buckets.
        try await Task.sleep(nanoseconds: 3_000_000_000)
        let before = try server.request("GET", "/v1/queues/h/history")
        #expect(Self.sums(before) == ["created": 20, "started": 20, "succeeded": 20, "failed": 0, "cancelled": 0], "\(before.text)")
        server.killNow()
        server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-1.log", extraArguments: store.arguments)
        defer { server.killNow() }
        try await onThread { [server] in try StoreChoice.awaitOwner(server) }
        let after = try server.request("GET", "/v1/queues/h/history")
        #expect(after.objects("buckets").count == before.objects("buckets").count && Self.sums(after) == Self.sums(before), "\(after.text)")
        let beforeWait = before.objects("buckets").map { $0["waitP95"] as? Double }
        #expect(after.objects("buckets").map { $0["waitP95"] as? Double } == beforeWait)
        #expect(Self.sums(try server.request("GET", "/v1/history")) == Self.sums(before))
    }
}
