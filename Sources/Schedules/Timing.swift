/// When a schedule's runs are due (API.md "Schedules"): `cron` in a `timezone`, or `every`
/// seconds from `startAt`; none before `startAt` or after `endAt`. Times are seconds since 1970
/// UTC; the nominal time of a run is its time before jitter.
public struct Timing: Sendable {
    public enum Rule: Sendable {
        case cron(Cron, Zone)
        case every(seconds: Int64)
    }

    public var rule: Rule
    /// No run before it; `every` counts from it (the creation time when not given).
    public var startAt: Int64
    public var endAt: Int64?

    public init(rule: Rule, startAt: Int64, endAt: Int64?) {
        self.rule = rule; self.startAt = startAt; self.endAt = endAt
    }

    /// Seconds of `every`, at least.
    public static let everyRange: ClosedRange<Int64> = 1...(100 * 365 * 86_400)

    /// The first `count` nominal times strictly after `after`, with their wall clock and note
    /// (cron) — fewer when the schedule ends.
    public func next(after: Int64, count: Int) -> [Occurrence] {
        guard count > 0 else { return [] }
        var out: [Occurrence] = []
        switch rule {
        case let .cron(cron, zone):
            // Not before `startAt`: from just before it.
            let from = max(after, startAt &- 1)
            out = Occurrences.next(cron, in: zone, after: from, count: count)
        case let .every(seconds):
            out = Occurrences.every(seconds, from: startAt, after: after, count: count).map {
                Occurrence(utc: $0, local: $0, offset: 0, note: nil)
            }
        }
        if let endAt { out = out.filter { $0.utc <= endAt } }
        return out
    }

    /// The nominal times in `(after, upTo]`: how many (`complete` false when counting stopped
    /// at `cap`), and the newest `keep` of them, oldest first.
    public func scan(after: Int64, upTo: Int64, keep: Int, cap: Int = 2_000_000) -> (newest: [Int64], total: Int, complete: Bool) {
        guard upTo > after else { return ([], 0, true) }
        var lo = max(after, startAt &- 1)
        var hi = upTo
        if let endAt { hi = min(hi, endAt) }
        guard hi > lo else { return ([], 0, true) }
        if case let .every(seconds) = rule {
            // k ≥ 1 with lo < startAt + k·seconds ≤ hi.
            let first = max(1, (lo - startAt) / seconds + 1)
            let last = (hi - startAt) / seconds
            guard last >= first else { return ([], 0, true) }
            let total = last - first + 1
            let newest = Swift.max(first, last - Int64(keep) + 1)
            return (Swift.stride(from: newest, through: last, by: 1).map { startAt + $0 * seconds }, Int(clamping: total), true)
        }
        var ring: [Int64] = []
        var total = 0
        while total < cap {
            let batch = next(after: lo, count: 256)
            let due = batch.filter { $0.utc <= hi }
            for o in due {
                total += 1
                if keep > 0 {
                    ring.append(o.utc)
                    if ring.count > 2 * keep + 256 { ring.removeFirst(ring.count - keep) }
                }
            }
            guard due.count == batch.count, let last = batch.last else { return (Array(ring.suffix(keep)), total, true) }
            lo = last.utc
        }
        return (Array(ring.suffix(keep)), total, false)
    }

    /// A schedule's jitter: the same delay for every run of one schedule, from 0 to `jitter`
    /// seconds, drawn from its queue and name (FNV-1a), so a restart or another instance fires
    /// it at the same moment.
    public static func jitterSeconds(queue: String, name: String, jitter: Double) -> Double {
        guard jitter > 0, jitter.isFinite else { return 0 }
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in queue.utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        h = (h ^ 0) &* 0x100_0000_01b3
        for b in name.utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        return Double(h >> 11) / Double(1 << 53) * jitter
    }
}

/// What happens to nominal times that passed while the server was stopped (API.md `catchup`).
public struct Catchup: Sendable, Equatable {
    public enum Policy: String, Sendable, CaseIterable { case skip, latest, all }
    public var policy: Policy
    /// Seconds back from now a missed time may be (default 86,400).
    public var window: Int64
    /// With `all`: at most this many, the latest (default 100).
    public var maxRuns: Int

    public init(policy: Policy = .latest, window: Int64 = 86_400, maxRuns: Int = 100) {
        self.policy = policy; self.window = window; self.maxRuns = maxRuns
    }

    public static let windowRange: ClosedRange<Int64> = 1...(366 * 86_400)
    public static let maxRunsRange: ClosedRange<Int> = 1...1000

    /// The missed nominal times to run now, oldest first, and how many get no run (`missed`),
    /// of the nominal times in `(last, now]` (`last`: the newest already run or decided).
    /// `exact` is false when there were too many to count (a fine-grained rule stopped for long).
    public func plan(_ timing: Timing, last: Int64, now: Int64) -> (run: [Int64], missed: Int, exact: Bool) {
        let windowStart = max(last, now &- window)
        let old = timing.scan(after: last, upTo: windowStart, keep: 0, cap: 1_000_000)
        let keep = policy == .all ? maxRuns : policy == .latest ? 1 : 0
        let recent = timing.scan(after: windowStart, upTo: now, keep: keep)
        let run = policy == .skip ? [] : recent.newest
        return (run, old.total + recent.total - run.count, old.complete && recent.complete)
    }
}

/// What a run does when the previous one is unfinished at its nominal time (API.md `overlap`).
public enum Overlap: String, Sendable, CaseIterable {
    case allow, skip, bufferOne, bufferAll, cancelPrevious

    /// The decision for a new run: create it (depending on the previous run when `after`), skip
    /// it, or cancel the previous one first.
    public enum Decision: Equatable, Sendable {
        case create
        case createAfterPrevious
        case skip
        case cancelPreviousThenCreate
    }

    /// `previousUnfinished`: the newest run is unfinished; `oneWaiting`: with `bufferOne`, a run
    /// already waits for it.
    public func decide(previousUnfinished: Bool, oneWaiting: Bool) -> Decision {
        guard previousUnfinished else { return .create }
        switch self {
        case .allow: return .create
        case .skip: return .skip
        case .bufferOne: return oneWaiting ? .skip : .createAfterPrevious
        case .bufferAll: return .createAfterPrevious
        case .cancelPrevious: return .cancelPreviousThenCreate
        }
    }
}
