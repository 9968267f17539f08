import Schedules

extension QueueEngine {
    // MARK: - schedules (API.md "Schedules")

    /// Creates a schedule in `queue`. The template is checked like a create (kind, spec, flow
    /// options); a duplicate name in the queue is `schedule-exists`.
    @discardableResult
    public func createSchedule(in queue: String, _ spec: ScheduleSpec, paused: Bool = false) throws(EngineError) -> ScheduleSnapshot {
        try Self.validateLimiterName(spec.name, field: "name")
        try validateTemplate(spec)
        return try mutate { core throws(EngineError) in
            let q = try core.queue(queue)
            if core.schedules[q.name]?[spec.name] != nil {
                throw .conflict(slug: "schedule-exists", detail: "queue '\(queue)' has a schedule named '\(spec.name)' already")
            }
            guard core.scheduleCount < configuration.maxSchedules else {
                throw .limitReached("at most \(configuration.maxSchedules) schedules (--max-schedules)", limit: "too-many-schedules")
            }
            if !spec.template.options.limits.isEmpty {
                var pending: [String: Set<String>] = [:]
                try core.checkLimits(spec.template.options.limits, field: "operation.limits", pending: &pending)
            }
            let timing = try ScheduleRecord.timing(spec, createdAt: core.now)
            let rec = ScheduleRecord(queue: q.name, spec: spec, timing: timing, createdAt: core.now)
            rec.isPaused = paused
            core.schedules[q.name, default: [:]][spec.name] = rec
            core.scheduleCount += 1
            core.planNext(rec, after: core.now.nanoseconds / 1_000_000_000)
            core.recordSchedule(rec)
            return rec.snapshot()
        }
    }

    /// Replaces a schedule's settings (its counts and cursor stay); the next run is worked out
    /// again from now.
    @discardableResult
    public func updateSchedule(in queue: String, _ spec: ScheduleSpec) throws(EngineError) -> ScheduleSnapshot {
        try validateTemplate(spec)
        return try mutate { core throws(EngineError) in
            let rec = try core.schedule(queue, spec.name)
            let timing = try ScheduleRecord.timing(spec, createdAt: rec.createdAt)
            rec.spec = spec
            rec.timing = timing
            rec.jitterNanos = Int64(Timing.jitterSeconds(queue: rec.queue, name: spec.name, jitter: spec.jitter) * 1e9)
            core.planNext(rec, after: max(core.now.nanoseconds / 1_000_000_000, rec.lastNominal ?? .min))
            core.recordSchedule(rec)
            return rec.snapshot()
        }
    }

    public func deleteSchedule(in queue: String, named name: String) throws(EngineError) {
        try mutate { core throws(EngineError) in
            let rec = try core.schedule(queue, name)
            rec.deleted = true
            rec.dueGeneration &+= 1
            core.schedules[rec.queue]?[name] = nil
            if core.schedules[rec.queue]?.isEmpty == true { core.schedules[rec.queue] = nil }
            core.scheduleCount -= 1
            core.ticket &+= 1
            if core.wantsRecords { core.outRecords.append(.scheduleDeleted(queue: rec.queue, name: name)) }
        }
    }

    public func schedule(in queue: String, named name: String) throws(EngineError) -> ScheduleSnapshot {
        try read { core throws(EngineError) in try core.schedule(queue, name).snapshot() }
    }

    /// A queue's schedules, by name.
    public func schedules(in queue: String) throws(EngineError) -> [ScheduleSnapshot] {
        try read { core throws(EngineError) in
            _ = try core.queue(queue)
            return (core.schedules[queue] ?? [:]).values.map { $0.snapshot() }.sorted { $0.spec.name < $1.spec.name }
        }
    }

    /// Every queue's schedules, by queue and name.
    public func allSchedules() -> [ScheduleSnapshot] {
        state.withLock { core in
            core.schedules.values.flatMap { $0.values.map { $0.snapshot() } }.sorted { ($0.queue, $0.spec.name) < ($1.queue, $1.spec.name) }
        }
    }

