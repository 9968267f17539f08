import QueueEngine

/// A window of stored events read for a webhook that catches up.
public struct EventWindow: Sendable {
    /// The rows that decoded, in seq order.
    public var events: [ChangeEvent]
    /// Rows read, decodable or not.
    public var rows: Int
    /// The seq of the last row read (`after` when none was).
    public var lastSeq: UInt64

    public init(events: [ChangeEvent], rows: Int, lastSeq: UInt64) {
        self.events = events; self.rows = rows; self.lastSeq = lastSeq
    }
}
