/// The engine's own mutable records. They live only under the engine's lock.
final class OpRecord: @unchecked Sendable {  // guarded by the engine lock
    let id: UInt64
    let queue: QueueRecord
    let name: String?
    let kindName: String
    let kind: any OperationKind
    /// Replaced only by an admission's merge (`EngineCore.absorb`), before it starts.
    var spec: JSONValue?
    var options: OperationOptions
    let createdAt: Timestamp
    let isBarrier: Bool
    var priority: QueuePriority
    /// Set when the record is made (added or restored); changed only by ``take(_:dependenciesMet:)``.
    private(set) var state: OperationState
    var outcome: OperationOutcome?
    var isCancelled = false
    /// Declared dependencies, for display (kept after they finish).
    var dependencyIDs: [OperationID]
    /// Operations waiting for this one; released when it finishes.
    var dependents: [OpRecord] = []
    /// Unfinished dependencies this engine does not hold (their queue is owned by another
    /// cluster instance), counted in `unfinishedDependencies` like local ones.
    var remoteWaits: [UInt64] = []
    var unfinishedDependencies = 0
    /// The key of its live entry in the queue's ready heap; 0 when none.
    var heapKey: UInt64 = 0
    var startedAt: Timestamp?
    var finishedAt: Timestamp?
    var attempt = 0
    var result: JSONValue?
    var error: JSONValue?
    var progress: OperationProgress?
    var revision: UInt64 = 1
    var runToken: UInt32 = 0
    /// A completion that arrived while the operation was paused mid-run.
    var parkedCompletion: Completion?
    /// Paused while executing: the next start is a resume.
    var resumeOnStart = false
    var executedNanos: Int64 = 0
    var runStartedAt: Int64 = 0
    /// Waiting for `notBefore`.
    var waitingForTime = false
    var kindState: JSONValue?
    /// Waiting out a retry backoff: executing, but no run is active.
    var inBackoff = false
    /// The barrier this operation was made to wait for when it was added.
    var implicitBarrier: UInt64?
    /// When a cascade cancelled it (`OperationSnapshot.cascadeAt`).
    var cascadeAt: Timestamp?
    /// The limiter keys it names (`options.limits`, resolved; `EngineCore.attachFlow`).
    var limitKeys: [LimiterKey] = []
    /// Ready but parked on this key or host, which had no room (`EngineCore.schedule`).
    var parkedOn: ParkingLot?
    /// The host its kind sends to (`OperationKind.host(spec:)`), when tracked (`EngineCore.attachHost`).
    var host: HostRecord?
    /// Answers asking to slow down in a row for this operation (API.md "Hosts").
    var throttles: UInt8 = 0
    /// The schedule run it is (API.md "Schedules"), boxed: most operations have none.
    var scheduleTag: ScheduleTagBox?
    /// The admission key it was created with (API.md "Admission"), boxed: most have none.
    var admission: AdmissionTagBox?
    var parkKey: UInt64 = 0
    /// When its next attempt is due, while `inBackoff`.
    var backoffUntil: Timestamp?
    /// When it last became ready (ns; its wait in the queue's history).
    var readySince: Int64 = 0
    /// Its coming start was held back by a rate (counted once per start, `FlowCounters`).
    var rateDelayed = false

    init(
        id: UInt64, queue: QueueRecord, request: OperationRequest, kind: any OperationKind, createdAt: Timestamp, isBarrier: Bool,
        state: OperationState = .pending
    ) {
        self.id = id
        self.queue = queue
        self.name = request.name
        self.kindName = request.kind
        self.kind = kind
        self.spec = request.spec
        self.options = request.options
        self.createdAt = createdAt
        self.isBarrier = isBarrier
        self.priority = request.queuePriority
        self.state = state
        self.dependencyIDs = request.dependencies
    }

    /// The one writer of `state` (its setter is private to this record): the move the
    /// transition table gives for `action`, or the table's refusal with nothing changed.
    /// `EngineCore.apply` is the one caller and acts on the move.
    func take(_ action: OperationAction, dependenciesMet: Bool) throws(EngineError) -> (from: OperationState, effect: TransitionEffect) {
        let from = state
        let (to, effect) = try from.applying(action, dependenciesMet: dependenciesMet)
        state = to
        return (from, effect)
    }

    var operationID: OperationID { OperationID(raw: id) }
    var hasStarted: Bool { startedAt != nil }