    /// Counts per schedule and the lag histogram, for `/metrics`.
    public func scheduleMetrics() -> (schedules: [ScheduleCounts], lag: ScheduleLag) {
        state.withLock { core in
            (
                core.schedules.values.flatMap {
                    $0.values.map { ScheduleCounts(queue: $0.queue, name: $0.spec.name, runs: $0.runs, skipped: $0.skipped, missed: $0.missed) }
                },
                core.scheduleLag
            )
        }
    }

    /// Pauses a schedule: nothing runs; nominal times that pass meanwhile are skipped.
    @discardableResult
    public func pauseSchedule(in queue: String, named name: String, note: String?) throws(EngineError) -> ScheduleSnapshot {
        try mutate { core throws(EngineError) in
            let rec = try core.schedule(queue, name)
            if !rec.isPaused {
                rec.isPaused = true
                // Times passed while paused are skipped from here.
                rec.lastNominal = max(rec.lastNominal ?? .min, core.now.nanoseconds / 1_000_000_000)
                rec.dueGeneration &+= 1
                rec.dueAt = .max
            }
            rec.pausedNote = note
            core.recordSchedule(rec)
            return rec.snapshot()
        }
    }

    /// Resumes a schedule: the nominal times that passed while it was paused are skipped
    /// (counted), not caught up.
    @discardableResult
    public func resumeSchedule(in queue: String, named name: String) throws(EngineError) -> ScheduleSnapshot {
        try mutate { core throws(EngineError) in
            let rec = try core.schedule(queue, name)
            guard rec.isPaused else { return rec.snapshot() }
            let t = core.now.nanoseconds / 1_000_000_000
            let passed = rec.timing.scan(after: rec.lastNominal ?? t, upTo: t, keep: 0)
            rec.skipped &+= UInt64(passed.total)
            rec.isPaused = false
            rec.pausedNote = nil
            rec.lastNominal = max(rec.lastNominal ?? .min, t)
            core.planNext(rec, after: t)
            core.recordSchedule(rec)
            return rec.snapshot()
        }
    }

    /// A run now (nominal time: now), by the schedule's overlap policy or `overlap`. Nil when
    /// the policy skipped it.
    public func triggerSchedule(in queue: String, named name: String, overlap: Overlap? = nil) throws(EngineError) -> OperationSnapshot? {
        try triggerScheduleAdmitted(in: queue, named: name, overlap: overlap)?.operation
    }

    /// `triggerSchedule`, saying whether the run is a new operation or was merged into a waiting
    /// one by the template's admission.
    public func triggerScheduleAdmitted(in queue: String, named name: String, overlap: Overlap? = nil) throws(EngineError) -> Admitted? {
        try mutate { core throws(EngineError) in
            let rec = try core.schedule(queue, name)
            // A template whose admission key stands for an operation of another kind is refused as
            // such a create is (409), before anything changes; a timer's run counts it as missed.
            if let admission = rec.spec.template.admission, let q = core.queues[rec.queue] {
                _ = try core.plan(admission, in: q, kind: rec.spec.template.kind)
            }
            let t = core.now.nanoseconds
            let missed = rec.missed
            let op = core.run(rec, nominal: t / 1_000_000_000, exactNanos: t, overlap: overlap ?? rec.spec.overlap)
            // Refused for room only when this run was missed: one the policy or the template's
            // admission skipped is a skip, whatever the queue holds.
            if op == nil && rec.missed > missed,
                core.queues[rec.queue].map({ core.unfinishedTotal >= core.maxUnfinished || $0.unfinished >= configuration.maxUnfinishedPerQueue }) == true
            {
                rec.missed -= 1
                throw .limitReached(
                    "the queue or the server has as many unfinished operations as it may (--max-unfinished, --max-unfinished-per-queue)",
                    limit: "too-many-operations")
            }
            core.recordSchedule(rec)
            return op.map { Admitted(operation: core.status($0), outcome: rec.lastRunMerged ? .merged : .created) }
        }
    }

