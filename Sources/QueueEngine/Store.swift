import Synchronization

/// A settings snapshot of a queue, as persisted and as shown by the API.
public struct QueueSnapshot: Sendable, Equatable {
    public var name: String
    /// As configured: a positive number or -1 (the server's default).
    public var maxConcurrentOperationCount: Int
    /// The limit in force.
    public var effectiveMaxConcurrentOperationCount: Int
    public var isSuspended: Bool
    /// Unfinished operations (Foundation's `operationCount`).
    public var operationCount: Int
    public var counts: [OperationState: Int]
    /// Moves with every change of the queue's status (settings, counts), and on every restart
    /// or takeover past the stored one; stored with each commit that moves it.
    public var revision: UInt64
    public var createdAt: Timestamp
    /// The run of the engine that made this revision (`RecoveredState.generation`): with
    /// `createdAt` and `revision` it names one content for good, also across restarts (ETags).
    public var generation: UInt64
    /// Its start rate (API.md "Queue rate"); nil: none.
    public var rateLimit: RateLimit? = nil
    /// Weights of fairness keys in its round-robin (default 1).
    public var fairnessWeights: [String: Int] = [:]

    public init(
        name: String, maxConcurrentOperationCount: Int, effectiveMaxConcurrentOperationCount: Int, isSuspended: Bool,
        operationCount: Int, counts: [OperationState: Int], revision: UInt64, createdAt: Timestamp, generation: UInt64 = 0,
        rateLimit: RateLimit? = nil, fairnessWeights: [String: Int] = [:]
    ) {
        self.rateLimit = rateLimit; self.fairnessWeights = fairnessWeights
        self.name = name; self.maxConcurrentOperationCount = maxConcurrentOperationCount
        self.effectiveMaxConcurrentOperationCount = effectiveMaxConcurrentOperationCount; self.isSuspended = isSuspended
        self.operationCount = operationCount; self.counts = counts; self.revision = revision; self.createdAt = createdAt
        self.generation = generation
    }
}

/// An operation as persisted and as shown by the API.
public struct OperationSnapshot: Sendable, Equatable {
    public var id: OperationID
    public var queue: String
    public var name: String?
    public var kind: String
    public var spec: JSONValue?
    public var state: OperationState
    public var outcome: OperationOutcome?
    public var isCancelled: Bool
    public var queuePriority: QueuePriority
    public var dependencies: [OperationID]
    public var progress: OperationProgress?
    public var attempt: Int
    public var result: JSONValue?
    public var error: JSONValue?
    public var createdAt: Timestamp
    public var startedAt: Timestamp?
    public var finishedAt: Timestamp?
    public var revision: UInt64
    public var options: OperationOptions
    /// Seconds executed by the current attempt before its last pause (paused time excluded).
    public var executedSeconds: Double = 0
    /// What the kind saved for itself (`ExecutionContext.save`), e.g. an external lease.
    public var kindState: JSONValue? = nil
    /// When it was cancelled by a `cascade` (asked of it or of an operation it depends on): the
    /// operations that depended on it then are cancelled too, also those another cluster
    /// instance holds, which learn of it from this durable mark.
    public var cascadeAt: Timestamp? = nil
    /// What holds it back now (API.md `waitingOn`): set on statuses the engine answers, not
    /// stored; nil on records and on finished operations.
    public var waitingOn: [WaitReason]? = nil
    /// The schedule run it is: `{name, nominalTime}` (API.md "Schedules").
    public var schedule: ScheduleTag? = nil
    /// The admission key it was created with (stored; not part of its status).
    public var admission: AdmissionTag? = nil

    public init(
        id: OperationID, queue: String, name: String?, kind: String, spec: JSONValue?, state: OperationState,
        outcome: OperationOutcome?, isCancelled: Bool, queuePriority: QueuePriority, dependencies: [OperationID],
        progress: OperationProgress?, attempt: Int, result: JSONValue?, error: JSONValue?, createdAt: Timestamp,
        startedAt: Timestamp?, finishedAt: Timestamp?, revision: UInt64, options: OperationOptions,
        executedSeconds: Double = 0, kindState: JSONValue? = nil, cascadeAt: Timestamp? = nil, schedule: ScheduleTag? = nil,
        admission: AdmissionTag? = nil
    ) {
        self.schedule = schedule
        self.admission = admission
        self.id = id; self.queue = queue; self.name = name; self.kind = kind; self.spec = spec; self.state = state
        self.outcome = outcome; self.isCancelled = isCancelled; self.queuePriority = queuePriority
        self.dependencies = dependencies; self.progress = progress; self.attempt = attempt; self.result = result
        self.error = error; self.createdAt = createdAt; self.startedAt = startedAt; self.finishedAt = finishedAt
        self.revision = revision; self.options = options; self.executedSeconds = executedSeconds; self.kindState = kindState
        self.cascadeAt = cascadeAt
    }

    public var isReady: Bool { state == .ready }
    public var isExecuting: Bool { state == .executing }
    public var isFinished: Bool { state == .finished }
    public var isPaused: Bool { state == .paused }
}

