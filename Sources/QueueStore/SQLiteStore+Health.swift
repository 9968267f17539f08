import Synchronization

/// Counters of the writer, for benchmarks and metrics.
public struct StoreStats: Sendable, Equatable {
    /// Transactions committed.
    public var commits: Int
    /// Records committed (store records plus idempotency entries).
    public var records: Int
    /// `append` calls.
    public var appends: Int
    /// The most records one commit carried.
    public var largestCommit: Int
    /// Commits that failed and were retried.
    public var failures: Int
    /// Seconds the writer spent inside transactions, fsync waits included.
    public var busySeconds: Double
    /// CPU seconds the writer thread used inside transactions.
    public var cpuSeconds: Double
    /// Mean records per commit: how much group commit batches.
    public var recordsPerCommit: Double { commits == 0 ? 0 : Double(records) / Double(commits) }
}

// How the writer is doing: its counters (in /metrics and the store benchmark) and its last error.
extension SQLiteStore {
    /// Writer counters: commits, records, how much each commit batched.
    public var stats: StoreStats {
        StoreStats(
            commits: writer.commits.load(ordering: .relaxed), records: writer.recordsCommitted.load(ordering: .relaxed),
            appends: writer.appends.load(ordering: .relaxed), largestCommit: writer.largestCommit.load(ordering: .relaxed),
            failures: writer.failures.load(ordering: .relaxed),
            busySeconds: Double(writer.busyNanos.load(ordering: .relaxed)) / 1e9,
            cpuSeconds: Double(writer.cpuNanos.load(ordering: .relaxed)) / 1e9)
    }

    /// The error of the last commit if it failed (the writer keeps retrying it); nil when healthy.
    public var lastError: StoreError? { writer.lastError.withLock { $0 } }
}