    /// Runs for every nominal time in `[from, to)` (at most 1,000, else `invalidArgument`), by
    /// `overlap` (default `bufferAll`: a chain). Nominal times that have a run the engine still
    /// holds are left out.
    public func backfillSchedule(in queue: String, named name: String, from: Timestamp, to: Timestamp, overlap: Overlap = .bufferAll)
        throws(EngineError) -> [OperationSnapshot]
    {
        try mutate { core throws(EngineError) in
            let rec = try core.schedule(queue, name)
            guard from < to else { throw .invalidArgument(field: "to", detail: "must be after from") }
            let a = from.nanoseconds / 1_000_000_000 - (from.nanoseconds % 1_000_000_000 == 0 ? 1 : 0)
            let b = (to.nanoseconds - 1) / 1_000_000_000
            let found = rec.timing.scan(after: a, upTo: b, keep: 1001, cap: 100_000)
            guard found.total <= 1000, found.complete else {
                throw .invalidArgument(
                    field: "to",
                    detail: "[from, to) holds \(found.complete ? String(found.total) : "more than 100000") nominal times; at most 1000 per backfill")
            }
            var have = Set<Int64>()
            if let q = core.queues[rec.queue] {
                for op in q.ops { if let tag = op.scheduleTag?.tag, tag.name == rec.spec.name { have.insert(tag.nominalTime.nanoseconds) } }
            }
            var out: [OperationSnapshot] = []
            for nominal in found.newest where !have.contains(nominal &* 1_000_000_000) {
                if let op = core.run(rec, nominal: nominal, overlap: overlap) { out.append(core.status(op)) }
            }
            core.recordSchedule(rec)
            return out
        }
    }

    /// The next `count` runs (at most 100): nominal time, wall-clock offset, and the note where
    /// the daylight-saving rule applied.
    public func nextRuns(in queue: String, named name: String, count: Int) throws(EngineError) -> (runs: [ScheduledRun], zone: String) {
        try read { core throws(EngineError) in
            let rec = try core.schedule(queue, name)
            let after = max(core.now.nanoseconds / 1_000_000_000, rec.lastNominal ?? .min)
            let runs = rec.timing.next(after: after, count: min(max(count, 1), 100)).map {
                ScheduledRun(nominalTime: Timestamp(nanoseconds: $0.utc &* 1_000_000_000), offset: $0.offset, note: $0.note)
            }
            return (runs, rec.spec.timezone)
        }
    }

    private func validateTemplate(_ spec: ScheduleSpec) throws(EngineError) {
        let t = spec.template
        guard let kind = kinds[t.kind], t.kind != "barrier" else { throw .unknownKind(t.kind, allowed: kindNames) }
        do throws(EngineError) {
            try kind.validate(spec: t.spec)
        } catch {
            if case let .invalidArgument(field, detail) = error { throw .invalidArgument(field: "operation.\(field)", detail: detail) }
            throw error
        }
        guard t.dependencies.isEmpty else { throw .invalidArgument(field: "operation.dependencies", detail: "a schedule's runs take no dependencies") }
        guard t.options.notBefore == nil else { throw .invalidArgument(field: "operation.notBefore", detail: "a schedule's runs start at their own times") }
        if !t.options.limits.isEmpty || t.options.fairnessKey != nil {
            // Named as in the schedule's body: `operation.limits[i]`, as the limiter check below.
            do throws(EngineError) {
                try Self.validateFlow(t.options)
            } catch {
                if case let .invalidArgument(field, detail) = error { throw .invalidArgument(field: "operation.\(field)", detail: detail) }
                throw error
            }
        }
        if !t.options.limits.isEmpty { try ensureLimiters(t.options.limits.map(\.limiter)) }
        guard ScheduleSpec.jitterRange.contains(spec.jitter) else {
            throw .invalidArgument(field: "jitter", detail: "must be seconds from 0 to \(Int(ScheduleSpec.jitterRange.upperBound))")
        }
        if let a = spec.startAt, let b = spec.endAt, b <= a { throw .invalidArgument(field: "endAt", detail: "must be after startAt") }
    }
}

