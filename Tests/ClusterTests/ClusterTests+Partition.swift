import Foundation
import TestKit
import Testing

extension ClusterTests {
    // MARK: - a cut link

    /// The three instances as separate hosts: each in a network namespace of its own, on a
    /// bridge, PostgreSQL through a relay on the bridge. The link of queue s's owner is taken down for 3x
    /// the lease (it reaches nothing, nothing reaches it, and its connections stay open as far
    /// as the other side knows), then brought back: the same checks as the SIGSTOP test.
    @Test(
        "a queue's owner cut off the network for 3x its lease (its own network namespace, link down) writes nothing after the takeover, and comes back to take its share again"
    )
    func partition() async throws {
        let (made, why) = NetworkLab.make(count: 3)
        guard let lab = made else {
            print("ClusterTests.partition skipped: network namespaces are not available here (\(why))")
            return
        }
        try await TestCluster(name: "partition", lab: lab).run { cluster in
            try Self.isolation(
                cluster,
                Isolation(
                    name: "partition", cut: "link down", heal: "link up",
                    isolate: { try lab.cut($0.index) }, reconnect: { try lab.restore($0.index) }))
        }
    }
}
