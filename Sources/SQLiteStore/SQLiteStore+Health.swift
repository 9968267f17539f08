import StoreKit
import Synchronization

// How the writer is doing: its counters (in /metrics and the store benchmark) and its last error.
extension SQLiteStore {
    /// Writer counters: commits, records, how much each commit batched.
    public var stats: StoreStats { writer.counters.stats }

    /// The error of the last commit if it failed (the writer keeps retrying it); nil when healthy.
    public var lastError: StoreError? { writer.lastError.withLock { $0 } }
}
