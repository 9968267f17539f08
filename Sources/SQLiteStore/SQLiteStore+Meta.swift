import QueueEngine

// Small durable settings of the layers above, in the `meta` table.
extension SQLiteStore {
    /// Sets (nil: deletes) `meta` rows in the next group commit; `done` runs once committed,
    /// never if the store is closing (then the result is false).
    @discardableResult
    public func setMeta(_ pairs: [(key: String, value: String?)], then done: (@Sendable () -> Void)? = nil) -> Bool {
        writer.submit(.meta(pairs, done: done))
    }

    /// Deletes every `meta` row whose key starts with `prefix`, in the next group commit.
    @discardableResult
    public func deleteMeta(prefix: String, then done: (@Sendable () -> Void)? = nil) -> Bool {
        writer.submit(.deleteMetaPrefix(prefix, done: done))
    }

    /// The `meta` rows whose key starts with `prefix`, ordered by key (text values only).
    public func meta(prefix: String) -> [(key: String, value: String)] {
        (try? reader.withLock { r throws(SQLiteFailure) in try r.meta(prefix: prefix) }) ?? []
    }
}
