import QueueEngine
import StoreKit

extension PostgresStore: DurableStore {
    public var name: String { "postgres" }
    public var isDurable: Bool { true }
    /// The URL without its password.
    public var path: String { displayURL }
    public var engineStore: any OperationStore { self }
    public var storeStats: StoreStats? { stats }
    public var unavailable: String? { unavailableReason }
    public func recoverState() throws -> RecoveredState? { try load() }
}
