/// A queue's history (API.md "Dashboard", **History**): counts and wait/run sketches per time
/// bucket, in two rings of fixed size per queue: 1,440 one-minute buckets (24 hours) and 720
/// one-hour buckets (30 days). A bucket is made when something happens in it, so an idle
/// queue costs nothing and a busy one at most both rings.

/// A fixed log-scaled histogram of durations: bin 0 holds [0, 1 ms), bin i (1...25) holds
/// [2^(i-1), 2^i) ms, the last also everything longer (about 4.7 hours and up). Percentiles are
/// read by interpolating inside a bin on a log scale: within a factor of 2 of the true value,
/// usually much closer.
public struct DurationSketch: Sendable, Equatable {
    public static let bins = 26
    /// Empty until the first sample.
    public private(set) var counts: [UInt32] = []

    public init() {}

    public var total: UInt64 { counts.reduce(0) { $0 &+ UInt64($1) } }
    public var isEmpty: Bool { counts.isEmpty }

    static func bin(nanoseconds ns: Int64) -> Int {
        let ms = ns / 1_000_000
        guard ms > 0 else { return 0 }
        // 1 + floor(log2(ms)): bit width of ms.
        return min(bins - 1, 64 - ms.leadingZeroBitCount)
    }

    public mutating func add(nanoseconds ns: Int64) {
        if counts.isEmpty { counts = [UInt32](repeating: 0, count: Self.bins) }
        let b = Self.bin(nanoseconds: max(0, ns))
        counts[b] = counts[b] == .max ? .max : counts[b] + 1
    }

    public mutating func add(_ other: DurationSketch) {
        guard !other.counts.isEmpty else { return }
        if counts.isEmpty { counts = [UInt32](repeating: 0, count: Self.bins) }
        for i in 0..<Self.bins {
            let (sum, over) = counts[i].addingReportingOverflow(other.counts[i])
            counts[i] = over ? .max : sum
        }
    }

    /// Takes `other`'s samples out again (a queue that leaves a sum).
    public mutating func subtract(_ other: DurationSketch) {
        guard !other.counts.isEmpty, !counts.isEmpty else { return }
        for i in 0..<Self.bins { counts[i] = counts[i] > other.counts[i] ? counts[i] - other.counts[i] : 0 }
        if counts.allSatisfy({ $0 == 0 }) { counts = [] }
    }

    /// Sets one bin (a stored sketch read back).
    public mutating func set(bin: Int, _ n: UInt32) {
        guard (0..<Self.bins).contains(bin) else { return }
        if counts.isEmpty { counts = [UInt32](repeating: 0, count: Self.bins) }
        counts[bin] = n
    }

    /// The `q` quantile in seconds; nil when empty.
    public func quantile(_ q: Double) -> Double? {
        let n = total
        guard n > 0 else { return nil }
        // The rank of the quantile, 1-based.
        let rank = max(1, min(Double(n), (q * Double(n)).rounded(.up)))
        var seen = 0.0
        for (i, c) in counts.enumerated() where c > 0 {
            let here = Double(c)
            if seen + here >= rank {
                let (lo, hi) = Self.edges(i)
                // The middle of the rank's share of the bin (samples spread evenly inside it).
                let f = max(0, min(1, (rank - seen - 0.5) / here))
                if lo == 0 { return hi * f / 1000 }
                // Geometric interpolation inside [lo, hi).
                return lo * pow2(f * log2(hi / lo)) / 1000
            }
            seen += here
        }
        return Self.edges(Self.bins - 1).1 / 1000
    }

    /// Bin i's bounds in milliseconds.
    static func edges(_ i: Int) -> (Double, Double) {
        if i == 0 { return (0, 1) }
        let lo = Double(UInt64(1) << UInt64(i - 1))
        return (lo, lo * 2)
    }
}

@inline(__always) private func log2(_ x: Double) -> Double {
    // x is a power of two here (a bin's hi / lo).
    var r = 0.0
    var v = x
    while v >= 2 { v /= 2; r += 1 }
    return r
}

@inline(__always) private func pow2(_ e: Double) -> Double {
    // 2^e for 0 ≤ e ≤ 1 (a fraction of one doubling): exp(e · ln 2), by its series.
    let x = e * 0.693_147_180_559_945_3
    var term = 1.0
    var sum = 1.0
    for k in 1...12 {
        term *= x / Double(k)
        sum += term
    }
    return sum
}

