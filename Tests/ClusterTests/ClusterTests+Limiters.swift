import Foundation
import TestKit
import Testing

extension ClusterTests {
    @Test("a limiter shared by queues of different owners keeps one budget for the whole cluster")
    func limiterAcrossOwners() async throws {
        try await TestCluster(name: "limiter").run(Self.limiterAcrossOwners)
    }

    static func limiterAcrossOwners(_ cluster: TestCluster) throws {
        guard cluster.awaitSpread() else {
            cluster.record(["the instances did not agree within 20 s on a spread of the partitions over all three"], "start")
            return
        }
        guard let (qa, qb, third) = queuesOfTwoOwners(cluster, prefix: "lim") else {
            cluster.record(["no two queue names with different holders among 40"], "limiter across owners")
            return
        }
        let nodes = cluster.nodes
        var problems: [String] = []
        // Made through the instance that holds neither queue: the owners learn of it from the store.
        let made = try third.request("POST", "/v1/limiters", json: #"{"name":"stripe","concurrency":3,"overrides":{"solo":{"concurrency":1}}}"#)
        if made.status != 201 { problems.append("POST /v1/limiters through opqd #\(third.index): \(made.status) \(made.text.prefix(300))") }
        try cluster.createQueue(qa, maxConcurrent: 20, via: nodes[0])
        try cluster.createQueue(qb, maxConcurrent: 20, via: nodes[1])
        // 8 operations per queue, each 0.4 s, all on key acct-1: at most 3 at a time in all.
        var ids: [String] = []
        for i in 0..<16 {
            let q = i % 2 == 0 ? qa : qb
            let r = try nodes[i % 3].request(
                "POST", "/v1/queues/\(q)/operations",
                json: #"{"kind":"delay","spec":{"seconds":0.4},"limits":[{"limiter":"stripe","key":"acct-1"}]}"#)
            guard r.status == 201, let id = r.string("id") else {
                problems.append("creating an operation in \(q) through opqd #\(i % 3): \(r.status) \(r.text.prefix(300))")
                continue
            }
            ids.append(id)
        }
        // Sampled while they run: never more than 3 executing across both owners' queues.
        var most = 0
        var sawBoth = false
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            var executing = 0
            var perQueue: [String: Int] = [:]
            var unfinished = 0
            for q in [qa, qb] {
                let s = try third.request("GET", "/v1/queues/\(q)")
                let counts = s.object["counts"] as? [String: Any]
                let e = counts?["executing"] as? Int ?? 0
                executing += e
                perQueue[q] = e
                unfinished += s.int("operationCount") ?? 0
            }
            most = max(most, executing)
            if (perQueue[qa] ?? 0) > 0 && (perQueue[qb] ?? 0) > 0 { sawBoth = true }
            if unfinished == 0 { break }
            Thread.sleep(forTimeInterval: 0.02)
        }
        if most > 3 { problems.append("\(most) operations of key acct-1 executed at once across the two owners; the budget is 3") }
        if most < 2 { problems.append("at most \(most) executed at once: the shared budget of 3 was hardly used") }
        if !sawBoth { problems.append("the two owners' queues never ran operations of the key at the same time") }
        for id in ids {
            let s = try third.request("GET", "/v1/operations/\(id)")
            if s.string("outcome") != "succeeded" { problems.append("\(id): \(s.text.prefix(200))") }
        }
        // The limiter as every instance shows it, and a delete refused while an operation names it.
        let parked = try nodes[0].request(
            "POST", "/v1/queues/\(qb)/operations", json: #"{"kind":"delay","spec":{"seconds":30},"limits":[{"limiter":"stripe","key":"solo"}]}"#)
        if parked.status != 201 { problems.append("creating one more in \(qb): \(parked.status) \(parked.text.prefix(200))") }
        for node in nodes {
            let l = try node.request("GET", "/v1/limiters/stripe")
            if l.status != 200 || l.int("concurrency") != 3 {
                problems.append("GET /v1/limiters/stripe through opqd #\(node.index): \(l.status) \(l.text.prefix(200))")
            }
        }
        let refused = try nodes[0].request("DELETE", "/v1/limiters/stripe")
        if refused.status != 409 { problems.append("DELETE of a limiter an operation on another owner names: \(refused.status), not 409") }
        let widened = try nodes[2].request("PATCH", "/v1/limiters/stripe", json: #"{"concurrency":5}"#)
        if widened.status != 200 { problems.append("PATCH through opqd #2: \(widened.status) \(widened.text.prefix(200))") }
        if let id = parked.string("id") { _ = try third.request("POST", "/v1/operations/\(id)/cancel") }
        var deleted = false
        for _ in 0..<50 where !deleted {
            deleted = try nodes[1].request("DELETE", "/v1/limiters/stripe").status == 204
            if !deleted { Thread.sleep(forTimeInterval: 0.1) }
        }
        if !deleted { problems.append("the limiter could not be deleted once nothing named it") }
        cluster.record(problems, "limiter across owners (most at once: \(most))")
    }
}
