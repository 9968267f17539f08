import Foundation
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension ClusterTests {
    // MARK: - startup

    /// API.md "Many instances": `/readyz` answers 200 only once the instance serves or can
    /// forward every request. As an outside check does it: three instances started one after
    /// another, every `/readyz` polled until 200, then at once queues (over many partitions)
    /// created through the instances in turn for 3 s (more than four lease periods, so a move of
    /// partitions still under way would be met). Not one may be refused.
    @Test("once every instance's /readyz answers 200, creates through any of them succeed at once: no 503 no-owner at startup")
    func readyMeansServing() async throws {
        try await TestCluster(name: "ready").run(Self.readyMeansServing)
    }

    static func readyMeansServing(_ cluster: TestCluster) throws {
        let nodes = cluster.nodes
        let t0 = monotonicSeconds()
        var ready: Set<Int> = []
        while ready.count < nodes.count && monotonicSeconds() - t0 < 30 {
            for n in nodes where !ready.contains(n.index) {
                if n.isReady(timeout: 2) { ready.insert(n.index) }
            }
            usleep(20_000)
        }
        guard ready.count == nodes.count else {
            cluster.record(["only instances \(ready.sorted()) answered /readyz 200 within 30 s"], "readyz")
            return
        }
        print(String(format: "ClusterTests.readyMeansServing: every /readyz 200 after %.2f s", monotonicSeconds() - t0))
        var problems: [String] = []
        var i = 0
        let start = monotonicSeconds()
        while monotonicSeconds() - start < 3 {
            let node = nodes[i % nodes.count]
            let r = try node.request("POST", "/v1/queues", json: #"{"name":"ready-\#(i)","isSuspended":true}"#)
            if r.status != 201 { problems.append("queue ready-\(i) through opqd #\(node.index): \(r)") }
            i += 1
        }
        print("ClusterTests.readyMeansServing: \(i) queues created, \(problems.count) refused")
        cluster.record(problems, "creates right after every /readyz answered 200")
    }
}

extension ClusterTests {
    // MARK: - a join under load

    /// API.md "Many instances": when an instance joins, the queues that move are handed over
    /// without refusing requests. Two instances serve; a client creates operations in queues over
    /// many partitions, through the instances that are up (as a load balancer sends only to
    /// those whose `/readyz` is 200); a third instance starts, is added once ready, and the
    /// creates go on for 4 s more (six lease periods, while its share moves to it). Not one may
    /// be refused.
    @Test("an instance joining under load: the partitions that move to it refuse no request")
    func joinUnderLoad() async throws {
        try await TestCluster(size: 2, name: "join").run(Self.joinUnderLoad)
    }

    static func joinUnderLoad(_ cluster: TestCluster) throws {
        var up = cluster.nodes
        guard waitUntil(timeout: 30, every: 0.05, { up.allSatisfy { $0.isReady(timeout: 2) } }) else {
            cluster.record(["the first two instances did not answer /readyz 200 within 30 s"], "readyz")
            return
        }
        let queues = (0..<48).map { "join-\($0)" }
        for (i, q) in queues.enumerated() { try cluster.createQueue(q, maxConcurrent: 1, suspended: true, via: up[i % up.count]) }
        let joiner = try ClusterNode(
            index: 2, binary: try OpqdBinary.locate(), arguments: ["--store", cluster.database, "--lease", String(Int(TestCluster.lease))],
            data: cluster.logs + "/data-2", logPath: cluster.logs + "/opqd-2.log")
        defer { joiner.stop() }
        var problems: [String] = []
        var made = 0
        var joinedAt: Double?
        var slowest = 0.0
        let start = monotonicSeconds()
        while monotonicSeconds() - start < 30 {
            if joinedAt == nil, joiner.isReady() {
                up.append(joiner)
                joinedAt = monotonicSeconds()
            }
            if let at = joinedAt, monotonicSeconds() - at > 4 { break }
            let node = up[made % up.count]
            let queue = queues[made % queues.count]
            let t = monotonicSeconds()
            let r = try node.request("POST", "/v1/queues/\(queue)/operations", json: #"{"kind":"delay","spec":{"seconds":1}}"#)
            slowest = max(slowest, monotonicSeconds() - t)
            if r.status != 201 { problems.append("create in \(queue) through opqd #\(node.index): \(r)") }
            made += 1
        }
        print(String(format: "ClusterTests.joinUnderLoad: %d creates, %d refused, slowest %.3f s", made, problems.count, slowest))
        if joinedAt == nil { problems.append("the third instance did not answer /readyz 200 within 30 s") }
        cluster.record(problems, "creates while a third instance joined")
    }
}
