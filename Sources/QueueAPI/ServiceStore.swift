import Locking
import PostgresStore
import QueueEngine
import QueueStore

/// What the API asks of the store beyond the engine's `OperationStore`: the SQLite store, the
/// PostgreSQL store, or `MemoryServiceStore` (`--store memory`), which keeps nothing across
/// restarts. Code above it asks `isDurable` where they differ; `Application+build` still asks
/// which one it has in two places (the cluster's wiring), which the seams issue removes.
protocol ServiceStore: AnyObject, Sendable {
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
    /// Events of one operation after `after`, or nil when the store does not keep them (the
    /// caller falls back to the in-memory ring).
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
    func purge(finishedBefore cutoff: Timestamp, limit: Int) -> Int
    func purgeIdempotency(before cutoff: Timestamp) -> Int
    func close()
    /// Why the store cannot commit right now (the writer keeps retrying); nil when it can.
    /// Readiness is 503 meanwhile.
    var unavailable: String? { get }
}

extension ServiceStore {
    var unavailable: String? { nil }
}

extension SQLiteStore: ServiceStore {
    var name: String { "sqlite" }
    var isDurable: Bool { true }
    var engineStore: any OperationStore { self }
    var storeStats: StoreStats? { stats }
    func recoverState() throws -> RecoveredState? { try load() }
}

extension PostgresStore: ServiceStore {
    var name: String { "postgres" }
    var isDurable: Bool { true }
    /// The URL without its password.
    var path: String { displayURL }
    var engineStore: any OperationStore { self }
    var storeStats: StoreStats? { stats }
    var unavailable: String? { unavailableReason }
    func recoverState() throws -> RecoveredState? { try load() }
}

/// `--store memory`: the engine's in-memory store; meta values live as long as the process,
/// and every "commit" is immediate.
final class MemoryServiceStore: ServiceStore {
    let engineStore: any OperationStore = InMemoryStore()
    private let values = Lock<[String: String]>([:])

    var name: String { "memory" }
    var isDurable: Bool { false }
    var path: String { "" }
    var storeStats: StoreStats? { nil }
    func recoverState() throws -> RecoveredState? { nil }
    func recentEvents(limit: Int) -> [ChangeEvent] { [] }
    func history(of id: OperationID, after: UInt64, limit: Int) -> [ChangeEvent]? { nil }
    func eventWindow(queue: String?, operation: OperationID?, after: UInt64, through: UInt64, limit: Int) -> EventWindow? { nil }

    func meta(prefix: String) -> [(key: String, value: String)] {
        values.withLock { v in v.filter { $0.key.hasPrefix(prefix) }.sorted { $0.key < $1.key }.map { ($0.key, $0.value) } }
    }

    @discardableResult
    func setMeta(_ pairs: [(key: String, value: String?)], then done: (@Sendable () -> Void)?) -> Bool {
        values.withLock { v in for (key, value) in pairs { v[key] = value } }
        done?()
        return true
    }

    func loadIdempotency() -> [IdempotencyRecord] { [] }
    func purge(finishedBefore cutoff: Timestamp, limit: Int) -> Int { 0 }
    func purgeIdempotency(before cutoff: Timestamp) -> Int { 0 }
    func close() {}
}
