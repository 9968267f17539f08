/// Side effects decided under the lock and carried out after it is released.
enum Effect {
    case start(any OperationKind, ExecutionContext)
    /// A run kept across a restart or a handover (`Recovery.keep`): the kind takes up what the
    /// store already holds (a worker's lease) at once, not after the commit (`startAfterCommit`):
    /// requests about the run (a worker's finish or heartbeat) come the moment the queue is
    /// served, before the commit of its adoption. Nothing starts outside: one no worker holds
    /// is offered to claims, whose answers wait for the commits after it.
    case takeUp(any OperationKind, ExecutionContext)
    /// The same for a run that was paused (`OperationKind.takeUpPaused`): a paused operation's
    /// worker keeps its lease, and its heartbeats see `isPaused`, across a restart or a handover.
    case takeUpPaused(any OperationKind, ExecutionContext)
    case cancel(any OperationKind, ExecutionContext)
    case pause(any OperationKind, ExecutionContext)
    case call(@Sendable () -> Void)
    /// Ask the remote directory to report these operations once they are finished (they are
    /// waited for by operations held here: `QueueEngine+Remote`).
    case watchRemote([OperationID])
    /// Re-examine an operation after `seconds` (notBefore).
    case wake(OperationID, seconds: Double)
    /// Fail the run `token` with `timeout` if it still executes after `seconds`.
    case timeout(OperationID, token: UInt32, seconds: Double)
    /// Start attempt `token` again after `seconds` (retry backoff).
    case retry(OperationID, token: UInt32, seconds: Double)
    /// Look at a queue's rate or a limiter key again after `seconds` (a token is due).
    case flowWake(EngineCore.FlowWake, seconds: Double)
}

/// What one locked section hands to the thread that ran it.
struct Work {
    var effects: [Effect] = []
    var events: [ChangeEvent] = []
    var records: [StoreRecord] = []
    var ticket: UInt64 = 0
    var drains = false
    var isEmpty: Bool { effects.isEmpty && !drains }
}

/// Where the outbox stood when a slot was reserved: its length then, and the ticket of the
/// last change before it.
struct OutboxSlot {
    let id: UInt64
    var events: Int
    var records: Int
    let ticket: UInt64
}

/// All mutable engine state. Only touched inside `QueueEngine.state.withLock`.
// @unchecked: every access happens inside `QueueEngine.state.withLock`.
final class EngineCore: @unchecked Sendable {
    let clock: any EngineClock
    let kinds: [String: any OperationKind]
    let defaultMaxConcurrent: Int
    let maxUnfinished: Int
    let wantsRecords: Bool
    unowned(unsafe) var engine: QueueEngine!

