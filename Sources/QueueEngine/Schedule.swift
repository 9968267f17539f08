import Schedules

/// Schedules (API.md "Schedules"): operations created on a schedule, owned by a queue.

/// What a client sets.
public struct ScheduleSpec: Sendable {
    public enum Rule: Sendable, Equatable {
        /// A cron expression, in `timezone`.
        case cron(String)
        /// Every so many seconds from `startAt`.
        case every(Int64)

        var isCron: Bool {
            if case .cron = self { return true }
            return false
        }
    }

    public var name: String
    public var rule: Rule
    /// An IANA name (default `UTC`).
    public var timezone: String
    /// The create body of every run (no dependencies).
    public var template: OperationRequest
    public var overlap: Overlap
    public var catchup: Catchup
    /// Seconds of delay added to every run of this schedule (the same for every run).
    public var jitter: Double
    public var startAt: Timestamp?
    public var endAt: Timestamp?

    public init(
        name: String, rule: Rule, timezone: String = "UTC", template: OperationRequest, overlap: Overlap = .skip,
        catchup: Catchup = Catchup(), jitter: Double = 0, startAt: Timestamp? = nil, endAt: Timestamp? = nil
    ) {
        self.name = name; self.rule = rule; self.timezone = timezone; self.template = template; self.overlap = overlap
        self.catchup = catchup; self.jitter = jitter; self.startAt = startAt; self.endAt = endAt
    }

    /// Jitter, at most (seconds).
    public static let jitterRange: ClosedRange<Double> = 0...3600
}

/// What every run's operation carries: its schedule and nominal time.
public struct ScheduleTag: Sendable, Equatable {
    public var name: String
    public var nominalTime: Timestamp
    public init(name: String, nominalTime: Timestamp) { self.name = name; self.nominalTime = nominalTime }
}

/// A schedule as stored and as shown.
public struct ScheduleSnapshot: Sendable {
    public var queue: String
    public var spec: ScheduleSpec
    public var createdAt: Timestamp
    public var revision: UInt64
    public var isPaused: Bool
    public var pausedNote: String?
    /// The newest nominal time run, skipped or missed: none at or before it runs again (the
    /// durable cursor of "each nominal time at most once").
    public var lastNominal: Timestamp?
    /// The newest run created: its nominal time and operation.
    public var lastRun: (nominalTime: Timestamp, operation: OperationID)?
    public var runs: UInt64
    public var skipped: UInt64
    public var missed: UInt64
    /// When the next run is due (nominal time plus jitter); not stored.
    public var nextRunAt: Timestamp?

    public init(
        queue: String, spec: ScheduleSpec, createdAt: Timestamp, revision: UInt64 = 1, isPaused: Bool = false, pausedNote: String? = nil,
        lastNominal: Timestamp? = nil, lastRun: (nominalTime: Timestamp, operation: OperationID)? = nil, runs: UInt64 = 0,
        skipped: UInt64 = 0, missed: UInt64 = 0
    ) {
        self.queue = queue; self.spec = spec; self.createdAt = createdAt; self.revision = revision; self.isPaused = isPaused
        self.pausedNote = pausedNote; self.lastNominal = lastNominal; self.lastRun = lastRun; self.runs = runs; self.skipped = skipped
        self.missed = missed
    }
}

/// One previewed run (`GET …/schedules/{schedule}/next`).
public struct ScheduledRun: Sendable, Equatable {
    public var nominalTime: Timestamp
    /// Seconds east of UTC of the wall clock at that time.
    public var offset: Int32
    public var note: Occurrence.Note?
}

/// A schedule under the engine's lock.
final class ScheduleRecord: @unchecked Sendable {  // guarded by the engine lock
    /// The last run was merged into a waiting operation by the template's admission.
    var lastRunMerged = false
    let queue: String
    var spec: ScheduleSpec
    var timing: Timing
    let createdAt: Timestamp
    var revision: UInt64 = 1
    var isPaused = false
    var pausedNote: String?
    /// Seconds since 1970 of the newest nominal time decided.
    var lastNominal: Int64?
    var lastRun: (nominal: Int64, op: OperationID)?
    /// The run that waits for the previous one (`bufferOne`).
    var buffered: OperationID?
    var runs: UInt64 = 0
    var skipped: UInt64 = 0
    var missed: UInt64 = 0
    /// The next nominal time (seconds) and when it is due (ns, with jitter); nil: none.
    var nextNominal: Int64?
    var dueAt: Int64 = .max
    var jitterNanos: Int64 = 0
    /// Names its current entry in the engine's due heap.
    var dueGeneration: UInt64 = 0
    var deleted = false

