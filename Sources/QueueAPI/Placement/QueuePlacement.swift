import QueueEngine

/// Where the queues live among the instances of a service: which ones this instance answers
/// for, who holds the others, when its engine may start work, what `GET /v1/cluster` and
/// `/metrics` say about it, and how its share changes. A single instance (`SingleInstance`)
/// serves every queue; a cluster's placements (the one owner, a partition holder) live in
/// `QueueCluster`. The composition root picks one; the rest of the service asks it, never which
/// one it has.
package protocol QueuePlacement: Sendable {
    /// This instance's id among the holders (`PlacementHolder.instance`).
    var selfID: String { get }
    /// The base URL this instance advertises to the others ("" before it does).
    var selfURL: String { get }
    /// True when this instance answers requests for the queue `name` itself.
    func serves(queue name: String) -> Bool
    /// Where requests for the queue `name` go when this instance does not serve it, as last
    /// known; nil while nobody holds it (it is moving: 503 `no-owner`, retry shortly).
    func holder(ofQueue name: String) -> PlacementHolder?
    /// Runs `body`: a request's decision "served here" up to its handler's hand-over of its
    /// change to the engine. A placement that gives queues up lets its engine go of them only
    /// once the requests inside have left (`ServingGate`).
    func whileServing<T>(_ body: () throws -> T) rethrows -> T

    /// True when this instance serves every queue of the store: then an observer of a queue it
    /// does not have is an orphan, and its clean stop is the store's to record. False for a
    /// partition holder: others hold the rest, and count their own crashes.
    var servesEveryQueue: Bool { get }
    /// Whether kinds start only once their start is committed, and are asked `mayStart` first
    /// (a cluster: its commits are fenced, and it may have lost its queues meanwhile).
    var startsAfterCommit: Bool { get }
    /// Asked right before each start (with `startsAfterCommit`): false when this instance can
    /// no longer be sure it holds the queue; the placement then gives its share up.
    func mayStart() -> Bool

    /// Why this instance cannot serve or forward every request yet (`/readyz` is 503 meanwhile);
    /// nil once it can. A partition holder is not ready until it holds its share and knows who
    /// holds the rest.
    var unready: String? { get }

    /// `GET /v1/cluster`. `ownQueues`: the engine's queues, sorted.
    func clusterView(ownQueues: [String]) throws -> ClusterView
    /// Its own `/metrics` families.
    func writeMetrics(to out: inout Exposition)
    /// Calls `body` (on a background thread) when the queues served here change.
    func onChange(_ body: @escaping @Sendable (PlacementChange) -> Void)

    /// Starts taking part, once the service listens at `advertise`.
    func start(engine: QueueEngine, advertise: String) throws
    /// A clean stop's first step, while requests are still answered: what this instance holds
    /// is handed to the others, and this waits (up to `seconds`) until they hold it, so that
    /// nobody is refused while it goes. True when others hold it all.
    @discardableResult
    func handOver(within seconds: Double) -> Bool
    /// A clean stop, after the store closed: what it holds is given up at once.
    func stop()
    /// The process is going (a role change): stops at once, without a word to the others.
    func abandon()
}

extension QueuePlacement {
    /// Nothing is given up while requests run: nothing to wait for.
    package func whileServing<T>(_ body: () throws -> T) rethrows -> T { try body() }

    /// Nothing to hand over: an instance alone, or the one owner, whose followers take over
    /// when its lease is given up at `stop`.
    package func handOver(within seconds: Double) -> Bool { false }
}

/// How the queues served here changed.
package enum PlacementChange: Sendable {
    /// Queues taken in (loaded into the engine), before they are served: those of `partitions`
    /// (`QueuePartitions`).
    case adopted(partitions: [Int])
    /// Queues given up (the engine let them go); `queue` says which.
    case released(_ queue: @Sendable (String) -> Bool)
}

/// Who holds a queue: an instance and the base URL it advertises ("" when not known).
package struct PlacementHolder: Sendable, Equatable {
    package var instance: String
    package var url: String

    package init(instance: String, url: String) {
        self.instance = instance
        self.url = url
    }
}

/// One opqd serving its store alone (SQLite or memory): every queue is here.
package final class SingleInstance: QueuePlacement {
    let instance: InstanceInfo

    package init(instance: InstanceInfo) { self.instance = instance }

    package var selfID: String { instance.id }
    package var selfURL: String { instance.url }
    package func serves(queue name: String) -> Bool { true }
    package func holder(ofQueue name: String) -> PlacementHolder? { nil }
    package var servesEveryQueue: Bool { true }
    package var startsAfterCommit: Bool { false }
    package func mayStart() -> Bool { true }
    package var unready: String? { nil }

    package func clusterView(ownQueues: [String]) throws -> ClusterView {
        ClusterView(
            mode: "single", store: instance.store,
            instances: [
                ClusterView.Instance(
                    id: instance.id, url: instance.url, isSelf: true, startedAt: instance.startedAt, heartbeatAt: instance.heartbeatAt,
                    queues: ownQueues)
            ])
    }

    package func writeMetrics(to out: inout Exposition) {}
    package func onChange(_ body: @escaping @Sendable (PlacementChange) -> Void) {}
    package func start(engine: QueueEngine, advertise: String) throws {}
    package func stop() {}
    package func abandon() {}
}