    var queues: [String: QueueRecord] = [:]
    var limiters: [String: LimiterRecord] = [:]
    /// Limiter budgets are shared with other instances and leased (`QueueEngine.setLeaseClient`).
    var sharedLimiters = false
    /// How long a confirmed holding of a shared budget stays this instance's, ns.
    var leaseNanos: Int64 = 10_000_000_000
    /// Inside `QueueEngine.leaseGranted`: keys short of room are asked for again by the client.
    var inLeaseGrant = false
    var flowCounters = FlowCounters()
    /// Keys that let operations go in this locked section (`settle`).
    var flowRecheck: [LimiterKey] = []
    /// Target hosts of operations (API.md "Hosts"), by `host:port`.
    var hosts: [String: HostRecord] = [:]
    var breaker = BreakerSettings()
    var hostCounters = HostCounters()
    /// Schedules by queue, then name (API.md "Schedules").
    var schedules: [String: [String: ScheduleRecord]] = [:]
    var scheduleCount = 0
    /// Queues whose history changed since the last flush, and whether the flush is armed.
    var historyDirty: [QueueRecord] = []
    var historyFlushArmed = false
    /// The sum of every queue's history held here (`GET /v1/history`).
    let historyTotal: QueueHistory = {
        let h = QueueHistory()
        h.tracksDirty = false
        return h
    }()
    /// When each schedule is next due: a min-heap of (due ns, generation, schedule); entries of
    /// a schedule whose generation moved on are stale.
    var scheduleHeap: [ScheduleDue] = []
    /// The armed wake-up for the heap's top, and its generation.
    var scheduleWakeAt: Int64 = .max
    var scheduleWakeGeneration: UInt64 = 0
    /// How late runs were created after their time (nominal plus jitter), seconds (`/metrics`).
    var scheduleLag = ScheduleLag()
    var ops = OpTable()
    /// Operations held here that wait for an operation that is not (`OpRecord.remoteWaits`).
    var remoteWaiters: [UInt64: [OpRecord]] = [:]
    /// Operations given up with their queue (`QueueEngine.release`), until taken in again;
    /// bounded (`QueueEngine.wasReleased`).
    var released = Set<UInt64>()
    /// Names of queues released (`QueueEngine.release`) and not held again since.
    var releasedQueues = Set<String>()
    var nextID: UInt64 = 1
    /// Batch parts across instances checked and given ids, not yet added or let go
    /// (`prepareBatchPart`), by their batch's id.
    var batchHolds: [String: BatchHold] = [:]
    /// Operations set aside by them, in all (counted in the limits on unfinished operations).
    var heldTotal = 0
    /// Ids at or above it are not this engine's to hand out (`QueueEngine.useIDs`).
    var idEnd: UInt64 = QueueRecord.idMask + 1
    var nextSeq: UInt64 = 1
    var ticket: UInt64 = 0
    var unfinishedTotal = 0
    var nextWaiterID: UInt64 = 1
    /// This engine's run of the store (`RecoveredState.generation`): durable before anything is
    /// served, different at every restart or takeover. Queue `ETag`s carry it, so a revision
    /// shown before a crash but never committed cannot name other content after it.
    var generation: UInt64 = 0
    /// Queues whose row must be written by the current locked section (their revision moved, or
    /// they are new or restored): one `.queue` record each, at `finish`.
    var touched: [QueueRecord] = []

    // Produced by the current locked section.
    var effects: [Effect] = []
    var dirty: [QueueRecord] = []
    // Waiting for the drainer.
    var outEvents: [ChangeEvent] = []
    var outRecords: [StoreRecord] = []
    var draining = false
    /// Open slots (`QueueEngine.withSlot`), oldest first: where the outbox stood when each
    /// was reserved. The outbox is handed out only up to the first; what follows waits for it.
    var slots: [OutboxSlot] = []
    var nextSlot: UInt64 = 1
    var now: Timestamp = Timestamp(nanoseconds: 0)
    /// When this engine was made (ns): from then on, at least this instance ran (a queue handed
    /// over to it later was not stopped in between; `restoreSchedule`).
    let startedAt: Int64

    init(clock: any EngineClock, kinds: [String: any OperationKind], defaultMaxConcurrent: Int, maxUnfinished: Int, wantsRecords: Bool) {
        self.clock = clock
        startedAt = clock.now().nanoseconds
        self.kinds = kinds
        self.defaultMaxConcurrent = defaultMaxConcurrent
        self.maxUnfinished = maxUnfinished
        self.wantsRecords = wantsRecords
    }

    // MARK: - bookkeeping

    func begin() { now = clock.now() }

    /// Starts what the change made startable, so answers show the state after it.
    func settle() {
        while true {
            while let q = dirty.popLast() { schedule(q) }
            // Keys that let parked operations go look again once their queues have started
            // what they could: room one of them did not use (its queue is suspended or full,
            // another of its limits has none) goes to the next parked one (`keyGotRoom`).
            guard !flowRecheck.isEmpty else { return }
            let keys = flowRecheck
            flowRecheck = []
            for k in keys {
                k.rechecking = false
                if k.hasParked { keyGotRoom(k) }
            }
            if dirty.isEmpty { return }
        }
    }

    /// Ends a locked section: settles, takes the effects, and takes the outbox too when no
    /// other thread is draining it.
    func finish() -> Work {
        settle()
        recordTouched()
        var work = Work()
        swap(&work.effects, &effects)
        guard !draining else { return work }
        if slots.isEmpty {
            // The common case, inline: everything goes.
            if !outEvents.isEmpty || !outRecords.isEmpty {
                draining = true
                work.drains = true
                swap(&work.events, &outEvents)
                swap(&work.records, &outRecords)
                work.ticket = ticket
            }
        } else if takeDrainable(into: &work) {
            draining = true
        }
        return work
    }

