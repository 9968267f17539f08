import Synchronization

extension QueueEngine {
    // MARK: - queues

    /// Creates a queue. `maxConcurrentOperationCount` is positive or -1.
    @discardableResult
    public func createQueue(
        name: String, maxConcurrentOperationCount: Int = -1, isSuspended: Bool = false, rateLimit: RateLimit? = nil,
        fairnessWeights: [String: Int] = [:]
    ) throws(EngineError) -> QueueSnapshot {
        try Self.validateQueueName(name)
        try Self.validateMax(maxConcurrentOperationCount)
        if let rateLimit { try Self.validateRate(rateLimit, field: "rateLimit") }
        try Self.validateFairnessWeights(fairnessWeights)
        return try mutate { core throws(EngineError) in
            guard core.queues[name] == nil else { throw .queueExists(name) }
            if let only = queueFilter.value, !only(name) { throw .notHere(name) }
            guard core.queues.count < configuration.maxQueues else {
                throw .limitReached("at most \(configuration.maxQueues) queues (--max-queues)", limit: "too-many-queues")
            }
            let q = QueueRecord(
                name: name, maxConcurrent: maxConcurrentOperationCount, isSuspended: isSuspended, createdAt: core.now, generation: core.generation)
            q.rate = rateLimit.map { TokenBucket($0, now: core.now.nanoseconds) }
            q.fairnessWeights = fairnessWeights
            core.queues[name] = q
            core.releasedQueues.remove(name)
            core.touch(q)
            core.settle()
            return q.snapshot(defaultMax: core.defaultMaxConcurrent)
        }
    }

