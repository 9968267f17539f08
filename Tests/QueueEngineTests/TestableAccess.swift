@testable import QueueEngine

extension QueueEngine {
    /// Slots of the engine's operation table (for memory tests).
    var tableSpan: Int { state.withLock { $0.ops.span } }
}

extension QueueEngine {
    /// Entries in the parked heap of a limiter key (stale ones included).
    func parkedEntries(limiter: String, key: String) -> Int { state.withLock { $0.limiters[limiter]?.keys[key]?.parked.count ?? -1 } }
    /// Fairness keys a queue's fair order keeps, over all priorities.
    func fairKeys(queue: String) -> Int { state.withLock { core in core.queues[queue]?.fair?.levels.map(\.keys.count).reduce(0, +) ?? -1 } }
}

extension QueueEngine {
    /// Keys a queue's admission index holds (debounce and singleton).
    func admissionKeys(in queue: String) -> Int {
        state.withLock { core in core.queues[queue]?.admission.map { $0.debounce.count + $0.singleton.count } ?? 0 }
    }
}