    @inline(__always)
    func takeOutbox() -> Work? {
        // Checked before a `Work` exists: most drains end here, with an empty outbox.
        if outEvents.isEmpty && outRecords.isEmpty { draining = false; return nil }
        var work = Work()
        guard takeDrainable(into: &work) else { draining = false; return nil }
        return work
    }

    /// Moves into `work` what of the outbox may go to the store and the observers now: all of
    /// it, or what stands before the first open slot. False when that is nothing.
    @inline(__always)
    private func takeDrainable(into work: inout Work) -> Bool {
        guard let first = slots.first else {
            if outEvents.isEmpty && outRecords.isEmpty { return false }
            swap(&work.events, &outEvents)
            swap(&work.records, &outRecords)
            work.ticket = ticket
            work.drains = true
            return true
        }
        if first.events == 0 && first.records == 0 { return false }
        work.events = Array(outEvents[..<first.events])
        work.records = Array(outRecords[..<first.records])
        work.ticket = first.ticket
        work.drains = true
        outEvents.removeFirst(first.events)
        outRecords.removeFirst(first.records)
        for i in slots.indices {
            slots[i].events -= first.events
            slots[i].records -= first.records
        }
        return true
    }

    /// Opens a slot where the outbox stands now (`QueueEngine.withSlot`).
    func openSlot() -> UInt64 {
        let id = nextSlot
        nextSlot &+= 1
        slots.append(OutboxSlot(id: id, events: outEvents.count, records: outRecords.count, ticket: ticket))
        return id
    }

    /// Closes slot `id`, with `record` (if any) placed at its end: right after the changes made
    /// while it was open, before those another open slot holds. Then the outbox drains from here
    /// when nobody else drains it.
    func fillSlot(_ id: UInt64, with record: StoreRecord?) -> Work {
        var work = Work()
        guard let i = slots.firstIndex(where: { $0.id == id }) else { return work }
        if var record, wantsRecords {
            let end = i + 1 < slots.count ? slots[i + 1].records : outRecords.count
            // The slot opened at its change's first record: the kept answer's queue.
            if case var .kept(r) = record, r.queue == nil, slots[i].records < end {
                r.queue = outRecords[slots[i].records].queueName
                record = .kept(r)
            }
            // A ticket of its own: a slot in which nothing changed still commits its record
            // before `whenDurable` answers for it.
            ticket &+= 1
            outRecords.insert(record, at: end)
            for k in (i + 1)..<slots.count { slots[k].records += 1 }
        }
        slots.remove(at: i)
        if !draining && takeDrainable(into: &work) { draining = true }
        return work
    }

    func record(_ op: OpRecord) {
        // Operations of a deleted queue are gone from the store with it; a queue created
        // later under the same name must not inherit them at the next restore. No record, no
        // ticket: a ticket the store never receives would never become durable.
        if op.queue.deleted { return }
        ticket &+= 1
        if wantsRecords { outRecords.append(.operation(op.snapshot())) }
    }

    /// The queue's revision moves: its status (counts, settings) changed. Its row is written
    /// once at the end of the locked section, however many changes the section made.
    func bump(_ q: QueueRecord) {
        q.revision += 1
        touch(q)
    }

    /// The queue's row is to be written at the end of the locked section (`recordTouched`).
    func touch(_ q: QueueRecord) {
        if q.touched { return }
        q.touched = true
        touched.append(q)
    }

    /// One `.queue` record per queue touched by this section, after everything it changed: every
    /// commit that moves a queue's revision stores the status that goes with it, so the revision
    /// survives a restart (which bumps it past the stored one) and a cluster follower answers
    /// the queue from its row. A deleted queue's row is gone with it: nothing is recorded.
    func recordTouched() {
        guard !touched.isEmpty else { return }
        for q in touched {
            q.touched = false
            if !q.deleted { record(q) }
        }
        touched.removeAll(keepingCapacity: true)
    }

    func record(_ q: QueueRecord) {
        ticket &+= 1
        if wantsRecords { outRecords.append(.queue(q.snapshot(defaultMax: defaultMaxConcurrent))) }
    }

