import Foundation
import QueueTesting
import Testing

/// Flow control settings are durable like queue settings: kill -9 of the real binary right after
/// the acknowledgements, a restart on the same data, and everything acknowledged is there.
@Suite("Flow control survives kill -9")
struct FlowDurabilityTests {
    @Test("limiters, queue rates and weights, operations' limits and fairness keys survive kill -9", arguments: StoreChoice.allCases)
    func killNine(store choice: StoreChoice) async throws {
        let binary = try OpqdBinary.locate()
        let store = try choice.prepare()
        let data = try makeTemporaryDirectory(prefix: "opqd-flow-data")
        defer {
            store.remove()
            try? FileManager.default.removeItem(atPath: data)
        }
        let limiters = true
        var server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-0.log", extraArguments: store.arguments)
        func must(_ method: String, _ path: String, _ json: String? = nil, _ status: Int = 201) throws -> TestResponse {
            let r = try server.request(method, path, json: json)
            guard r.status == status else { throw Unexpected("\(method) \(path)", r) }
            return r
        }
        if limiters {
            try must("POST", "/v1/limiters", #"{"name":"stripe","concurrency":2,"rate":{"perSecond":50,"burst":7}}"#)
            try must("PATCH", "/v1/limiters/stripe", #"{"overrides":{"vip":{"concurrency":5}}}"#, 200)
            try must("POST", "/v1/limiters", #"{"name":"gone","concurrency":1}"#)
            try must("DELETE", "/v1/limiters/gone", nil, 204)
        }
        try must("POST", "/v1/queues", #"{"name":"q","maxConcurrentOperationCount":10,"rateLimit":{"perSecond":2.5,"burst":4}}"#)
        try must("PATCH", "/v1/queues/q", #"{"fairnessWeights":{"t1":3}}"#, 200)
        var ids: [String] = []
        for i in 0..<5 {
            let limits = limiters ? #","limits":[{"limiter":"stripe","key":"acct-1"}]"# : ""
            let r = try must("POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":{"seconds":60},"fairnessKey":"t\#(i % 2)"\#(limits)}"#)
            ids.append(try #require(r.string("id")))
        }
        server.killNow()

        server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-1.log", extraArguments: store.arguments)
        defer { server.killNow() }
        try await onThread { [server] in try StoreChoice.awaitOwner(server) }
        let q = try must("GET", "/v1/queues/q", nil, 200)
        let rate = try #require(q.object["rateLimit"] as? [String: Any])
        #expect(rate["perSecond"] as? Double == 2.5 && rate["burst"] as? Int == 4)
        #expect((q.object["fairnessWeights"] as? [String: Any])?["t1"] as? Int == 3)
        for (i, id) in ids.enumerated() {
            let op = try must("GET", "/v1/operations/\(id)", nil, 200)
            #expect(op.string("fairnessKey") == "t\(i % 2)")
            if limiters {
                #expect((op.object["limits"] as? [[String: Any]])?.first?["limiter"] as? String == "stripe")
            }
        }
        if limiters {
            let l = try must("GET", "/v1/limiters/stripe", nil, 200)
            #expect(l.int("concurrency") == 2)
            #expect((l.object["rate"] as? [String: Any])?["burst"] as? Int == 7)
            #expect(((l.object["overrides"] as? [String: Any])?["vip"] as? [String: Any])?["concurrency"] as? Int == 5)
            // After the restart, within the budget again: 2 running for acct-1, 3 waiting (on
            // PostgreSQL the slots are leased first, a moment after the restart).
            var counts = (l.int("running"), l.int("waiting"))
            let deadline = Date().addingTimeInterval(5)
            while counts != (2, 3) && Date() < deadline {
                try await Task.sleep(nanoseconds: 50_000_000)
                let again = try must("GET", "/v1/limiters/stripe", nil, 200)
                counts = (again.int("running"), again.int("waiting"))
            }
            #expect(counts == (2, 3), "running \(counts.0 ?? -1), waiting \(counts.1 ?? -1)")
            #expect(try server.request("GET", "/v1/limiters/gone").status == 404)
        }
    }
}
