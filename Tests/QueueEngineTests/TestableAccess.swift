@testable import QueueEngine

extension QueueEngine {
    /// Slots of the engine's operation table (for memory tests).
    var tableSpan: Int { state.withLock { $0.ops.span } }
}
