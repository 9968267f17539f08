import Locking
import QueueEngine

/// `--store memory`: the engine's in-memory store; meta values live as long as the process,
/// and every "commit" is immediate.
public final class MemoryStore: DurableStore {
    public let engineStore: any OperationStore = InMemoryStore()
    private let values = Lock<[String: String]>([:])

    public var name: String { "memory" }
    public var isDurable: Bool { false }
    public var path: String { "" }
    public var storeStats: StoreStats? { nil }
    public init() {}

    public func recoverState() throws -> RecoveredState? { nil }
    public func recentEvents(limit: Int) -> [ChangeEvent] { [] }
    public func history(of id: OperationID, after: UInt64, limit: Int) -> [ChangeEvent]? { nil }
    public func eventWindow(queue: String?, operation: OperationID?, after: UInt64, through: UInt64, limit: Int) -> EventWindow? { nil }

    public func meta(prefix: String) -> [(key: String, value: String)] {
        values.withLock { v in v.filter { $0.key.hasPrefix(prefix) }.sorted { $0.key < $1.key }.map { ($0.key, $0.value) } }
    }

    @discardableResult
    public func setMeta(_ pairs: [(key: String, value: String?)], then done: (@Sendable () -> Void)?) -> Bool {
        values.withLock { v in for (key, value) in pairs { v[key] = value } }
        done?()
        return true
    }

    public func loadIdempotency() -> [IdempotencyRecord] { [] }
    public func purge(finishedBefore cutoff: Timestamp, limit: Int) -> Int { 0 }
    public func purgeIdempotency(before cutoff: Timestamp) -> Int { 0 }
    public func close() {}
}
