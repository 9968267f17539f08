/// Where the queues live among the instances of a service: which ones this instance answers
/// for, and who holds the others. A single instance serves every queue; a partitioned cluster
/// (`PartitionOwner`) serves the queues of the partitions it holds. `ClusterFront` routes by it.
protocol QueuePlacement: Sendable {
    /// This instance's id among the holders (`PlacementHolder.instance`).
    var selfID: String { get }
    /// The base URL this instance advertises to the others ("" before it does).
    var selfURL: String { get }
    /// True when this instance answers requests for the queue `name` itself.
    func serves(queue name: String) -> Bool
    /// Where requests for the queue `name` go when this instance does not serve it, as last
    /// known; nil while nobody holds it (it is moving: 503 `no-owner`, retry shortly).
    func holder(ofQueue name: String) -> PlacementHolder?
}

/// Who holds a queue: an instance and the base URL it advertises ("" when not known).
struct PlacementHolder: Sendable, Equatable {
    var instance: String
    var url: String
}
