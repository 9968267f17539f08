import QueueEngine
import StoreKit

// The first answers to `Idempotency-Key` requests, kept across restarts.
extension SQLiteStore {
    /// Every saved answer, oldest first, for the API's cache at start. Unreadable rows are skipped.
    public func loadIdempotency() -> [IdempotencyRecord] {
        (try? reader.withLock { r throws(SQLiteFailure) in try r.idempotency() }) ?? []
    }

    /// Deletes answers saved before `cutoff`, through the writer. Returns how many.
    @discardableResult
    public func purgeIdempotency(before cutoff: Timestamp) -> Int {
        guard !writer.isWriterThread else { return 0 }
        return writer.queue.purgeIdempotency(before: cutoff)
    }
}
