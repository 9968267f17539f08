import QueueEngine
import StoreKit

// Purging finished operations and their events after `--retain`.
extension SQLiteStore {
    /// Deletes up to `limit` operations that finished before `cutoff`, with their events,
    /// oldest first. It runs on the writer thread in chunks of at most 500 operations, each
    /// part of a group commit, so creates keep flowing meanwhile. Blocks until done; returns
    /// how many were deleted. Returns 0 when called from a durability callback (the writer
    /// thread cannot wait for itself) or after `close`.
    @discardableResult
    public func purge(finishedBefore cutoff: Timestamp, limit: Int) -> Int {
        guard !writer.isWriterThread else { return 0 }
        return writer.queue.purge(finishedBefore: cutoff, limit: limit)
    }
}