    static func validateQueueName(_ name: String) throws(EngineError) {
        let ok =
            !name.isEmpty && name.utf8.count <= 64
            && name.utf8.allSatisfy { c in
                (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c == 46 || c == 95 || c == 45
            }
        if !ok { throw .invalidArgument(field: "name", detail: "must match [A-Za-z0-9._-]{1,64}") }
    }

    static func validateMax(_ value: Int) throws(EngineError) {
        if value != -1 && value < 1 {
            throw .invalidArgument(field: "maxConcurrentOperationCount", detail: "must be a positive integer or -1 (the server's default); got \(value)")
        }
    }

    /// One queue's settings and counts.
    public func queue(named name: String) throws(EngineError) -> QueueSnapshot {
        try read { core throws(EngineError) in try core.queue(name).snapshot(defaultMax: core.defaultMaxConcurrent) }
    }

    /// Every queue, sorted by name.
    public func queues() -> [QueueSnapshot] {
        state.withLock { core in
            core.queues.values.map { $0.snapshot(defaultMax: core.defaultMaxConcurrent) }
        }.sorted { $0.name < $1.name }
    }

    /// Changes settings; takes effect at once (a resumed or widened queue starts work).
    @discardableResult
    public func updateQueue(
        _ name: String, maxConcurrentOperationCount: Int? = nil, isSuspended: Bool? = nil, rateLimit: RateLimit?? = nil,
        fairnessWeights: [String: Int]? = nil
    ) throws(EngineError) -> QueueSnapshot {
        if let m = maxConcurrentOperationCount { try Self.validateMax(m) }
        if let r = rateLimit, let r { try Self.validateRate(r, field: "rateLimit") }
        if let w = fairnessWeights { try Self.validateFairnessWeights(w) }
        return try mutate { core throws(EngineError) in
            let q = try core.queue(name)
            var changed = false
            if let m = maxConcurrentOperationCount, m != q.maxConcurrent { q.maxConcurrent = m; changed = true }
            if let s = isSuspended, s != q.isSuspended { q.isSuspended = s; changed = true }
            // A new rate takes effect at once with a full bucket (API.md "Queue rate").
            if let r = rateLimit, r != q.rate?.limit {
                q.rate = r.map { TokenBucket($0, now: core.now.nanoseconds) }
                changed = true
            }
            if let w = fairnessWeights, w != q.fairnessWeights { q.fairnessWeights = w; changed = true }
            if changed {
                core.bump(q)
                core.dirty.append(q)
            }
            core.settle()
            return q.snapshot(defaultMax: core.defaultMaxConcurrent)
        }
    }

    /// `isSuspended = true`: executing operations run on, no new one starts.
    @discardableResult
    public func suspend(_ name: String) throws(EngineError) -> QueueSnapshot { try updateQueue(name, isSuspended: true) }

    /// `isSuspended = false`.
    @discardableResult
    public func resumeQueue(_ name: String) throws(EngineError) -> QueueSnapshot { try updateQueue(name, isSuspended: false) }

    /// `cancelAllOperations()`.
    @discardableResult
    public func cancelAll(_ name: String) throws(EngineError) -> QueueSnapshot {
        try mutate { core throws(EngineError) in
            let q = try core.queue(name)
            core.cancelAll(of: q)
            core.settle()
            return q.snapshot(defaultMax: core.defaultMaxConcurrent)
        }
    }

    /// Deletes a queue. Refused while it has unfinished operations, unless `force`, which
    /// cancels them first (executing ones are asked to stop and finish on their own).
    public func deleteQueue(_ name: String, force: Bool = false) throws(EngineError) {
        try mutate { core throws(EngineError) in
            let q = try core.queue(name)
            if let list = core.schedules[name], !list.isEmpty, !force {
                throw .conflict(
                    slug: "queue-has-schedules",
                    detail: "queue '\(name)' has \(list.count) schedule(s); delete them first, or delete the queue with ?force=true, which deletes them too")
            }
            if q.unfinished > 0 && !force { throw .queueNotIdle(name, unfinished: q.unfinished) }
            // Operations a batch across instances may add any moment now (its outcome is being
            // decided): the queue stays until they are added or let go, a few seconds at most.
            if q.held > 0 { throw .queueNotIdle(name, unfinished: q.unfinished + q.held) }
            core.dropSchedules(of: name)
            core.cancelAll(of: q)
            core.historyLeaves(q)
            q.deleted = true
            // Its operations go with it; executing ones leave the table when they finish.
            for op in q.ops where op.state == .finished { core.ops[op.id] = nil }
            core.queues[name] = nil
            core.ticket &+= 1
            if core.wantsRecords { core.outRecords.append(.queueDeleted(name)) }
            let waiters = q.idleWaiters
            q.idleWaiters = []
            let idle = q.unfinished == 0
            for (_, w) in waiters { core.effects.append(.call({ w(idle) })) }
        }
    }

    /// Calls `callback(true)` as soon as the queue has no unfinished operation (at once if it
    /// has none now). Returns a token for `cancelIdleWait`. Never blocks.
    public func onIdle(_ name: String, _ callback: @escaping @Sendable (Bool) -> Void) throws(EngineError) -> UInt64? {
        let immediate: Bool = try read { core throws(EngineError) in try core.queue(name).unfinished == 0 }
        if immediate { callback(true); return nil }
        return try mutate { core throws(EngineError) in
            let q = try core.queue(name)
            if q.unfinished == 0 {
                core.effects.append(.call({ callback(true) }))
                return nil
            }
            let id = core.nextWaiterID
            core.nextWaiterID += 1
            q.idleWaiters.append((id, callback))
            return id
        }
    }

    /// Forgets an idle waiter (its long poll timed out). Returns false when it already fired.
    @discardableResult
    public func cancelIdleWait(_ name: String, token: UInt64) -> Bool {
        state.withLock { core in
            guard let q = core.queues[name], let i = q.idleWaiters.firstIndex(where: { $0.0 == token }) else { return false }
            q.idleWaiters.remove(at: i)
            return true
        }
    }

    /// `waitUntilAllOperationsAreFinished()` without blocking a thread.
    public func waitUntilIdle(_ name: String) async throws(EngineError) {
        let token = OneShot()
        try await withCheckedContinuation { (c: CheckedContinuation<Result<Void, EngineError>, Never>) in
            do throws(EngineError) {
                _ = try onIdle(name) { _ in if token.fire() { c.resume(returning: .success(())) } }
            } catch {
                if token.fire() { c.resume(returning: .failure(error)) }
            }
        }.get()
    }
}

/// A one-time latch.
final class OneShot: Sendable {
    private let fired = Atomic<Bool>(false)
    func fire() -> Bool { !fired.exchange(true, ordering: .acquiringAndReleasing) }
}
