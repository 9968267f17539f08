import Foundation
import TestKit
import Testing

extension ClusterTests {
    @Test("a host held by hand on one instance holds the operations of every instance, and its release reaches them all")
    func hostAcrossOwners() async throws {
        try await TestCluster(name: "hosts").run(Self.hostAcrossOwners)
    }

    static func hostAcrossOwners(_ cluster: TestCluster) throws {
        guard cluster.awaitSpread() else {
            cluster.record(["the instances did not agree within 20 s on a spread of the partitions over all three"], "start")
            return
        }
        guard let (qa, qb, _) = queuesOfTwoOwners(cluster, prefix: "host") else {
            cluster.record(["no two queue names with different holders among 40"], "host across owners")
            return
        }
        var problems: [String] = []
        guard let a = cluster.awaitHolder(of: qa), let b = cluster.awaitHolder(of: qb) else {
            cluster.record(["the holders could not be found"], "host across owners")
            return
        }
        try cluster.createQueue(qa, maxConcurrent: 4, via: a)
        try cluster.createQueue(qb, maxConcurrent: 4, via: b)
        let host = "127.0.0.1:\(closedPort())"
        // Held by hand through qa's holder: qb's holder learns of it from the feed and the store.
        let opened = try a.request("PATCH", "/v1/hosts/\(host)", json: #"{"breaker":"open","reason":"maintenance"}"#)
        if opened.status != 200 { problems.append("PATCH open through opqd #\(a.index): \(opened.status) \(opened.text.prefix(300))") }
        var seen = false
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline && !seen {
            seen = try b.request("GET", "/v1/hosts/\(host)").string("state") == "open"
            if !seen { Thread.sleep(forTimeInterval: 0.05) }
        }
        if !seen { problems.append("opqd #\(b.index) did not show the host open within 5 s") }
        let made = try b.request("POST", "/v1/queues/\(qb)/operations", json: #"{"kind":"http","spec":{"method":"GET","url":"http://\#(host)/x","timeout":1}}"#)
        guard made.status == 201, let id = made.string("id") else {
            cluster.record(problems + ["creating an http operation in \(qb): \(made.status) \(made.text.prefix(300))"], "host across owners")
            return
        }
        Thread.sleep(forTimeInterval: 0.3)
        let held = try b.request("GET", "/v1/operations/\(id)")
        let waiting = (held.object["waitingOn"] as? [[String: Any]]) ?? []
        if held.string("state") != "ready" || !waiting.contains(where: { $0["type"] as? String == "host" && $0["state"] as? String == "open" }) {
            problems.append("an operation of another instance to the held host is not held: \(held.text.prefix(300))")
        }
        // Released through qb's holder this time: qa's holder follows.
        let closed = try b.request("PATCH", "/v1/hosts/\(host)", json: #"{"breaker":"closed"}"#)
        if closed.status != 200 { problems.append("PATCH closed through opqd #\(b.index): \(closed.status) \(closed.text.prefix(300))") }
        var released = false
        let until = Date().addingTimeInterval(5)
        while Date() < until && !released {
            released = try a.request("GET", "/v1/hosts/\(host)").string("state") == "closed"
            if !released { Thread.sleep(forTimeInterval: 0.05) }
        }
        if !released { problems.append("opqd #\(a.index) did not show the host closed within 5 s") }
        var started = false
        let end = Date().addingTimeInterval(5)
        while Date() < end && !started {
            started = try b.request("GET", "/v1/operations/\(id)").string("state") != "ready"
            if !started { Thread.sleep(forTimeInterval: 0.05) }
        }
        if !started { problems.append("the held operation did not start once the host was closed") }
        cluster.record(problems, "host across owners")
    }
}
