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
                if (try? n.request("GET", "/readyz", timeout: 2))?.status == 200 { ready.insert(n.index) }
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
