import Locking
import QueueEngine

/// What the service asks of a store beyond the engine's `OperationStore`: `SQLiteStore`,
/// `PostgresStore`, or `MemoryStore` (`--store memory`), which keeps nothing across restarts.
/// Code above it asks `isDurable` where they differ, never which one it has; the composition
/// root (`OpqdApp`) is the only code that names them. `StoreConformanceTests` asks the same of
/// all three.
public protocol DurableStore: AnyObject, Sendable {
    /// `sqlite`, `postgres` or `memory` (readyz, logs).
    var name: String { get }
    /// Whether a commit survives a restart; when not, no answer waits for one.
    var isDurable: Bool { get }
    /// Where it lives, for logs ("" in memory).
    var path: String { get }
    /// What the engine writes its records to.
    var engineStore: any OperationStore { get }
    /// For `/metrics`; nil when there is nothing to count.
    var storeStats: StoreStats? { get }
    /// What the last run left (nil: nothing, a first start or memory).
    func recoverState() throws -> RecoveredState?
    /// The newest `limit` stored events, oldest first.
    func recentEvents(limit: Int) -> [ChangeEvent]
    /// Events of one operation after `after`; nil when the store does not keep them (the caller
    /// falls back to the in-memory ring) or when the read failed (a durable store: 503).
    func history(of id: OperationID, after: UInt64, limit: Int) -> [ChangeEvent]?
    /// Stored events of a queue (or one operation) with `after` < seq <= `through`, reading at
    /// most `limit` rows; nil when the read failed or the store keeps none (webhook deliveries
    /// that fell behind catch up from here).
    func eventWindow(queue: String?, operation: OperationID?, after: UInt64, through: UInt64, limit: Int) -> EventWindow?
    func meta(prefix: String) -> [(key: String, value: String)]
    /// Writes (nil deletes) in one commit; `then` runs once committed. False when the store is
    /// closing (then `then` never runs).
    @discardableResult
    func setMeta(_ pairs: [(key: String, value: String?)], then done: (@Sendable () -> Void)?) -> Bool
    func loadIdempotency() -> [IdempotencyRecord]
    /// The kept answers an instance taking `partitions` of a cluster's queues needs: those kept
    /// with changes to their queues, and those kept with none. A store of one instance has
    /// every answer (the default: all).
    func loadIdempotency(partitions: [Int]) -> [IdempotencyRecord]
    func purge(finishedBefore cutoff: Timestamp, limit: Int) -> Int
    func purgeIdempotency(before cutoff: Timestamp) -> Int
    func close()
    /// Why the store cannot commit right now (the writer keeps retrying); nil when it can.
    /// Readiness is 503 meanwhile.
    var unavailable: String? { get }
}

extension DurableStore {
    public var unavailable: String? { nil }
}

extension DurableStore {
    public func loadIdempotency(partitions: [Int]) -> [IdempotencyRecord] { loadIdempotency() }
}