extension EngineCore {
    func schedule(_ queue: String, _ name: String) throws(EngineError) -> ScheduleRecord {
        _ = try self.queue(queue)
        guard let rec = schedules[queue]?[name] else { throw .scheduleNotFound(queue: queue, name: name) }
        return rec
    }

    /// Stored schedules come back after their queues' operations. After a restart, or a
    /// takeover from an instance that crashed, each catches up on the nominal times that passed
    /// while its queue was not run, by its own policy.
    ///
    /// `handedOver` (its queue was given up cleanly by another instance of a cluster): the
    /// cluster did not stop, so no nominal time is dropped. Every one after the stored cursor
    /// (the previous holder ran those up to it, committed with the cursor) whose time (plus
    /// jitter) has come runs now, each by the schedule's `overlap` as if on time, whatever its
    /// `catchup` says; at most `maxHandoverRuns` of them (the latest), the rest counted as missed.
    /// Only times since this engine started are taken as passed while the cluster ran: earlier
    /// ones follow the policy (the last instance may have given the queue up at its stop, with
    /// none left to take it, and the cluster was stopped until this one started).
    func restoreSchedule(_ s: ScheduleSnapshot, handedOver: Bool = false) {
        guard let q = queues[s.queue], !q.deleted, schedules[s.queue]?[s.spec.name] == nil,
            let timing = try? ScheduleRecord.timing(s.spec, createdAt: s.createdAt)
        else { return }
        let rec = ScheduleRecord(queue: q.name, spec: s.spec, timing: timing, createdAt: s.createdAt)
        rec.revision = s.revision
        rec.isPaused = s.isPaused
        rec.pausedNote = s.pausedNote
        rec.lastNominal = s.lastNominal.map { $0.nanoseconds / 1_000_000_000 }
        rec.lastRun = s.lastRun.map { ($0.nominalTime.nanoseconds / 1_000_000_000, $0.operation) }
        rec.runs = s.runs
        rec.skipped = s.skipped
        rec.missed = s.missed
        schedules[q.name, default: [:]][s.spec.name] = rec
        scheduleCount += 1
        let t = now.nanoseconds / 1_000_000_000
        guard !rec.isPaused else { return }
        let stored = rec.lastNominal ?? (s.createdAt.nanoseconds / 1_000_000_000)
        var last = stored
        // Every nominal time up to `upTo` is decided (run or missed) by the policy.
        func catchUp(upTo: Int64) {
            guard last < upTo else { return }
            let plan = s.spec.catchup.plan(timing, last: last, now: upTo)
            for nominal in plan.run { run(rec, nominal: nominal, overlap: rec.spec.overlap) }
            rec.missed &+= UInt64(plan.missed)
            last = upTo
        }
        if handedOver {
            catchUp(upTo: min(startedAt / 1_000_000_000, t))
            // Seconds whose nominal time plus jitter has come; later ones are planned as usual.
            let due = now.nanoseconds.saturatingSubtract(rec.jitterNanos) / 1_000_000_000
            if last < due {
                let found = timing.scan(after: last, upTo: due, keep: ScheduleRecord.maxHandoverRuns, cap: 400_000)
                for nominal in found.newest { run(rec, nominal: nominal, overlap: rec.spec.overlap) }
                rec.missed &+= UInt64(found.total - found.newest.count)
                last = due
            }
        } else {
            catchUp(upTo: t)
        }
        if last != stored {
            rec.lastNominal = last
            recordSchedule(rec)
        }
        planNext(rec, after: handedOver ? last : max(last, t))
    }
}