    func snapshot() -> OperationSnapshot {
        OperationSnapshot(
            id: operationID, queue: queue.name, name: name, kind: kindName, spec: spec, state: state, outcome: outcome,
            isCancelled: isCancelled, queuePriority: priority, dependencies: dependencyIDs, progress: progress,
            attempt: attempt, result: result, error: error, createdAt: createdAt, startedAt: startedAt,
            finishedAt: finishedAt, revision: revision, options: options, executedSeconds: Double(executedNanos) / 1e9, kindState: kindState,
            cascadeAt: cascadeAt, schedule: scheduleTag?.tag, admission: admission?.tag)
    }

    /// Bit set of the boolean keys, in the order they are reported.
    var flags: UInt8 {
        var f: UInt8 = isCancelled ? 1 : 0
        switch state {
        case .paused: f |= 2
        case .ready: f |= 4
        case .executing: f |= 8
        case .finished: f |= 16
        case .pending: break
        }
        return f
    }
}

final class QueueRecord: @unchecked Sendable {  // guarded by the engine lock
    let name: String
    let createdAt: Timestamp
    var maxConcurrent: Int
    var isSuspended: Bool
    var executing = 0
    /// Ready operations: a min-heap of keys (priority rank in the top bits, then the id, so
    /// ties go in the order operations were added). Entries go stale instead of being removed.
    var heap: [UInt64] = []
    /// Every operation not yet purged, in creation order.
    var ops: [OpRecord] = []
    var counts: [Int] = [0, 0, 0, 0, 0]
    var unfinished = 0
    var revision: UInt64 = 1
    /// The engine's generation (`EngineCore.generation`) when it was made or restored.
    var generation: UInt64 = 0
    /// Listed in `EngineCore.touched`: its row is written at the end of the locked section.
    var touched = false
    /// The newest unfinished barrier: operations added after it depend on it.
    var barrier: OpRecord?
    var idleWaiters: [(UInt64, @Sendable (Bool) -> Void)] = []
    var deleted = false
    /// Operations set aside for it by batch parts across instances (`prepareBatchPart`) and not
    /// yet added or let go: while any are, the queue cannot be deleted.
    var held = 0
    /// Its start rate's bucket (`rateLimit`), and whether a wake-up for its next token is armed.
    var rate: TokenBucket? {
        didSet {
            // A new setting: an armed wake-up of the old bucket is stale.
            if oldValue?.limit != rate?.limit {
                rateWakeArmed = false
                rateWakeGeneration &+= 1
            }
        }
    }
    var rateWakeArmed = false
    var rateWakeGeneration: UInt64 = 0
    var fairnessWeights: [String: Int] = [:]
    /// Its ready operations in fair order, once one of them carried a fairness key; until
    /// then, `heap` (the same order when every key is `""`).
    var fair: FairReady?
    /// Entries pushed into `fair` since it was built (live and stale).
    var fairEntries = 0
    /// Its history (counts and sketches per minute and hour), once something happened.
    var history: QueueHistory?
    /// Its operations by admission key, once a create named one.
    var admission: AdmissionIndex?

    init(name: String, maxConcurrent: Int, isSuspended: Bool, createdAt: Timestamp, generation: UInt64) {
        self.name = name; self.maxConcurrent = maxConcurrent; self.isSuspended = isSuspended; self.createdAt = createdAt
        self.generation = generation
    }

    static let idMask: UInt64 = (1 << 60) - 1

    func push(_ op: OpRecord) {
        let key = op.priority.rank << 60 | op.id
        if let parked = op.parkedOn { parked.forget(op) }
        if fair == nil, let f = op.options.fairnessKey, !f.isEmpty { becomeFair() }
        op.heapKey = key
        if fair != nil {
            fair?.push(op, key: key)
            fairEntries += 1
            // Stale entries (cancelled, paused, re-prioritised) are dropped once they outnumber
            // the ready operations (plus a margin): memory follows what is ready.
            if fairEntries > 2 * counts[1] + 1024 { becomeFair() }
            return
        }
        if heap.count >= 2 * counts[1] + 1024 {
            heap = ops.compactMap { $0.state == .ready && $0.heapKey != 0 && $0 !== op ? $0.heapKey : nil }.sorted()
        }
        heap.append(key)
        var i = heap.count - 1
        while i > 0 {
            let parent = (i - 1) >> 1
            if heap[parent] <= key { break }
            heap[i] = heap[parent]
            i = parent
        }
        heap[i] = key
    }

    /// From now on, ready operations take turns by fairness key: those in the heap move over.
    private func becomeFair() {
        var f = FairReady()
        heap = []
        // The live entries: ready operations whose key is set (parked ones have none).
        fairEntries = 0
        for op in ops where op.state == .ready && op.heapKey != 0 {
            f.push(op, key: op.heapKey)
            fairEntries += 1
        }
        fair = f
    }