/// One time bucket of a queue.
public struct HistoryBucket: Sendable, Equatable {
    /// Seconds since the epoch; a multiple of the bucket's step.
    public var start: Int64
    public var created: UInt64 = 0
    /// Attempts begun (a retry is a start too).
    public var started: UInt64 = 0
    public var succeeded: UInt64 = 0
    public var failed: UInt64 = 0
    public var cancelled: UInt64 = 0
    /// Ready to executing.
    public var wait = DurationSketch()
    /// Executing (its first start) to finished.
    public var run = DurationSketch()

    public init(start: Int64) { self.start = start }

    public var isEmpty: Bool { created == 0 && started == 0 && succeeded == 0 && failed == 0 && cancelled == 0 && wait.isEmpty && run.isEmpty }

    public mutating func add(_ b: HistoryBucket) {
        created &+= b.created; started &+= b.started; succeeded &+= b.succeeded; failed &+= b.failed; cancelled &+= b.cancelled
        wait.add(b.wait)
        run.add(b.run)
    }

    mutating func change(_ body: (inout HistoryBucket) -> Void) { body(&self) }

    public mutating func subtract(_ b: HistoryBucket) {
        func minus(_ x: UInt64, _ y: UInt64) -> UInt64 { x > y ? x - y : 0 }
        created = minus(created, b.created); started = minus(started, b.started); succeeded = minus(succeeded, b.succeeded)
        failed = minus(failed, b.failed); cancelled = minus(cancelled, b.cancelled)
        wait.subtract(b.wait)
        run.subtract(b.run)
    }
}

/// A bucket as the stores keep it: its queue, its ring (step) and its place in the ring. A
/// ring's slot is reused when time comes round, so a queue's rows are bounded by the rings.
public struct HistoryRow: Sendable, Equatable {
    public var queue: String
    public var step: Int64
    public var bucket: HistoryBucket
    public init(queue: String, step: Int64, bucket: HistoryBucket) { self.queue = queue; self.step = step; self.bucket = bucket }

    public var slot: Int64 { HistoryRing.slot(of: bucket.start, step: step) }
}

/// The steps the rings keep and how many buckets each holds.
public enum HistoryRing {
    public static let minute: Int64 = 60
    public static let hour: Int64 = 3600
    public static let minuteBuckets: Int64 = 1440
    public static let hourBuckets: Int64 = 720

    public static func size(_ step: Int64) -> Int64 { step == hour ? hourBuckets : minuteBuckets }

    public static func slot(of start: Int64, step: Int64) -> Int64 {
        let i = start / step
        let n = size(step)
        return ((i % n) + n) % n
    }
}

/// One ring: a bucket per slot, and each slot's start kept apart, so that finding a bucket
/// never copies one (a bucket's sketches are arrays: a copy retains them) and a change is made
/// in place.
struct HistoryRingBuffer {
    let step: Int64
    let size: Int64
    /// `Int64.min`: empty.
    private(set) var starts: [Int64] = []
    private(set) var buckets: [HistoryBucket?] = []

    init(step: Int64) {
        self.step = step
        self.size = HistoryRing.size(step)
    }

    /// Its slots, on first use: a queue that never records anything keeps none.
    private mutating func allocate() {
        guard starts.isEmpty else { return }
        starts = [Int64](repeating: .min, count: Int(size))
        buckets = [HistoryBucket?](repeating: nil, count: Int(size))
    }

    @inline(__always) func slot(_ start: Int64) -> Int { Int(HistoryRing.slot(of: start, step: step)) }

    /// The bucket of `start`, made (or its slot's older one replaced); `body` changes it. A time
    /// older than what its slot holds (a clock that stepped back past a day) changes nothing.
    @inline(__always) mutating func change(start: Int64, _ body: (inout HistoryBucket) -> Void) {
        allocate()
        let s = slot(start)
        let old = starts[s]
        if old != start {
            if old > start { return }
            starts[s] = start
            buckets[s] = HistoryBucket(start: start)
        }
        buckets[s]?.change(body)
    }

    /// `change`, only where the bucket of `start` exists.
    mutating func changeIfPresent(start: Int64, _ body: (inout HistoryBucket) -> Void) {
        guard !starts.isEmpty else { return }
        let s = slot(start)
        guard starts[s] == start else { return }
        buckets[s]?.change(body)
    }

    func bucket(_ start: Int64) -> HistoryBucket? {
        guard !starts.isEmpty else { return nil }
        let s = slot(start)
        return starts[s] == start ? buckets[s] : nil
    }

    /// A stored bucket back, unless its slot holds a newer one.
    mutating func restore(_ b: HistoryBucket) {
        allocate()
        let s = slot(b.start)
        guard starts[s] < b.start else { return }
        starts[s] = b.start
        buckets[s] = b
    }

    var all: [HistoryBucket] { buckets.compactMap { $0 } }
}

