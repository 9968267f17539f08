import QueueEngine
import StoreKit

// Reading back: recovery at start and the feed's history, on the read connection.
extension SQLiteStore {
    /// Everything needed to rebuild the engine at start: queues (with counts computed from
    /// their operations), all kept operations and the newest event seq ever written (deleting
    /// events never moves it back). Call it before appending.
    public func load() throws(StoreError) -> RecoveredState {
        let path = self.path
        let lastSeq = writer.lastSeq.load(ordering: .relaxed)
        return try reader.withLock { r throws(StoreError) in
            do { return try r.load(lastSeq: lastSeq) } catch let e as DecodeFailure {
                throw StoreError(.corrupt, path: path, detail: e.detail)
            } catch let e as SQLiteFailure {
                throw Self.storeError(e, path, default: .io)
            } catch {
                throw StoreError(.io, path: path, detail: "\(error)")
            }
        }
    }

    /// The newest `limit` events, oldest first: refills the in-memory change feed at start.
    public func recentEvents(limit: Int) -> [ChangeEvent] {
        guard limit > 0 else { return [] }
        return (try? reader.withLock { r throws(SQLiteFailure) in try r.recentEvents(limit: limit) }) ?? []
    }

    /// Kept events of one operation with seq > `after`, oldest first, at most `limit`.
    public func events(of id: OperationID, after: UInt64 = 0, limit: Int = .max) -> [ChangeEvent] {
        history(of: id, after: after, limit: limit) ?? []
    }

    /// As `events(of:)`, but nil when the read failed (not an empty history), as the PostgreSQL
    /// store answers: `GET /v1/operations/{id}/events` is then 503 on both, not 200 and empty.
    public func history(of id: OperationID, after: UInt64, limit: Int) -> [ChangeEvent]? {
        try? reader.withLock { r throws(SQLiteFailure) in try r.events(of: id, after: after, limit: limit) }
    }

    /// Kept events of one queue, or of one operation, with `after` < seq <= `through`, oldest
    /// first, reading at most `limit` rows; nil when the read failed (unlike the feed's readers,
    /// a webhook catching up must not take a failed read for an empty one).
    public func eventWindow(queue: String?, operation: OperationID?, after: UInt64, through: UInt64, limit: Int) -> EventWindow? {
        guard through > after, limit > 0 else { return EventWindow(events: [], rows: 0, lastSeq: after) }
        return try? reader.withLock { r throws(SQLiteFailure) in
            try r.eventWindow(queue: queue, operation: operation, after: after, through: through, limit: limit)
        }
    }

    /// The seq of the oldest kept event; one past the newest when none is kept. Clients that
    /// resume a feed from before it have missed events.
    public var oldestEventSeq: UInt64 {
        let next = writer.lastSeq.load(ordering: .relaxed) + 1
        return (try? reader.withLock { r throws(SQLiteFailure) in try r.oldestSeq() }) ?? next
    }
}
