/// Reading the queues' history (API.md "History").
public struct HistorySeries: Sendable {
    public var step: Int64
    /// Oldest first; empty buckets left out.
    public var buckets: [HistoryBucket]
    /// Moves with every change to what was read (for ETags).
    public var version: UInt64
}

extension QueueEngine {
    /// The steps a client may ask for.
    public static let historySteps: [Int64] = [60, 300, 3600]

    /// `queue`'s buckets of `step` from `since` to now.
    public func history(of queue: String, step: Int64, since: Timestamp) throws(EngineError) -> HistorySeries {
        try read { core throws(EngineError) in
            let q = try core.queue(queue)
            guard let h = q.history else { return HistorySeries(step: step, buckets: [], version: 0) }
            return HistorySeries(
                step: step, buckets: h.buckets(step: step, since: since.nanoseconds / 1_000_000_000, now: core.clock.now().nanoseconds / 1_000_000_000),
                version: h.version)
        }
    }

    /// The same summed over every queue this engine holds.
    public func historyOfAll(step: Int64, since: Timestamp) -> HistorySeries {
        (try? read { core throws(EngineError) in
            let h = core.historyTotal
            return HistorySeries(
                step: step, buckets: h.buckets(step: step, since: since.nanoseconds / 1_000_000_000, now: core.clock.now().nanoseconds / 1_000_000_000),
                version: h.version)
        }) ?? HistorySeries(step: step, buckets: [], version: 0)
    }
}