    /// Pops the next live ready entry, skipping stale ones (paused, cancelled, re-prioritised).
    func popReady(_ table: OpTable) -> OpRecord? {
        if fair != nil { return fair?.pop(table) }
        while let top = heap.first {
            removeTop()
            if let op = table[top & Self.idMask], op.heapKey == top, op.state == .ready {
                op.heapKey = 0
                return op
            }
        }
        return nil
    }

    private func removeTop() {
        let last = heap.removeLast()
        let n = heap.count
        if n == 0 { return }
        var i = 0
        while true {
            let l = 2 * i + 1
            if l >= n { break }
            var c = l
            if l + 1 < n && heap[l + 1] < heap[l] { c = l + 1 }
            if heap[c] >= last { break }
            heap[i] = heap[c]
            i = c
        }
        heap[i] = last
    }

    var rateLimit: RateLimit? { rate?.limit }

    func snapshot(defaultMax: Int) -> QueueSnapshot {
        var byState: [OperationState: Int] = [:]
        for s in OperationState.allCases { byState[s] = counts[s.index] }
        return QueueSnapshot(
            name: name, maxConcurrentOperationCount: maxConcurrent,
            effectiveMaxConcurrentOperationCount: maxConcurrent < 0 ? defaultMax : maxConcurrent,
            isSuspended: isSuspended, operationCount: unfinished, counts: byState, revision: revision, createdAt: createdAt,
            generation: generation, rateLimit: rate?.limit, fairnessWeights: fairnessWeights)
    }
}

extension OperationState {
    var index: Int {
        switch self {
        case .pending: return 0
        case .ready: return 1
        case .executing: return 2
        case .paused: return 3
        case .finished: return 4
        }
    }
}

/// Operations by id. Ids are handed out in order, so a dense array indexed by `id - base`
/// replaces a hash table (no hashing, no rehash pauses). Purged slots become nil, and the
/// prefix is dropped once it is all nil, so memory follows what is kept.
struct OpTable {
    private var slots: ContiguousArray<OpRecord?> = []
    private var base: UInt64 = 1
    /// Operations outside the dense run: ids of other blocks (a cluster instance holds queues
    /// whose ids other instances handed out, `QueueEngine.useIDs`), kept by id.
    private var overflow: [UInt64: OpRecord] = [:]
    private(set) var count = 0
    /// Slots allocated (ids from the oldest kept one to the newest).
    var span: Int { slots.count }
    /// How far past the dense run an id may land and still extend it (ids the engine hands out
    /// come one after the other; one further away starts a new run).
    static let reach: UInt64 = 1 << 16

    subscript(id: UInt64) -> OpRecord? {
        get {
            if id >= base, id &- base < UInt64(slots.count) { return slots[Int(truncatingIfNeeded: id &- base)] }
            return overflow.isEmpty ? nil : overflow[id]
        }
        set {
            // An empty table starts at the first id stored: a restart after millions of purged
            // operations must not allocate a slot for each of them.
            if slots.isEmpty, newValue != nil, id > base, overflow[id] == nil { base = id }
            if id < base || id &- base > UInt64(slots.count) &+ Self.reach {
                if id > base, newValue != nil, overflow[id] == nil, id &- base > UInt64(slots.count) &+ Self.reach {
                    // Far ahead: a new block of ids. The run moves there; what it held is kept by id.
                    for (i, op) in slots.enumerated() {
                        if let op { overflow[base &+ UInt64(i)] = op }
                    }
                    slots = []
                    base = id
                } else {
                    let old: OpRecord?
                    if let v = newValue { old = overflow.updateValue(v, forKey: id) } else { old = overflow.removeValue(forKey: id) }
                    if old == nil && newValue != nil { count += 1 }
                    if old != nil && newValue == nil { count -= 1 }
                    return
                }
            }
            let i = Int(truncatingIfNeeded: id &- base)
            if i >= slots.count {
                guard newValue != nil else { return }
                if i > slots.count { slots.append(contentsOf: repeatElement(nil, count: i - slots.count)) }
                slots.append(newValue)
                count += 1
                return
            }
            if slots[i] == nil && newValue != nil { count += 1 }
            if slots[i] != nil && newValue == nil { count -= 1 }
            slots[i] = newValue
        }
    }

    /// Drops the leading empty slots (after a purge).
    mutating func compact() {
        var n = 0
        while n < slots.count && slots[n] == nil { n += 1 }
        if n > 4096 || (n > 0 && n == slots.count) {
            slots.removeFirst(n)
            base += UInt64(n)
        }
    }
}

/// A schedule run's tag on its operation.
final class ScheduleTagBox: Sendable {
    let tag: ScheduleTag
    init(_ tag: ScheduleTag) { self.tag = tag }
}
