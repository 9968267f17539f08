import MicroHTTP
import QueueEngine

/// What `GET /v1/cluster` shows, as the placement sees it: every placement builds one, and
/// `ClusterController` renders it (the one renderer of the answer).
package struct ClusterView: Sendable, Equatable {
    package struct Instance: Sendable, Equatable {
        package var id: String
        package var url: String
        package var isSelf: Bool
        package var startedAt: Timestamp
        package var heartbeatAt: Timestamp
        /// In a cluster: whether it holds queues (partitions, or the one-owner lease).
        package var owner: Bool?
        /// With `--ownership one`, the owner's epoch.
        package var epoch: Int64?
        /// With partitions, the partitions it holds.
        package var partitions: [Int]?
        package var queues: [String]

        package init(
            id: String, url: String, isSelf: Bool, startedAt: Timestamp, heartbeatAt: Timestamp, owner: Bool? = nil, epoch: Int64? = nil,
            partitions: [Int]? = nil, queues: [String]
        ) {
            self.id = id; self.url = url; self.isSelf = isSelf; self.startedAt = startedAt; self.heartbeatAt = heartbeatAt
            self.owner = owner; self.epoch = epoch; self.partitions = partitions; self.queues = queues
        }
    }

    /// `single` (one instance serves the store alone) or `cluster`.
    package var mode: String
    /// `sqlite`, `memory` or `postgres`.
    package var store: String
    /// `partitions` when the queues are spread by partition (absent with `--ownership one`).
    package var ownership: String?
    /// How many partitions, with `ownership`.
    package var partitions: Int?
    package var instances: [Instance]

    package init(mode: String, store: String, ownership: String? = nil, partitions: Int? = nil, instances: [Instance]) {
        self.mode = mode; self.store = store; self.ownership = ownership; self.partitions = partitions; self.instances = instances
    }

    /// The JSON answer, keys in the order API.md shows them.
    package var json: [UInt8] {
        let queues = instances.reduce(0) { $0 + $1.queues.count }
        var o = JSONOut(capacity: 256 + 160 * instances.count + 40 * queues)
        o.open()
        o.key("mode"); o.string(mode)
        o.key("store"); o.string(store)
        if let ownership { o.key("ownership"); o.string(ownership) }
        if let partitions { o.key("partitions"); o.int(partitions) }
        o.key("instances"); o.openArray()
        for i in instances {
            o.open()
            o.key("id"); o.string(i.id)
            o.key("url"); o.string(i.url)
            o.key("self"); o.bool(i.isSelf)
            o.key("startedAt"); o.time(i.startedAt)
            o.key("heartbeatAt"); o.time(i.heartbeatAt)
            if let owner = i.owner { o.key("owner"); o.bool(owner) }
            if let epoch = i.epoch { o.key("epoch"); o.int(Int(clamping: epoch)) }
            if let parts = i.partitions {
                o.key("partitions"); o.openArray()
                for p in parts { o.int(p) }
                o.closeArray()
            }
            o.key("queues"); o.openArray()
            for q in i.queues { o.string(q) }
            o.closeArray()
            o.close()
        }
        o.closeArray()
        o.close()
        return o.bytes
    }
}