    func emit(_ op: OpRecord, _ key: ChangeKey, _ old: ChangeValue, _ new: ChangeValue) {
        // A deleted queue's operations are gone from the store: a change of one that is still
        // winding down (a force-deleted queue's executing command) is not reported. Giving it a
        // seq that is shown but never stored would let a restart hand that seq to another change.
        if op.queue.deleted { return }
        let e = ChangeEvent(
            seq: nextSeq, time: now, queue: op.queue.name, operation: op.operationID,
            key: key, old: old, new: new, state: op.state)
        nextSeq += 1
        outEvents.append(e)
        if wantsRecords { outRecords.append(.event(e)) }
    }

    func limit(_ q: QueueRecord) -> Int { q.maxConcurrent < 0 ? defaultMaxConcurrent : q.maxConcurrent }

    func context(_ op: OpRecord, resume: Bool) -> ExecutionContext {
        ExecutionContext(
            operation: op.operationID, queue: op.queue.name, spec: op.spec, attempt: op.attempt,
            isResume: resume, executedSeconds: Double(op.executedNanos) / 1e9, kindState: op.kindState,
            token: op.runToken, engine: engine)
    }

    // MARK: - scheduling

    func startOp(_ op: OpRecord) {
        let resume = op.resumeOnStart
        op.resumeOnStart = false
        applyChecked(.start, to: op)
        if op.startedAt == nil {
            op.startedAt = now
            // An operation restored from an archive starts as the attempt it was at.
            op.attempt = max(op.attempt, 1)
            op.runToken &+= 1
        }
        record(op)
        if op.isBarrier {
            completeOp(op, .succeeded(.null))
        } else if let parked = op.parkedCompletion {
            op.parkedCompletion = nil
            runEnded(op, parked)
        } else {
            beginRun(op, resume: resume)
        }
    }

    /// Hands a run to the kind, with its timeout armed.
    func beginRun(_ op: OpRecord, resume: Bool, takingUp: Bool = false) {
        // Each attempt's start counts once; a resume continues one.
        if !resume && !op.isBarrier { noteHistory(op.queue) { $0.started &+= 1 } }
        op.inBackoff = false
        op.backoffUntil = nil
        effects.append(takingUp ? .takeUp(op.kind, context(op, resume: resume)) : .start(op.kind, context(op, resume: resume)))
        if let t = op.options.timeout {
            let left = t - Double(op.executedNanos) / 1e9
            effects.append(.timeout(op.operationID, token: op.runToken, seconds: max(0, left)))
        }
    }

    /// A run ended. Failures are retried while `retry.maxAttempts` allows (the operation stays
    /// executing, `attempt` counts up, each attempt is an `attempt` change); otherwise it finishes.
    func runEnded(_ op: OpRecord, _ completion: Completion) {
        if case .failed = completion, !op.isCancelled, let retry = op.options.retry, op.attempt < retry.maxAttempts {
            let old = op.attempt
            op.attempt += 1
            op.runToken &+= 1
            op.executedNanos = 0
            op.runStartedAt = now.nanoseconds
            op.revision += 1
            if case let .failed(type, detail, _) = completion {
                op.error = .object([("type", .string(type)), ("detail", .string(detail)), ("attempt", .number(Double(old)))])
            }
            emit(op, .attempt, .int(old), .int(op.attempt))
            record(op)
            op.inBackoff = true
            let delay = retry.delay(beforeAttempt: op.attempt)
            op.backoffUntil = now.adding(seconds: delay)
            effects.append(.retry(op.operationID, token: op.runToken, seconds: delay))
            return
        }
        completeOp(op, completion)
    }

    /// The dependencies of `op` are finished or it was just created/changed: ready or pending.
    func makeReadyIfPossible(_ op: OpRecord) {
        guard op.state == .pending, op.unfinishedDependencies == 0 else { return }
        if let nb = op.options.notBefore, nb > now, !op.waitingForTime {
            op.waitingForTime = true
            effects.append(.wake(op.operationID, seconds: nb.nanoseconds.saturatingSubtract(now.nanoseconds).asSeconds))
            return
        }
        if op.waitingForTime { return }
        applyChecked(.dependenciesMet, to: op)
        record(op)
    }

