import PostgresStore
import QueueAPI

/// What one lease period of a partitioned instance decides, from what it read: pure, so the
/// cluster's rules are table-tested without PostgreSQL (`PartitionPlannerTests`), as the
/// operation state machine is. `PartitionOwner.tick` reads, asks the planner, then acts.
struct PartitionPlan: Equatable, Sendable {
    /// Held partitions that rendezvous hashing now gives to another live instance: released.
    var give: Set<Int>
    /// Partitions this instance should hold that nobody holds a live lease on: claimed, in
    /// order.
    var want: [Int]
}

enum PartitionPlanner {
    /// - Parameters:
    ///   - selfID: this instance.
    ///   - live: instances with a heartbeat within one lease, as read (this one is added).
    ///   - held: partitions this instance holds (renewed this period).
    ///   - leased: partitions with a live lease, whoever holds it (this instance's included).
    ///   - leaving: partitions being given up right now (their runs stopping): neither given
    ///     again nor claimed back until the release is done.
    ///   - departing: this instance is leaving (a clean stop): it gives every partition up and
    ///     wants none.
    static func plan(selfID: String, live read: [String], held: Set<Int>, leased: Set<Int>, leaving: Set<Int>, departing: Bool = false) -> PartitionPlan {
        if departing { return PartitionPlan(give: held.subtracting(leaving), want: []) }
        let live = self.live(selfID: selfID, read: read)
        let targets = QueuePartitions.targets(of: selfID, among: live)
        let give = held.filter { !targets.contains($0) && !leaving.contains($0) }
        let want = targets.filter { !held.contains($0) && !leased.contains($0) && !leaving.contains($0) }.sorted()
        return PartitionPlan(give: give, want: want)
    }

    /// Whether this instance holds every partition rendezvous hashing gives it among `live`:
    /// its share is taken, so nothing more moves to it (it is ready, `PartitionOwner.unready`).
    static func settled(selfID: String, live read: [String], held: Set<Int>) -> Bool {
        QueuePartitions.targets(of: selfID, among: live(selfID: selfID, read: read)).allSatisfy { held.contains($0) }
    }

    /// The live instances as read, with this one added when its own heartbeat was not read
    /// back (it is live while it runs). Another is alive when there are two or more: while
    /// none is, this instance may act on partitions whose lease it could not renew.
    static func live(selfID: String, read: [String]) -> [String] {
        read.contains(selfID) ? read : read + [selfID]
    }
}
