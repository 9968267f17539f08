import QueueEngine
import StoreKit

extension SQLiteStore: DurableStore {
    public var name: String { "sqlite" }
    public var isDurable: Bool { true }
    public var engineStore: any OperationStore { self }
    public var storeStats: StoreStats? { stats }
    public func recoverState() throws -> RecoveredState? { try load() }
}