    /// The run ended for good: the outcome is set and the operation finishes.
    func completeOp(_ op: OpRecord, _ completion: Completion) {
        // What the kind saved is for a run, and no run follows (a worker's parked result would
        // otherwise be kept twice for as long as the operation is).
        op.kindState = nil
        if op.isCancelled {
            op.outcome = .cancelled
            op.result = nil
            op.error = .object([("type", .string("cancelled")), ("detail", .string("cancelled while executing"))])
        } else {
            switch completion {
            case let .succeeded(result):
                op.outcome = .succeeded
                op.result = result
                op.error = nil
            case let .failed(type, detail, data):
                op.outcome = .failed
                var members: [(String, JSONValue)] = [("type", .string(type)), ("detail", .string(detail))]
                if let data { members.append(("data", data)) }
                op.error = .object(members)
            }
        }
        applyChecked(.complete, to: op)
    }

    /// Cancels one operation (Foundation's `cancel()`); false when it was already finished.
    /// `detached`: the caller has already taken it out of its dependencies' `dependents` (a
    /// bulk cancel does that for all its operations in one pass per dependency).
    @discardableResult
    func cancelOp(_ op: OpRecord, detached: Bool = false) -> Bool {
        switch op.state {
        case .finished:
            return false
        case .executing:
            // Asked already: the kind is stopping its run (a run between attempts is not).
            if op.isCancelled && !op.inBackoff { return true }
            applyChecked(.cancel, to: op)
            if op.inBackoff {
                // Between attempts nothing runs: it finishes cancelled at once.
                completeOp(op, .failed(type: "cancelled", detail: "cancelled between attempts"))
            } else {
                record(op)
                effects.append(.cancel(op.kind, context(op, resume: false)))
            }
        case .pending, .ready, .paused:
            if op.state == .paused && op.hasStarted && op.parkedCompletion == nil {
                // Paused mid-run: the kind still holds resources (a stopped process); free them.
                effects.append(.cancel(op.kind, context(op, resume: false)))
            }
            op.outcome = .cancelled
            dropRemoteWaits(op)
            for depID in op.dependencyIDs where !detached {
                if let dep = ops[depID.raw], dep.state != .finished, let i = dep.dependents.firstIndex(where: { $0 === op }) {
                    dep.dependents.remove(at: i)
                }
            }
            op.unfinishedDependencies = 0
            applyChecked(.cancel, to: op)
        }
        return true
    }

    /// Every operation that transitively depends on `op`.
    func transitiveDependents(of op: OpRecord) -> [OpRecord] {
        var seen: Set<ObjectIdentifier> = [ObjectIdentifier(op)]
        var out: [OpRecord] = []
        var stack = op.dependents
        while let d = stack.popLast() {
            if seen.insert(ObjectIdentifier(d)).inserted {
                out.append(d)
                stack.append(contentsOf: d.dependents)
            }
        }
        return out
    }

    /// True when `target` is reachable from any of `starts` along unfinished dependency edges.
    func reaches(_ target: UInt64, from starts: [OperationID]) -> Bool {
        var seen: Set<UInt64> = []
        var stack = starts.map(\.raw)
        while let id = stack.popLast() {
            if id == target { return true }
            guard seen.insert(id).inserted, let op = ops[id], op.state != .finished else { continue }
            stack.append(contentsOf: op.dependencyIDs.map(\.raw))
        }
        return false
    }

    /// Refuses a change that would add `n` operations beyond this engine's ids.
    func reserveIDs(_ n: Int) throws(EngineError) {
        guard n <= 1 << 32, nextID &+ UInt64(n) <= idEnd else {
            throw .unavailable("this instance has used up its block of operation ids and has not got the next one yet; retry shortly")
        }
    }

    // MARK: - lookups

    func queue(_ name: String) throws(EngineError) -> QueueRecord {
        guard let q = queues[name] else { throw .queueNotFound(name) }
        return q
    }

    func op(_ id: OperationID) throws(EngineError) -> OpRecord {
        guard let op = ops[id.raw] else { throw .operationNotFound(id.description) }
        return op
    }
}

extension Int64 {
    var asSeconds: Double { Double(self) / 1e9 }
}
