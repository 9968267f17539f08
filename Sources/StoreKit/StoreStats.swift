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
    /// How long each commit took (wall clock, fsync included), in seconds.
    public var commitSeconds = StoreHistogram(bounds: StoreHistogram.secondsBounds)
    /// Records each commit carried: how much group commit batches.
    public var commitRecords = StoreHistogram(bounds: StoreHistogram.recordsBounds)
    /// Mean records per commit: how much group commit batches.
    public var recordsPerCommit: Double { commits == 0 ? 0 : Double(records) / Double(commits) }

    public init(
        commits: Int, records: Int, appends: Int, largestCommit: Int, failures: Int, busySeconds: Double, cpuSeconds: Double,
        commitSeconds: StoreHistogram, commitRecords: StoreHistogram
    ) {
        self.commits = commits; self.records = records; self.appends = appends; self.largestCommit = largestCommit
        self.failures = failures; self.busySeconds = busySeconds; self.cpuSeconds = cpuSeconds
        self.commitSeconds = commitSeconds; self.commitRecords = commitRecords
    }
}

/// A fixed-bucket histogram of the writer's commits (Prometheus-style: `counts[i]` observations
/// were at most `bounds[i]` and above the bound before; the last count is above every bound).
public struct StoreHistogram: Sendable, Equatable {
    /// Commit latency buckets: 100 µs (no fsync) to 2.5 s (a stalled disk).
    public static let secondsBounds: [Double] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5]
    /// Records per commit: 1 (one request alone) to 10,000 (a batch create under load).
    public static let recordsBounds: [Double] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
    /// Upper bounds, ascending.
    public let bounds: [Double]
    /// Observations per bucket (not cumulative); one more than `bounds`.
    public private(set) var counts: [UInt64]
    /// Sum of the observed values.
    public private(set) var sum: Double = 0
    /// Number of observations.
    public private(set) var count: UInt64 = 0

    /// An empty histogram over `bounds`.
    public init(bounds: [Double]) {
        self.bounds = bounds
        counts = [UInt64](repeating: 0, count: bounds.count + 1)
    }

    /// Counts one observation.
    public mutating func observe(_ value: Double) {
        var i = 0
        while i < bounds.count && value > bounds[i] { i += 1 }
        counts[i] &+= 1
        sum += value
        count &+= 1
    }
}