/// A queue's two rings (under the engine's lock).
final class QueueHistory: @unchecked Sendable {
    var minutes = HistoryRingBuffer(step: HistoryRing.minute)
    var hours = HistoryRingBuffer(step: HistoryRing.hour)
    /// Moves with every change (the history's ETag).
    var version: UInt64 = 0
    /// Buckets changed since the last flush to the store, by start.
    var dirty: Set<Int64> = []
    var dirtyHours: Set<Int64> = []
    /// False for the engine's sum over its queues, which is never written (it is rebuilt).
    var tracksDirty = true

    /// Changes of the minute `pendingStart` not yet in the rings: a change adds to it alone, and
    /// it goes into both rings (and is marked for the store) when another minute begins or the
    /// rings are read or written (`settle`). Most changes cost a comparison and the change.
    private var pending = HistoryBucket(start: 0)
    private var pendingStart: Int64 = .min

    /// Whether anything is waiting to be written.
    var needsFlush: Bool { !dirty.isEmpty || pendingStart != .min }

    /// The bucket of `t` (seconds); `body` changes it.
    @inline(__always) func change(at t: Int64, _ body: (inout HistoryBucket) -> Void) {
        version &+= 1
        let m = t - ((t % HistoryRing.minute) + HistoryRing.minute) % HistoryRing.minute
        if m != pendingStart {
            settle()
            pendingStart = m
            pending.start = m
        }
        body(&pending)
    }

    /// The pending minute into both rings.
    func settle() {
        guard pendingStart != .min else { return }
        let m = pendingStart
        pendingStart = .min
        let d = pending
        pending = HistoryBucket(start: 0)
        guard !d.isEmpty else { return }
        let h = m - ((m % HistoryRing.hour) + HistoryRing.hour) % HistoryRing.hour
        minutes.change(start: m) { $0.add(d) }
        hours.change(start: h) { $0.add(d) }
        guard tracksDirty else { return }
        dirty.insert(m)
        dirtyHours.insert(h)
    }

    /// A stored bucket back (a restart, a queue taken over): kept unless its slot holds a newer one.
    func restore(_ row: HistoryRow) {
        settle()
        let step = row.step
        guard step == HistoryRing.minute || step == HistoryRing.hour, row.bucket.start % step == 0 else { return }
        if step == HistoryRing.minute { minutes.restore(row.bucket) } else { hours.restore(row.bucket) }
        version &+= 1
    }

    /// Adds (or, `negative`, takes out) every bucket of `other` whose slot here holds the same
    /// time or nothing: the engine's sum over its queues (`EngineCore.historyTotal`).
    func merge(_ other: QueueHistory, negative: Bool = false) {
        version &+= 1
        settle()
        other.settle()
        for b in other.minutes.all {
            if negative { minutes.changeIfPresent(start: b.start) { $0.subtract(b) } } else { minutes.change(start: b.start) { $0.add(b) } }
        }
        for b in other.hours.all {
            if negative { hours.changeIfPresent(start: b.start) { $0.subtract(b) } } else { hours.change(start: b.start) { $0.add(b) } }
        }
    }

    /// The buckets changed since the last call, as rows (and forgets they changed).
    func takeDirty(queue: String) -> [HistoryRow] {
        settle()
        var rows: [HistoryRow] = []
        for m in dirty {
            if let b = minutes.bucket(m) { rows.append(HistoryRow(queue: queue, step: HistoryRing.minute, bucket: b)) }
        }
        for h in dirtyHours {
            if let b = hours.bucket(h) { rows.append(HistoryRow(queue: queue, step: HistoryRing.hour, bucket: b)) }
        }
        dirty.removeAll(keepingCapacity: true)
        dirtyHours.removeAll(keepingCapacity: true)
        return rows
    }

    /// Buckets of `step` (60, 300 or 3600) from `since` up to `now` (seconds), oldest first,
    /// empty ones left out. 300 sums five minutes.
    func buckets(step: Int64, since: Int64, now: Int64) -> [HistoryBucket] {
        settle()
        let ring = step == HistoryRing.hour ? hours : minutes
        let span = ring.step * ring.size
        // Only what the ring still holds: no older than its length before now.
        let from = max(since, now - span)
        var found = ring.all.filter { $0.start + ring.step > from && $0.start <= now && !$0.isEmpty }
        found.sort { $0.start < $1.start }
        guard step == 300 else { return found }
        var out: [HistoryBucket] = []
        for b in found {
            let start = b.start - ((b.start % 300) + 300) % 300
            if out.last?.start == start {
                out[out.count - 1].add(b)
            } else {
                var n = HistoryBucket(start: start)
                n.add(b)
                out.append(n)
            }
        }
        return out
    }
}
