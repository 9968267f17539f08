import Foundation
import Locking
import TestKit
import Testing

extension ClusterTests {
    @Test("creates sent at once through an instance that does not hold their queue go to its holder together, each made once, keys kept")
    func relayedTogether() async throws {
        try await TestCluster(name: "relay").run(Self.relayedTogether)
    }

    static func relayedTogether(_ cluster: TestCluster) throws {
        guard let (a, b, qb) = throughAnother(cluster, prefix: "relay") else { return }
        // Suspended: every create stays unfinished, so the queue's count says how many were made.
        try cluster.createQueue(qb, maxConcurrent: 1, suspended: true, via: b)
        // 32 clients at once through a, for qb (held by b): a's forwarding thread is busy with
        // some while the next arrive, so creates go together. Every other one carries a key.
        let (clients, each) = (32, 10)
        let made = Lock<[String: String]>([:])
        let problems = Lock<[String]>([])
        let done = DispatchGroup()
        for c in 0..<clients {
            done.enter()
            Thread.detachNewThread {
                defer { done.leave() }
                for k in 0..<each {
                    let name = "c\(c)-\(k)"
                    let headers = k % 2 == 0 ? ["Idempotency-Key": "key-\(name)"] : [:]
                    let body = #"{"kind":"delay","spec":{"seconds":0.01},"name":"\#(name)"}"#
                    do {
                        let r = try a.request("POST", "/v1/queues/\(qb)/operations", json: body, headers: headers)
                        guard r.status == 201, let id = r.string("id"), r.string("name") == name else {
                            problems.withLock { $0.append("\(name): \(r.status) \(r.text.prefix(200))") }
                            continue
                        }
                        made.withLock { $0[name] = id }
                    } catch {
                        problems.withLock { $0.append("\(name): \(error)") }
                    }
                }
            }
        }
        done.wait()
        var found = problems.value
        let ids = made.value
        if Set(ids.values).count != ids.count { found.append("\(ids.count) creates answered \(Set(ids.values).count) distinct ids") }
        let queue = try b.request("GET", "/v1/queues/\(qb)")
        let count = queue.object["operationCount"] as? Int
        if count != clients * each { found.append("\(qb) has \(count.map(String.init) ?? "no") operations, \(clients * each) were created") }
        // The keyed ones again: their first answers, made nothing more.
        for c in 0..<4 {
            let name = "c\(c)-0"
            let again = try a.request(
                "POST", "/v1/queues/\(qb)/operations", json: #"{"kind":"delay","spec":{"seconds":0.01},"name":"\#(name)"}"#,
                headers: ["Idempotency-Key": "key-\(name)"])
            if again.status != 201 || again.string("id") != ids[name] || again.headers["idempotent-replayed"] != "true" {
                found.append("the keyed create \(name) again: \(again.status) \(again.string("id") ?? "-") (first \(ids[name] ?? "-"))")
            }
        }
        // They went together: the holder answered envelopes.
        let metrics = try b.request("GET", "/metrics").text
        let envelopes = metrics.split(separator: "\n").filter {
            $0.hasPrefix("opqd_http_requests_total{") && $0.contains(#"route="/v1/cluster/relay""#) && $0.contains(#"code="200""#)
        }
        .compactMap { $0.split(separator: " ").last.flatMap { Double($0) } }.reduce(0, +)
        if envelopes < 1 { found.append("opqd #\(b.index) answered no relay envelope (\(ids.count) creates forwarded by opqd #\(a.index))") }
        // Each create in them is counted at the holder under its own route, as if alone.
        let creates = metrics.split(separator: "\n").filter {
            $0.hasPrefix("opqd_http_requests_total{") && $0.contains(#"route="/v1/queues/{name}/operations""#) && $0.contains(#"method="POST""#)
                && $0.contains(#"code="201""#)
        }
        .compactMap { $0.split(separator: " ").last.flatMap { Double($0) } }.reduce(0, +)
        if creates < Double(clients * each) {
            found.append("opqd #\(b.index) counts \(Int(creates)) creates answered 201 under their route; it made \(clients * each)")
        }
        print("ClusterTests.relayedTogether: \(ids.count) creates through opqd #\(a.index) for a queue of opqd #\(b.index), \(Int(envelopes)) envelopes")
        cluster.record(found, "relayed creates")
    }
    @Test("finishes, one by one and several per request, sent at once through an instance that does not hold their queue: each finishes its operation once")
    func forwardedFinishes() async throws {
        try await TestCluster(name: "fwdfin").run(Self.forwardedFinishes)
    }

    static func forwardedFinishes(_ cluster: TestCluster) throws {
        guard let (a, b, qb) = throughAnother(cluster, prefix: "fin") else { return }
        let count = 240
        try cluster.createQueue(qb, maxConcurrent: count, via: b)
        var found: [String] = []
        for start in stride(from: 0, to: count, by: 100) {
            let n = min(100, count - start)
            let ops = (0..<n).map { _ in #"{"queue":"\#(qb)","kind":"external","spec":{"lease":60}}"# }.joined(separator: ",")
            let made = try b.request("POST", "/v1/operations:batch", json: #"{"operations":[\#(ops)]}"#)
            if made.status != 201 { found.append("batch of \(n) externals: \(made.status) \(made.text.prefix(200))") }
        }
        // Claimed at the holder: (id, token) each.
        var leases: [(id: String, token: String)] = []
        let deadline = Date().addingTimeInterval(20)
        while leases.count < count, Date() < deadline {
            let claim = try b.request("POST", "/v1/queues/\(qb)/claim?max=100&wait=1", json: #"{"worker":"w"}"#)
            guard claim.status == 200 else { continue }
            for c in claim.objects("claims") {
                if let id = (c["operation"] as? [String: Any])?["id"] as? String, let token = (c["lease"] as? [String: Any])?["token"] as? String {
                    leases.append((id, token))
                }
            }
        }
        guard leases.count == count else {
            cluster.record(found + ["claimed \(leases.count) of \(count) operations of \(qb) within 20 s"], "claims")
            return
        }
        // 24 clients through a: each finishes its share one by one, the last ones of each
        // share in one POST /v1/operations:finish.
        let clients = 24
        let claimed = leases
        let problems = Lock<[String]>([])
        let done = DispatchGroup()
        for c in 0..<clients {
            done.enter()
            Thread.detachNewThread {
                defer { done.leave() }
                let mine = stride(from: c, to: count, by: clients).map { claimed[$0] }
                do {
                    for l in mine.dropLast(3) {
                        let r = try a.request("POST", "/v1/operations/\(l.id)/finish", json: #"{"leaseToken":"\#(l.token)","result":{"n":1}}"#)
                        if r.status != 200 || r.string("state") != "finished" {
                            problems.withLock { $0.append("finish \(l.id): \(r.status) \(r.text.prefix(200))") }
                        }
                    }
                    let bulk = mine.suffix(3).map { #"{"id":"\#($0.id)","leaseToken":"\#($0.token)","result":{"n":2}}"# }.joined(separator: ",")
                    let r = try a.request("POST", "/v1/operations:finish", json: #"{"finishes":[\#(bulk)]}"#)
                    let statuses = r.objects("finishes").compactMap { $0["status"] as? Int }
                    if r.status != 200 || statuses != [200, 200, 200] { problems.withLock { $0.append("bulk finish: \(r.status) \(r.text.prefix(300))") } }
                } catch {
                    problems.withLock { $0.append("client \(c): \(error)") }
                }
            }
        }
        done.wait()
        found += problems.value
        // Each finished once, with its own result; a finish again is refused.
        for (i, l) in leases.enumerated() where i % 20 == 0 {
            let op = try b.request("GET", "/v1/operations/\(l.id)")
            if op.string("state") != "finished" || op.string("outcome") != "succeeded" {
                found.append("\(l.id): \(op.string("state") ?? "?") \(op.string("outcome") ?? "?")")
            }
            let again = try a.request("POST", "/v1/operations/\(l.id)/finish", json: #"{"leaseToken":"\#(l.token)","result":{}}"#)
            if again.status != 409 { found.append("\(l.id) finished again: \(again.status)") }
        }
        let queue = try b.request("GET", "/v1/queues/\(qb)")
        if let n = queue.object["operationCount"] as? Int, n != 0 { found.append("\(qb) still has \(n) unfinished operations") }
        print("ClusterTests.forwardedFinishes: \(count) finishes through opqd #\(a.index) for a queue of opqd #\(b.index)")
        cluster.record(found, "forwarded finishes")
    }

    /// Once the partitions are spread over all three: an instance `a`, and a queue `qb` held by
    /// another, `b` (nil, recorded, when either cannot be had).
    static func throughAnother(_ cluster: TestCluster, prefix: String) -> (a: ClusterNode, b: ClusterNode, qb: String)? {
        guard cluster.awaitSpread() else {
            cluster.record(["the instances did not agree within 20 s on a spread of the partitions over all three"], "start")
            return nil
        }
        guard let (qa, qb, _) = queuesOfTwoOwners(cluster, prefix: prefix), let a = cluster.awaitHolder(of: qa), let b = cluster.awaitHolder(of: qb) else {
            cluster.record(["no two queue names with different holders among 40"], "relay")
            return nil
        }
        return (a, b, qb)
    }
}
