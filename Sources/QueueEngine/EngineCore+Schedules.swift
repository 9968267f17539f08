import Schedules

/// One entry of the engine's due heap.
struct ScheduleDue {
    var due: Int64
    var generation: UInt64
    let schedule: ScheduleRecord
}

/// Schedules in the engine (API.md "Schedules"): a heap of next-due times with one timer for its
/// top, not a poll of every schedule. A run is created in the locked section that moves the
/// schedule's cursor (`lastNominal`) past its nominal time, so both reach the store in one
/// commit: a nominal time runs at most once across restarts and crashes.
extension EngineCore {
    // MARK: - when

    /// Works out the next nominal time after `after` (seconds) and puts it on the heap.
    func planNext(_ rec: ScheduleRecord, after: Int64) {
        rec.dueGeneration &+= 1
        rec.nextNominal = rec.timing.next(after: after, count: 1).first?.utc
        guard !rec.isPaused, !rec.deleted, let n = rec.nextNominal else {
            rec.dueAt = .max
            return
        }
        rec.dueAt = n.multipliedReportingOverflow(by: 1_000_000_000).overflow ? .max : (n &* 1_000_000_000).saturatingAdd(rec.jitterNanos)
        pushDue(ScheduleDue(due: rec.dueAt, generation: rec.dueGeneration, schedule: rec))
        armScheduleWake()
    }

    /// Arms the one timer for the earliest live entry, unless one as early is armed.
    func armScheduleWake() {
        while let top = scheduleHeap.first, top.generation != top.schedule.dueGeneration || top.schedule.deleted {
            popDue()
        }
        guard let top = scheduleHeap.first else { return }
        let t = now.nanoseconds
        guard top.due < scheduleWakeAt || scheduleWakeAt <= t else { return }
        // A long wait is armed to a second before the time, then again for the rest: the
        // system's timers fire a long delay late by a share of it (measured: 50 ms on 10 s).
        let wait = top.due.saturatingSubtract(t)
        let at = wait > 2_000_000_000 ? top.due - 1_000_000_000 : top.due
        scheduleWakeAt = at
        scheduleWakeGeneration &+= 1
        effects.append(.flowWake(.schedules(generation: scheduleWakeGeneration), seconds: Double(max(0, at.saturatingSubtract(t))) / 1e9))
    }

    /// The timer fired: every schedule due by now runs, in due order.
    func schedulesWakeFired(_ generation: UInt64) {
        guard generation == scheduleWakeGeneration else { return }
        scheduleWakeAt = .max
        let t = now.nanoseconds
        var fired = 0
        while let top = scheduleHeap.first, top.due <= t, fired < 100_000 {
            popDue()
            let rec = top.schedule
            guard top.generation == rec.dueGeneration, !rec.deleted, !rec.isPaused, let nominal = rec.nextNominal else { continue }
            fired += 1
            scheduleLag.observe(Double(t.saturatingSubtract(top.due)) / 1e9)
            run(rec, nominal: nominal, overlap: rec.spec.overlap)
            rec.lastNominal = max(rec.lastNominal ?? .min, nominal)
            planNext(rec, after: nominal)
            recordSchedule(rec)
        }
        armScheduleWake()
    }

    // MARK: - a run

