import Foundation
import QueueTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `POST /v1/operations:batch` through HTTP: `addOperations(_:waitUntilFinished:)` across
/// queues, all or nothing.
@Suite("Batch create: POST /v1/operations:batch")
struct BatchEndpointTests {
    static func delay(_ queue: String, seconds: Double = 5, ref: String? = nil, deps: [String] = [], extra: String = "") -> String {
        var s = #"{"queue":"\#(queue)","kind":"delay","spec":{"seconds":\#(seconds)}"#
        if let ref { s += #","ref":"\#(ref)""# }
        if !deps.isEmpty { s += #","dependencies":[\#(deps.map { "\"\($0)\"" }.joined(separator: ","))]"# }
        return s + extra + "}"
    }
    static func batch(_ elements: [String]) -> String { #"{"operations":[\#(elements.joined(separator: ","))]}"# }

    @Test("201 with the statuses in the request's order; ref: dependencies across queues make a graph")
    func createsInOrder() async throws {
        try await withLiveServer { server in
            try await server.createQueue("a", suspended: true)
            try await server.createQueue("b", suspended: true)
            let existing = try await server.addDelay("b", seconds: 5)
            let body = Self.batch([
                Self.delay("a", ref: "root", extra: #","name":"root""#),
                Self.delay("b", ref: "left", deps: ["ref:root"], extra: #","name":"left""#),
                Self.delay("a", ref: "right", deps: ["ref:root", existing], extra: #","name":"right""#),
                Self.delay("b", deps: ["ref:left", "ref:right"], extra: #","name":"join","queuePriority":"high""#),
            ])
            let r = try await server.request("POST", "/v1/operations:batch", json: body).expecting(201).validJSON()
            #expect(r.mediaType == "application/json")
            let ops = r.objects("operations")
            #expect(ops.map { $0["name"] as? String } == ["root", "left", "right", "join"])
            #expect(ops.map { $0["queue"] as? String } == ["a", "b", "a", "b"])
            let ids = ops.compactMap { $0["id"] as? String }
            #expect(ids.count == 4)
            #expect(ops[1]["dependencies"] as? [String] == [ids[0]])
            #expect(ops[2]["dependencies"] as? [String] == [ids[0], existing])
            #expect(ops[3]["dependencies"] as? [String] == [ids[1], ids[2]])
            #expect(ops[3]["queuePriority"] as? String == "high")
            #expect(ops.map { $0["state"] as? String } == ["ready", "pending", "pending", "pending"])
            // Each is an operation like any other.
            for id in ids { _ = try await server.operation(id) }
            #expect(try await server.queue("a")["operationCount"] as? Int == 2)
            #expect(try await server.queue("b")["operationCount"] as? Int == 3)
        }
    }

    @Test("a batch runs its graph: dependents start after what they name, in another queue too")
    func runsTheGraph() async throws {
        try await withLiveServer { server in
            try await server.createQueue("a")
            try await server.createQueue("b")
            let body = Self.batch([
                Self.delay("a", seconds: 0.2, ref: "first"), Self.delay("b", seconds: 0.01, ref: "second", deps: ["ref:first"]),
            ])
            let ops = try await server.request("POST", "/v1/operations:batch", json: body).expecting(201).objects("operations")
            let ids = ops.compactMap { $0["id"] as? String }
            #expect(try await server.waitForState(ids[1], "finished"))
            let first = try await server.operation(ids[0])
            let second = try await server.operation(ids[1])
            let finished = try #require(parseTime(first["finishedAt"]))
            let started = try #require(parseTime(second["startedAt"]))
            #expect(started >= finished)
        }
    }

    @Test("one bad element, anywhere, is refused naming it, and nothing is created and no event is emitted")
    func refusalsNameTheElementAndChangeNothing() async throws {
        try await withLiveServer({ $0.limits.batch = 20 }) { server in
            try await server.createQueue("a", suspended: true)
            try await server.createQueue("b", suspended: true)
            _ = try await server.addDelay("a")
            let good = [Self.delay("a", ref: "x"), Self.delay("b", deps: ["ref:x"]), Self.delay("a")]
            let cases: [(String, [String], Int, [String])] = [
                ("bad spec", good + [Self.delay("b", seconds: -1)], 422, ["operations[3].spec.seconds"]),
                ("unknown queue", [Self.delay("nope")] + good, 404, ["operations[0].queue", "nope"]),
                ("unknown kind", [good[0], #"{"queue":"a","kind":"teleport"}"#, good[1]], 422, ["operations[1].kind"]),
                ("unknown field", [good[0], good[1], Self.delay("a", extra: #","colour":"red""#)], 422, ["operations[2].colour"]),
                ("missing queue", [good[0], #"{"kind":"delay","spec":{"seconds":1}}"#], 422, ["operations[1].queue"]),
                ("queue not a string", [#"{"queue":5,"kind":"delay","spec":{"seconds":1}}"#], 422, ["operations[0].queue"]),
                ("duplicate ref", good + [Self.delay("a", ref: "x")], 422, ["operations[3].ref", "x"]),
                (
                    "ref to a later element", [Self.delay("a", deps: ["ref:later"]), Self.delay("a", ref: "later")], 422,
                    ["operations[0].dependencies[0]", "ref:later"]
                ),
                ("ref to itself", [Self.delay("a", ref: "me", deps: ["ref:me"])], 422, ["operations[0].dependencies[0]"]),
                ("unknown dependency", good + [Self.delay("a", deps: ["op-00000000000000ff"])], 404, ["operations[3].dependencies"]),
                ("malformed dependency id", good + [Self.delay("a", deps: ["zzz"])], 404, ["operations[3].dependencies[0]"]),
                ("element not an object", good + ["7"], 422, ["operations[3]"]),
                ("bad priority", good + [Self.delay("a", extra: #","queuePriority":"urgent""#)], 422, ["operations[3].queuePriority"]),
                ("bad retry", [Self.delay("a", extra: #","retry":{"maxAttempts":0}"#)], 422, ["operations[0].retry.maxAttempts"]),
                ("empty list", [], 422, ["operations"]),
                ("command not allowed here", good + [#"{"queue":"a","kind":"command","spec":{"argv":["/bin/true"]}}"#], 403, ["operations[3].spec"]),
            ]
            let before = try await server.fingerprint()
            for (what, elements, status, words) in cases {
                let r = try await server.request("POST", "/v1/operations:batch", json: Self.batch(elements))
                expectProblem(r, status, mentioning: words)
                #expect(try await server.fingerprint() == before, "\(what) changed something")
            }
            for body in [#"{}"#, #"{"operations":{}}"#, #"{"operations":[],"extra":1}"#, "[1]", "not json"] {
                let r = try await server.request("POST", "/v1/operations:batch", json: body)
                #expect(r.status == 400 || r.status == 422, "\(body): \(r)")
            }
            #expect(try await server.fingerprint() == before)
        }
    }

    @Test("more than --max-batch elements is refused naming the limit, before any element is read; exactly the max is fine")
    func maxBatch() async throws {
        try await withLiveServer({ $0.limits.batch = 10 }) { server in
            try await server.createQueue("a", suspended: true)
            let before = try await server.fingerprint()
            let over = try await server.request("POST", "/v1/operations:batch", json: Self.batch(Array(repeating: Self.delay("a"), count: 11)))
            expectProblem(over, 422, mentioning: ["--max-batch", "10"])
            // Nearly 1 MiB (the default --max-body) of tiny elements that are not even objects:
            // refused by the count, before any element is looked at.
            let tiny = try await server.request(
                "POST", "/v1/operations:batch", json: #"{"operations":[\#(Array(repeating: "0", count: 520_000).joined(separator: ","))]}"#)
            expectProblem(tiny, 422, mentioning: ["--max-batch"])
            #expect(try await server.fingerprint() == before)
            let ok = try await server.request("POST", "/v1/operations:batch", json: Self.batch(Array(repeating: Self.delay("a"), count: 10))).expecting(201)
            #expect(ok.objects("operations").count == 10)
        }
    }

    @Test("the queue limits count the whole batch: past them, 429 naming the element and nothing created")
    func queueLimit() async throws {
        try await withLiveServer({ $0.limits.unfinishedPerQueue = 3 }) { server in
            try await server.createQueue("a", suspended: true)
            try await server.createQueue("b", suspended: true)
            _ = try await server.addDelay("a")
            let before = try await server.fingerprint()
            let r = try await server.request(
                "POST", "/v1/operations:batch", json: Self.batch([Self.delay("b"), Self.delay("a"), Self.delay("a"), Self.delay("a")]))
            expectProblem(r, 429, mentioning: ["operations[3]", "--max-unfinished-per-queue"])
            #expect(r.headers["Retry-After"] != nil)
            #expect(try await server.fingerprint() == before)
        }
    }

    @Test("an Idempotency-Key makes a retried batch answer the first answer and create nothing more")
    func idempotencyKey() async throws {
        try await withLiveServer { server in
            try await server.createQueue("a", suspended: true)
            let body = Self.batch([Self.delay("a", ref: "x"), Self.delay("a", deps: ["ref:x"])])
            let first = try await server.request("POST", "/v1/operations:batch", json: body, headers: ["Idempotency-Key": "k-1"]).expecting(201)
            let again = try await server.request("POST", "/v1/operations:batch", json: body, headers: ["Idempotency-Key": "k-1"]).expecting(201)
            #expect(first.objects("operations").compactMap { $0["id"] as? String } == again.objects("operations").compactMap { $0["id"] as? String })
            #expect(try await server.queue("a")["operationCount"] as? Int == 2)
            let other = try await server.request("POST", "/v1/operations:batch", json: body, headers: ["Idempotency-Key": "k-2"]).expecting(201)
            #expect(
                Set(other.objects("operations").compactMap { $0["id"] as? String }).isDisjoint(
                    with: first.objects("operations").compactMap { $0["id"] as? String }))
            #expect(try await server.queue("a")["operationCount"] as? Int == 4)
        }
    }

    @Test("the events of a batch are one creation event per element, in the batch's order")
    func events() async throws {
        try await withLiveServer { server in
            try await server.createQueue("a", suspended: true)
            try await server.createQueue("b", suspended: true)
            let seq = try await server.lastSeq()
            let ops = try await server.request("POST", "/v1/operations:batch", json: Self.batch([Self.delay("a"), Self.delay("b"), Self.delay("a")]))
                .expecting(201).objects("operations")
            let events = try await server.request("GET", "/v1/events?after=\(seq)").expecting(200).objects("events")
            #expect(events.compactMap { $0["operation"] as? String } == ops.compactMap { $0["id"] as? String })
            #expect(events.allSatisfy { $0["key"] as? String == "isReady" })
        }
    }
}

@Suite("Batch create survives kill -9")
struct BatchDurabilityTests {
    @Test("an acknowledged batch survives kill -9 whole, dependencies included", arguments: StoreChoice.allCases)
    func survivesKillNine(store choice: StoreChoice) async throws {
        let binary = try OpqdBinary.locate()
        let store = try choice.prepare()
        let data = try makeTemporaryDirectory(prefix: "opqd-batch-data")
        let logs = try makeTemporaryDirectory(prefix: "opqd-batch-logs")
        defer {
            store.remove()
            try? FileManager.default.removeItem(atPath: data)
            try? FileManager.default.removeItem(atPath: logs)
        }
        try await onThread {
            let server = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-0.log", extraArguments: store.arguments)
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"a","isSuspended":true}"#).expecting(201)
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"b","isSuspended":true}"#).expecting(201)
            var elements: [String] = []
            for i in 0..<300 {
                elements.append(
                    BatchEndpointTests.delay(i % 2 == 0 ? "a" : "b", ref: "r\(i)", deps: i > 0 ? ["ref:r\(i - 1)"] : [], extra: #","name":"n\#(i)""#))
            }
            let r = try server.request("POST", "/v1/operations:batch", json: BatchEndpointTests.batch(elements)).expecting(201)
            let ops = r.objects("operations")
            #expect(ops.count == 300)
            // No pause: the answer was sent only after the commit.
            server.signal(SIGKILL)
            #expect(server.waitForExit(timeout: 10) == .signaled(SIGKILL))

            let again = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-1.log", extraArguments: store.arguments)
            try StoreChoice.awaitOwner(again)
            defer {
                again.signal(SIGTERM)
                _ = again.waitForExit(timeout: 10)
            }
            for (i, op) in ops.enumerated() {
                let id = try #require(op["id"] as? String)
                let s = try again.request("GET", "/v1/operations/\(id)").expecting(200, "element \(i) after the restart")
                #expect(s.string("name") == "n\(i)")
                if i > 0 { #expect(s.object["dependencies"] as? [String] == [ops[i - 1]["id"] as? String ?? ""]) }
            }
        }
    }
}