    /// The most runs a clean handover creates at once for the nominal times that passed while
    /// the queue moved (`EngineCore.restoreSchedule`): the latest ones; the rest count as missed.
    /// A handover takes seconds; more than this means the queue was unheld far longer (every
    /// instance but one gone, PostgreSQL unreachable), and a flood of runs would help nobody.
    static let maxHandoverRuns = 1000

    init(queue: String, spec: ScheduleSpec, timing: Timing, createdAt: Timestamp) {
        self.queue = queue; self.spec = spec; self.timing = timing; self.createdAt = createdAt
        jitterNanos = Int64(Timing.jitterSeconds(queue: queue, name: spec.name, jitter: spec.jitter) * 1e9)
    }

    func snapshot() -> ScheduleSnapshot {
        var s = ScheduleSnapshot(
            queue: queue, spec: spec, createdAt: createdAt, revision: revision, isPaused: isPaused, pausedNote: pausedNote,
            lastNominal: lastNominal.map { Timestamp(nanoseconds: $0 &* 1_000_000_000) },
            lastRun: lastRun.map { (Timestamp(nanoseconds: $0.nominal &* 1_000_000_000), $0.op) }, runs: runs, skipped: skipped,
            missed: missed)
        if !isPaused, let n = nextNominal { s.nextRunAt = Timestamp(nanoseconds: n &* 1_000_000_000 &+ jitterNanos) }
        return s
    }

    /// The timing of `spec` (its cron parsed, its zone loaded); throws naming the field.
    static func timing(_ spec: ScheduleSpec, createdAt: Timestamp) throws(EngineError) -> Timing {
        // `every` counts from `startAt` (default: the creation time); a cron has no lower bound
        // unless given one (a backfill may reach before the schedule was made).
        let anchor = spec.startAt ?? (spec.rule.isCron ? nil : createdAt)
        let start = anchor.map { $0.nanoseconds / 1_000_000_000 } ?? -(1 << 40)
        let end = spec.endAt.map { $0.nanoseconds / 1_000_000_000 }
        switch spec.rule {
        case let .cron(text):
            let cron: Cron
            do { cron = try Cron(text) } catch { throw .invalidArgument(field: "cron", detail: error.description) }
            guard let zone = Zone.load(spec.timezone) else {
                throw .invalidArgument(
                    field: "timezone", detail: "'\(spec.timezone)' is not a time zone of this server's tz database (an IANA name such as Europe/Berlin)")
            }
            return Timing(rule: .cron(cron, zone), startAt: start, endAt: end)
        case let .every(seconds):
            guard Timing.everyRange.contains(seconds) else {
                throw .invalidArgument(field: "every", detail: "must be whole seconds from 1 to \(Timing.everyRange.upperBound)")
            }
            guard spec.timezone == "UTC" || Zone.load(spec.timezone) != nil else {
                throw .invalidArgument(field: "timezone", detail: "'\(spec.timezone)' is not a time zone of this server's tz database")
            }
            return Timing(rule: .every(seconds: seconds), startAt: start, endAt: end)
        }
    }
}

/// A histogram of how late schedule runs were created after their time, seconds.
public struct ScheduleLag: Sendable {
    public static let bounds: [Double] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60]
    /// Per bound (the last: above every bound).
    public var counts = [UInt64](repeating: 0, count: ScheduleLag.bounds.count + 1)
    public var sum: Double = 0
    public var count: UInt64 = 0

    mutating func observe(_ seconds: Double) {
        let v = seconds.isFinite ? max(0, seconds) : 0
        var i = 0
        while i < Self.bounds.count && v > Self.bounds[i] { i += 1 }
        counts[i] &+= 1
        sum += v
        count &+= 1
    }
}

/// A schedule's counts for `/metrics`.
public struct ScheduleCounts: Sendable {
    public var queue: String
    public var name: String
    public var runs: UInt64
    public var skipped: UInt64
    public var missed: UInt64
}