/// The first answer to a change made with an `Idempotency-Key`, kept so that a retry after a
/// restart still gets it. It travels in the change's own records (`StoreRecord.kept`), so the
/// store commits both in one transaction (`QueueEngine.withSlot`).
public struct IdempotencyRecord: Sendable, Equatable {
    /// The key with whatever it is scoped to (method, path, client).
    public var scope: String
    /// A digest of the request body, to refuse the same key with another body.
    public var bodyHash: String
    /// The HTTP status of the first answer.
    public var status: Int
    /// Its headers, in order.
    public var headers: [(String, String)]
    /// Its body.
    public var body: [UInt8]
    /// When it was saved (for expiry).
    public var createdAt: Timestamp
    /// The queue of the change it answers (set by the engine from the change's first record,
    /// `QueueEngine.fill(_:with:)`; nil when the change wrote none): a cluster's store keeps it
    /// with the queue's partition, for whoever takes that partition. Not part of equality.
    public var queue: String? = nil

    /// Creates a record.
    public init(scope: String, bodyHash: String, status: Int, headers: [(String, String)], body: [UInt8], createdAt: Timestamp) {
        self.scope = scope; self.bodyHash = bodyHash; self.status = status
        self.headers = headers; self.body = body; self.createdAt = createdAt
    }

    /// Field by field (tuples are not `Equatable`).
    public static func == (a: IdempotencyRecord, b: IdempotencyRecord) -> Bool {
        a.scope == b.scope && a.bodyHash == b.bodyHash && a.status == b.status && a.body == b.body
            && a.createdAt == b.createdAt && a.headers.count == b.headers.count
            && zip(a.headers, b.headers).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
    }
}

/// One durable change, in the order the engine made them.
public enum StoreRecord: Sendable {
    case queue(QueueSnapshot)
    case queueDeleted(String)
    case operation(OperationSnapshot)
    case event(ChangeEvent)
    /// The kept answer to the change before it (`QueueEngine.fill(_:with:)`).
    case kept(IdempotencyRecord)
    /// The part (a store's partition) of batch `batch` across instances is added: its elements'
    /// records are in the same change (`QueueEngine.applyBatchPart`), and the store forgets the
    /// part in the same commit.
    case batchPartAdded(batch: String, part: Int)
    /// A limiter was created or its settings changed.
    case limiter(LimiterSnapshot)
    case limiterDeleted(String)
    /// A host's breaker changed (API.md "Hosts"); hosts are global, like limiters.
    case host(HostSnapshot)
    /// A schedule was created or changed, or fired (its cursor moved): in the commit of its runs.
    case schedule(ScheduleSnapshot)
    case scheduleDeleted(queue: String, name: String)
    /// A queue's history bucket changed (API.md "History"): written on a timer, in whatever
    /// commit comes next.
    case history(HistoryRow)

    /// The queue the record belongs to; nil for a kept answer or a batch part.
    public var queueName: String? {
        switch self {
        case let .queue(q): return q.name
        case let .queueDeleted(name): return name
        case let .operation(s): return s.queue
        case let .event(e): return e.key == .breaker ? nil : e.queue
        case .kept, .batchPartAdded, .limiter, .limiterDeleted, .host: return nil
        case let .schedule(s): return s.queue
        case let .scheduleDeleted(queue, _): return queue
        case let .history(row): return row.queue
        }
    }
}

/// Where acknowledged changes are made durable. The engine hands over records in order
/// (never under its lock) and asks to be told when a ticket is durable, so the API layer
/// answers a request only after its change survives a crash. Batching is the store's call.
public protocol OperationStore: Sendable {
    /// False for stores that keep nothing (the in-memory one): the engine then skips
    /// building records altogether.
    var wantsRecords: Bool { get }
    /// Records made by changes up to and including `ticket`, in order.
    func append(_ records: [StoreRecord], upTo ticket: UInt64)
    /// Calls `done` (possibly at once, on any thread) when everything up to `ticket` is durable.
    func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void)
}

/// Keeps nothing: everything is "durable" at once, and nothing survives a restart.
public final class InMemoryStore: OperationStore {
    private let appended = Atomic<UInt64>(0)
    public init() {}
    public var wantsRecords: Bool { false }
    public func append(_ records: [StoreRecord], upTo ticket: UInt64) {
        appended.store(ticket, ordering: .relaxed)
    }
    public func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) { done() }
}

/// What a store read back at start: the engine is rebuilt from it by `QueueEngine.restore`.
public struct RecoveredState: Sendable {
    public var queues: [QueueSnapshot]
    /// Every kept operation, any order.
    public var operations: [OperationSnapshot]
    /// The newest event's seq; the next change gets `lastSeq + 1`.
    public var lastSeq: UInt64
    /// Operations that were executing during too many unclean stops in a row: they finish
    /// `failed` with `crashed-server` instead of running again (API.md "Crashes").
    public var poisoned: Set<OperationID> = []
    /// This run's generation: a number made durable before anything is served, larger than
    /// every earlier run's (the service counts its starts in the store's meta). Queue statuses
    /// carry it (`QueueSnapshot.generation`); 0 when nobody counts (tests, memory).
    public var generation: UInt64 = 0
    /// Every limiter (restored before the operations that name them).
    public var limiters: [LimiterSnapshot] = []
    /// Every stored host (restored before the operations that send to them).
    public var hosts: [HostSnapshot] = []
    /// Every stored schedule (restored after the operations: a schedule's last run is one).
    public var schedules: [ScheduleSnapshot] = []
    /// The queues' history buckets (API.md "History").
    public var history: [HistoryRow] = []
    public init(
        queues: [QueueSnapshot] = [], operations: [OperationSnapshot] = [], lastSeq: UInt64 = 0, limiters: [LimiterSnapshot] = [],
        hosts: [HostSnapshot] = []
    ) {
        self.queues = queues; self.operations = operations; self.lastSeq = lastSeq; self.limiters = limiters; self.hosts = hosts
    }
}