    /// Creates the run of `rec` for `nominal` (seconds; `exact`: a trigger's own time, ns) as
    /// `overlap` decides. Nil when no operation was created (skipped, or refused: counted as
    /// missed).
    @discardableResult
    func run(_ rec: ScheduleRecord, nominal: Int64, exactNanos: Int64? = nil, overlap: Overlap) -> OpRecord? {
        let previous = rec.lastRun.flatMap { ops[$0.op.raw] }
        let previousUnfinished = previous.map { $0.state != .finished } ?? false
        let waiting = rec.buffered.flatMap { ops[$0.raw] }.map { $0.state != .finished && !$0.hasStarted } ?? false
        let decision = overlap.decide(previousUnfinished: previousUnfinished, oneWaiting: waiting)
        rec.lastRunMerged = false
        var deps: [OpRecord] = []
        switch decision {
        case .skip:
            rec.skipped &+= 1
            return nil
        case .cancelPreviousThenCreate:
            if let previous { cancelOp(previous) }
        case .createAfterPrevious:
            if let previous { deps = [previous] }
        case .create:
            break
        }
        guard let q = queues[rec.queue], !q.deleted, let kind = kinds[rec.spec.template.kind] else {
            rec.missed &+= 1
            return nil
        }
        var request = rec.spec.template
        if request.options.retry == nil { request.options.retry = kind.defaultRetry }
        // The template's admission (API.md "Admission"): a run merged into a waiting operation
        // is a run (that operation is its last); one skipped for an unfinished one is skipped.
        var admissionTag: AdmissionTag?
        if let admission = request.admission {
            switch try? plan(admission, in: q, kind: request.kind) {
            case .skip?:
                rec.skipped &+= 1
                return nil
            case let .merge(op)?:
                absorb(op, request, admission)
                rec.lastRunMerged = true
                rec.runs &+= 1
                rec.lastRun = (nominal, op.operationID)
                return op
            case let .create(after)?:
                if let after, !deps.contains(where: { $0 === after }) { deps.append(after) }
                admissionTag = tag(for: admission)
                request.options.notBefore = debounceStart(admission, since: now, asked: request.options.notBefore)
            case nil:
                // The key stands for an operation of another kind.
                rec.missed &+= 1
                return nil
            }
        }
        guard unfinishedTotal + heldTotal < maxUnfinished, q.unfinished + q.held < engine.configuration.maxUnfinishedPerQueue,
            (try? reserveIDs(1)) != nil
        else {
            rec.missed &+= 1
            return nil
        }
        request.dependencies = deps.map(\.operationID)
        let nominalNanos = exactNanos ?? nominal &* 1_000_000_000
        let op = insert(
            into: q, req: request, kind: kind, deps: deps, barrier: false,
            tag: ScheduleTag(name: rec.spec.name, nominalTime: Timestamp(nanoseconds: nominalNanos)), admission: admissionTag)
        rec.runs &+= 1
        rec.lastRun = (nominal, op.operationID)
        if decision == .createAfterPrevious && overlap == .bufferOne { rec.buffered = op.operationID }
        return op
    }

    func recordSchedule(_ rec: ScheduleRecord) {
        guard !rec.deleted, let q = queues[rec.queue], !q.deleted else { return }
        rec.revision &+= 1
        ticket &+= 1
        if wantsRecords { outRecords.append(.schedule(rec.snapshot())) }
    }

    // MARK: - the heap

    private func pushDue(_ e: ScheduleDue) {
        scheduleHeap.append(e)
        var i = scheduleHeap.count - 1
        while i > 0 {
            let p = (i - 1) >> 1
            if scheduleHeap[p].due <= scheduleHeap[i].due { break }
            scheduleHeap.swapAt(i, p)
            i = p
        }
    }

    private func popDue() {
        let last = scheduleHeap.removeLast()
        guard !scheduleHeap.isEmpty else { return }
        scheduleHeap[0] = last
        var i = 0
        let n = scheduleHeap.count
        while true {
            let l = 2 * i + 1
            if l >= n { break }
            var c = l
            if l + 1 < n && scheduleHeap[l + 1].due < scheduleHeap[l].due { c = l + 1 }
            if scheduleHeap[c].due >= scheduleHeap[i].due { break }
            scheduleHeap.swapAt(i, c)
            i = c
        }
        // Stale entries are dropped once they outnumber the live ones (plus a margin).
        if scheduleHeap.count > 2 * scheduleCount + 64 {
            scheduleHeap.removeAll { $0.generation != $0.schedule.dueGeneration || $0.schedule.deleted }
            scheduleHeap.sort { $0.due < $1.due }
        }
    }

    /// A queue going away (deleted, or given to another instance) takes its schedules.
    func dropSchedules(of queue: String) {
        guard let list = schedules.removeValue(forKey: queue) else { return }
        for rec in list.values {
            rec.deleted = true
            rec.dueGeneration &+= 1
        }
        scheduleCount -= list.count
    }
}
