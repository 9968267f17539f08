import Foundation
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// API.md "Limits": every limit is a flag; hitting one answers a problem+json naming it and
/// changes nothing. Small values keep the tests fast.
@Suite("Limits at and past their bounds")
struct LimitTests {
    static func ids(_ server: Opqd, queue: String) throws -> [String] {
        var all: [String] = []
        var after: String? = nil
        for _ in 0..<10_000 {
            let r = try server.request("GET", "/v1/queues/\(queue)/operations?limit=1000" + (after.map { "&after=\($0)" } ?? "")).expecting(200)
            all += r.objects("operations").compactMap { $0["id"] as? String }
            guard let next = r.object["next"] as? String, !next.isEmpty else { break }
            after = next
        }
        return all
    }

    @Test("--max-queues 3: the 4th queue answers 429 too-many-queues with Retry-After and is not created")
    func queueLimit() async throws {
        let server = try Opqd(["--max-queues", "3"])
        try await blocking {
            for i in 0..<3 { _ = try server.request("POST", "/v1/queues", json: #"{"name":"q\#(i)"}"#).expecting(201) }
            let r = try server.request("POST", "/v1/queues", json: #"{"name":"q3"}"#)
            expectProblem(r, 429, slug: "too-many-queues", "the 4th queue")
            #expect(r.headers["retry-after"] != nil, "429 without Retry-After")
            #expect(try server.request("GET", "/v1/queues/q3").status == 404, "the refused queue exists")
            #expect(try server.request("GET", "/v1/queues").objects("queues").count == 3)
        }
    }

    @Test("--max-unfinished-per-queue 3 and --max-unfinished 5: the next operation answers 429 too-many-operations and is not created")
    func unfinishedLimits() async throws {
        let server = try Opqd(["--max-unfinished-per-queue", "3", "--max-unfinished", "5"])
        try await blocking {
            for q in ["a", "b", "c"] { _ = try server.request("POST", "/v1/queues", json: #"{"name":"\#(q)","isSuspended":true}"#).expecting(201) }
            let body = #"{"kind":"delay","spec":{"seconds":1}}"#
            for _ in 0..<3 { _ = try server.request("POST", "/v1/queues/a/operations", json: body).expecting(201) }
            let perQueue = try server.request("POST", "/v1/queues/a/operations", json: body)
            expectProblem(perQueue, 429, slug: "too-many-operations", "the 4th operation of queue a")
            #expect(perQueue.headers["retry-after"] != nil, "429 without Retry-After")
            for _ in 0..<2 { _ = try server.request("POST", "/v1/queues/b/operations", json: body).expecting(201) }
            let total = try server.request("POST", "/v1/queues/c/operations", json: body)
            expectProblem(total, 429, slug: "too-many-operations", "the 6th unfinished operation in all")
            #expect(try Self.ids(server, queue: "a").count == 3)
            #expect(try Self.ids(server, queue: "c").isEmpty)
            // Finishing one frees a slot.
            let victim = try Self.ids(server, queue: "b")[0]
            _ = try server.request("POST", "/v1/operations/\(victim)/cancel").expecting(200)
            #expect(try server.request("POST", "/v1/queues/c/operations", json: body).status == 201, "a slot freed by a cancel")
        }
    }

    @Test("1001 dependencies answer 422 too-many-dependencies; 1000 are fine")
    func dependencyLimit() async throws {
        let server = try Opqd(["--sync", "normal"])
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"d","isSuspended":true}"#).expecting(201)
            let client = KeepAliveClient(port: server.port)
            defer { client.close() }
            var ids: [String] = []
            for _ in 0..<1001 {
                let r = try client.request("POST", "/v1/queues/d/operations", body: Array(#"{"kind":"delay","spec":{"seconds":1}}"#.utf8)).expecting(201)
                ids.append(r.string("id") ?? "")
            }
            let list = { (n: Int) in ids.prefix(n).map { "\"\($0)\"" }.joined(separator: ",") }
            let over = try server.request("POST", "/v1/queues/d/operations", json: #"{"kind":"delay","spec":{"seconds":1},"dependencies":[\#(list(1001))]}"#)
            expectProblem(over, 422, slug: "too-many-dependencies", "1001 dependencies")
            #expect(try Self.ids(server, queue: "d").count == 1001, "the refused operation was created")
            // A PATCH to 1001 is refused the same way.
            let patch = try server.request(
                "PATCH", "/v1/operations/\(ids[0])", json: #"{"dependencies":[\#(ids.suffix(1000).map { "\"\($0)\"" }.joined(separator: ",")),"\#(ids[1])"]}"#)
            #expect(patch.status == 422, "PATCH with 1001 dependencies: \(patch.status) \(patch.text.prefix(200))")
            let at = try server.request("POST", "/v1/queues/d/operations", json: #"{"kind":"delay","spec":{"seconds":1},"dependencies":[\#(list(1000))]}"#)
            #expect(at.status == 201, "1000 dependencies: \(at.status) \(at.text.prefix(200))")
            server.expectAlive("the dependency limit")
        }
    }

    @Test("a barrier on a queue with more unfinished operations than --max-dependencies answers 429 too-many-dependencies")
    func barrierOverTheDependencyLimit() async throws {
        let server = try Opqd(["--max-dependencies", "5"])
        try await blocking {
            for q in ["five", "six"] { _ = try server.request("POST", "/v1/queues", json: #"{"name":"\#(q)","isSuspended":true}"#).expecting(201) }
            var six: [String] = []
            for _ in 0..<5 { _ = try server.request("POST", "/v1/queues/five/operations", json: #"{"kind":"delay","spec":{"seconds":1}}"#).expecting(201) }
            for _ in 0..<6 {
                six.append(
                    try server.request("POST", "/v1/queues/six/operations", json: #"{"kind":"delay","spec":{"seconds":1}}"#).expecting(201).string("id") ?? "")
            }
            #expect(try server.request("POST", "/v1/queues/five/barrier").status == 201, "a barrier over 5 unfinished operations")
            let r = try server.request("POST", "/v1/queues/six/barrier")
            expectProblem(r, 429, slug: "too-many-dependencies", "a barrier over 6 unfinished operations")
            #expect(try Self.ids(server, queue: "six").count == 6, "the refused barrier was created")
            let deps = six.map { "\"\($0)\"" }.joined(separator: ",")
            let over = try server.request("POST", "/v1/queues/five/operations", json: #"{"kind":"delay","spec":{"seconds":1},"dependencies":[\#(deps)]}"#)
            expectProblem(over, 422, slug: "too-many-dependencies", "6 dependencies with --max-dependencies 5")
        }
    }

    @Test("the 17th webhook observer of one operation answers 429 too-many-observers")
    func observersPerOperation() async throws {
        let server = try Opqd()
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"o","isSuspended":true}"#).expecting(201)
            let id = try server.request("POST", "/v1/queues/o/operations", json: #"{"kind":"delay","spec":{"seconds":1}}"#).expecting(201).string("id") ?? ""
            for i in 0..<16 {
                _ = try server.request("POST", "/v1/operations/\(id)/observers", json: #"{"url":"http://127.0.0.1:9/hook/\#(i)"}"#).expecting(
                    201, "observer \(i + 1)")
            }
            let r = try server.request("POST", "/v1/operations/\(id)/observers", json: #"{"url":"http://127.0.0.1:9/hook/17"}"#)
            expectProblem(r, 429, slug: "too-many-observers", "the 17th observer")
            let list = try server.request("GET", "/v1/operations/\(id)/observers")
            let count = (list.json as? [String: Any]).flatMap { $0["observers"] as? [Any] }?.count ?? (list.json as? [Any])?.count ?? -1
            #expect(count == 16, "observers listed: \(count)")
        }
    }

    @Test("--max-idempotency-keys 5: the 6th new key answers 429 too-many-idempotency-keys, creates nothing, and the 5 replays still work")
    func idempotencyKeyLimit() async throws {
        let server = try Opqd(["--max-idempotency-keys", "5"])
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"i","isSuspended":true}"#).expecting(201)
            let body = #"{"kind":"delay","spec":{"seconds":1}}"#
            var first: [String: String] = [:]
            for k in 0..<5 {
                let r = try server.request("POST", "/v1/queues/i/operations", json: body, headers: ["Idempotency-Key": "key-\(k)"]).expecting(201)
                first["key-\(k)"] = r.string("id")
            }
            let sixth = try server.request("POST", "/v1/queues/i/operations", json: body, headers: ["Idempotency-Key": "key-5"])
            expectProblem(sixth, 429, slug: "too-many-idempotency-keys", "the 6th key")
            #expect(try Self.ids(server, queue: "i").count == 5, "the refused create happened")
            for k in 0..<5 {
                let r = try server.request("POST", "/v1/queues/i/operations", json: body, headers: ["Idempotency-Key": "key-\(k)"])
                #expect(
                    r.status == 201 && r.string("id") == first["key-\(k)"],
                    "replay of key-\(k): \(r.status) \(r.string("id") ?? "-") vs \(first["key-\(k)"] ?? "-")")
            }
            #expect(try Self.ids(server, queue: "i").count == 5, "a replay created an operation")
            // Without a key, creates go on.
            #expect(try server.request("POST", "/v1/queues/i/operations", json: body).status == 201)
        }
    }

    @Test("--max-page-bytes 4096: no list answer is larger, and following next (or after) yields everything exactly once")
    func pageBytes() async throws {
        let server = try Opqd(["--max-page-bytes", "4096", "--sync", "normal"])
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"p","isSuspended":true}"#).expecting(201)
            var created: [String] = []
            let client = KeepAliveClient(port: server.port)
            defer { client.close() }
            let name = String(repeating: "n", count: 60)
            for i in 0..<60 {
                let r = try client.request(
                    "POST", "/v1/queues/p/operations", body: Array(#"{"kind":"delay","name":"\#(name)\#(i)","spec":{"seconds":1}}"#.utf8)
                ).expecting(201)
                created.append(r.string("id") ?? "")
            }
            var seen: [String] = []
            var after: String? = nil
            var pages = 0
            while pages < 200 {
                let r = try server.request("GET", "/v1/queues/p/operations?limit=1000" + (after.map { "&after=\($0)" } ?? "")).expecting(200)
                pages += 1
                #expect(r.body.count <= 4096, "an operations page of \(r.body.count) bytes")
                seen += r.objects("operations").compactMap { $0["id"] as? String }
                guard let next = r.object["next"] as? String, !next.isEmpty else { break }
                after = next
            }
            #expect(seen == created, "pages hold \(seen.count) ids (\(Set(seen).count) distinct) of \(created.count), in \(pages) pages")
            // The feed too: after=<last seq> carries on.
            var seqs: [Int] = []
            var cursor = 0
            for _ in 0..<500 {
                let r = try server.request("GET", "/v1/events?after=\(cursor)&limit=1000").expecting(200)
                #expect(r.body.count <= 4096, "a feed page of \(r.body.count) bytes")
                let s = r.objects("events").compactMap { ($0["seq"] as? NSNumber)?.intValue }
                if s.isEmpty { break }
                seqs += s
                cursor = s.last ?? cursor
            }
            #expect(seqs == Array(Set(seqs)).sorted() && seqs.count >= 60, "feed pages: \(seqs.count) seqs")
            // One operation's history.
            let history = try server.request("GET", "/v1/operations/\(created[0])/events?limit=1000")
            #expect(history.body.count <= 4096, "an operation history page of \(history.body.count) bytes")
        }
    }

    @Test("a worker result or error over --max-result-bytes answers 422 result-too-large and leaves the operation unfinished")
    func resultTooLarge() async throws {
        let server = try Opqd(["--max-result-bytes", "1024"])
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"w"}"#).expecting(201)
            let id = try server.request("POST", "/v1/queues/w/operations", json: #"{"kind":"external","spec":{"lease":30}}"#).expecting(201).string("id") ?? ""
            // A long poll answers as soon as the operation is claimable; its wait is a limit to give up at.
            let claim = try server.request("POST", "/v1/queues/w/claim?wait=10", timeout: 20).expecting(200, "claiming")
            let lease = (claim.object["lease"] as? [String: Any])?["token"] as? String ?? ""
            let big = String(repeating: "r", count: 2000)
            let result = try server.request("POST", "/v1/operations/\(id)/finish", json: #"{"leaseToken":"\#(lease)","result":{"blob":"\#(big)"}}"#)
            expectProblem(result, 422, slug: "result-too-large", "a 2 KB result")
            #expect(result.string("detail")?.contains("result") == true, "the problem should name the field result: \(result.text)")
            let error = try server.request("POST", "/v1/operations/\(id)/finish", json: #"{"leaseToken":"\#(lease)","error":{"type":"x","detail":"\#(big)"}}"#)
            expectProblem(error, 422, slug: "result-too-large", "a 2 KB error")
            let batch = try server.request(
                "POST", "/v1/operations:finish", json: #"{"finishes":[{"id":"\#(id)","leaseToken":"\#(lease)","result":{"blob":"\#(big)"}}]}"#)
            #expect(batch.text.contains(#""state":"finished""#) == false, "a batch finish with a 2 KB result finished it: \(batch.text.prefix(300))")
            let status = try server.request("GET", "/v1/operations/\(id)")
            #expect(status.string("state") == "executing", "after refused finishes: \(status.text.prefix(300))")
            let ok = try server.request("POST", "/v1/operations/\(id)/finish", json: #"{"leaseToken":"\#(lease)","result":{"ok":true}}"#)
            #expect(ok.status == 200, "a small result: \(ok)")
        }
    }
}
