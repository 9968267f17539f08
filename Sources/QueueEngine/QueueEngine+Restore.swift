extension QueueEngine {
    /// Rebuilds queues and operations read back from a store, before serving. Every queue and
    /// operation comes back in the state it was acknowledged in; operations that were
    /// executing are handed to their kind's `recover` (resume, retry, fail or keep). The
    /// event sequence continues after `lastSeq`.
    ///
    /// `remote` (a cluster instance, see `adopt`): for dependencies outside `recovered`,
    /// whether they exist elsewhere and are finished; one that is not finished is waited for
    /// remotely. Without an entry, a dependency that is not held is taken as finished (a
    /// single store purges only finished operations). Queues and operations already held are
    /// left as they are.
    ///
    /// `cascades`: the remote ones a cascade cancelled, and when. In a cluster (a remote
    /// directory is set), an unfinished operation that was added before a cascade cancelled one
    /// of its dependencies, here or elsewhere, is cancelled the same way: the instance that held
    /// it when the cascade was asked stopped (or gave its queue up) before it did so. (One whose
    /// dependencies were replaced after the cascade by a list naming that operation is cancelled
    /// too: the time of that change is not stored.) A single instance commits a cascade whole,
    /// so it has none to finish.
    public func restore(_ recovered: RecoveredState, remote: [OperationID: Bool] = [:], cascades: [OperationID: Timestamp] = [:]) {
        let clustered = self.remote != nil
        try? mutate { core throws(EngineError) in
            // Saturating: a damaged store's seq must not trap (a sane one is far below 2^62).
            core.nextSeq = max(core.nextSeq, min(recovered.lastSeq, UInt64.max >> 2) + 1)
            // Never back: an adoption (a cluster instance) brings the generation it took for it.
            core.generation = max(core.generation, recovered.generation)
            for ls in recovered.limiters where core.limiters[ls.name] == nil {
                let l = LimiterRecord(name: ls.name, settings: ls.settings, createdAt: ls.createdAt)
                l.revision = min(ls.revision, UInt64.max >> 2) + 1
                core.limiters[ls.name] = l
            }
            for hs in recovered.hosts { core.restoreHost(hs) }
            for qs in recovered.queues where core.queues[qs.name] == nil {
                let q = QueueRecord(
                    name: qs.name, maxConcurrent: qs.maxConcurrentOperationCount, isSuspended: qs.isSuspended, createdAt: qs.createdAt,
                    generation: recovered.generation)
                // Past the stored revision, which is the newest one committed (every commit that
                // moves it stores it), and stored in the first commit after this one: a restart or
                // takeover never shows a revision that was shown before with other content. (One
                // shown but never committed, lost in a crash, can come again; its ETag, which names
                // the generation, cannot.)
                q.revision = min(qs.revision, UInt64.max >> 2) + 1
                // Buckets start full after a restart (their tokens are not stored).
                q.rate = qs.rateLimit.map { TokenBucket($0, now: core.now.nanoseconds) }
                q.fairnessWeights = qs.fairnessWeights
                core.queues[qs.name] = q
                core.releasedQueues.remove(qs.name)
                core.touch(q)
            }
            // Before anything of the operations runs (a restart's new attempt is a start).
            // Queues that had no history here yet (all of them at a start; those taken over
            // in a cluster) get theirs, and the sum over queues takes it in.
            var fresh: [String: QueueHistory] = [:]
            for row in recovered.history {
                guard let q = core.queues[row.queue], !q.deleted else { continue }
                let h: QueueHistory
                if let f = fresh[q.name] {
                    h = f
                } else if q.history == nil {
                    h = core.history(q)
                    fresh[q.name] = h
                } else {
                    continue
                }
                h.restore(row)
            }
            for h in fresh.values { core.historyTotal.merge(h) }
            var restored: [OpRecord] = []
            var admitted: [OpRecord] = []
            for s in recovered.operations.sorted(by: { $0.id < $1.id }) {
                // Ids the engine could never have handed out (its ready heap keeps 60 bits).
                guard s.id.raw > 0, s.id.raw <= QueueRecord.idMask, core.ops[s.id.raw] == nil, let q = core.queues[s.queue], !q.deleted
                else { continue }
                let kind = core.kinds[s.kind] ?? ImmediateKind()
                let req = OperationRequest(
                    kind: s.kind, name: s.name, queuePriority: s.queuePriority, dependencies: s.dependencies,
                    spec: s.spec, options: s.options)
                let op = OpRecord(
                    id: s.id.raw, queue: q, request: req, kind: kind, createdAt: s.createdAt, isBarrier: s.kind == "barrier",
                    state: s.state)
                op.outcome = s.outcome
                op.isCancelled = s.isCancelled
                op.progress = s.progress
                op.attempt = s.attempt
                op.result = s.result
                op.error = s.error
                op.startedAt = s.startedAt
                op.finishedAt = s.finishedAt
                op.revision = min(s.revision, UInt64.max >> 2) + 1
                op.executedNanos = max(0, Timestamp.clampedNanoseconds(s.executedSeconds))
                op.kindState = s.kindState
                op.cascadeAt = s.cascadeAt
                op.scheduleTag = s.schedule.map(ScheduleTagBox.init)
                if let tag = s.admission {
                    op.admission = AdmissionTagBox(tag)
                    if s.state != .finished { admitted.append(op) }
                }
                op.runToken = 1
                if s.state == .paused && s.startedAt != nil { op.resumeOnStart = true }
                core.ops[op.id] = op
                core.released.remove(op.id)
                core.nextID = max(core.nextID, op.id + 1)
                q.ops.append(op)
                q.counts[op.state.index] += 1
                if op.state != .finished {
                    q.unfinished += 1
                    core.unfinishedTotal += 1
                    if op.isBarrier { q.barrier = op }
                }
                core.attachFlow(op)
                core.attachHost(op)
                restored.append(op)
            }
            // Each admission key's operations join its queue's index in the order they were made,
            // not by id: ids come from the block of the instance that made them, so a queue that
            // changed hands has newer operations with lower ids. Started ones first: the one not
            // started of a debounce key (there is at most one) must be the one the key names.
            admitted.sort { a, b in
                (a.hasStarted ? 0 : 1, a.createdAt.nanoseconds, a.id) < (b.hasStarted ? 0 : 1, b.createdAt.nanoseconds, b.id)
            }
            for op in admitted { if let tag = op.admission?.tag { core.admissionIndex(op.queue).add(op, tag) } }
            // Edges: every unfinished operation waits for its unfinished dependencies, here or
            // elsewhere; operations held before that waited for a restored one remotely now
            // wait for it here.
            var watch: [OperationID] = []
            var cascading: [OpRecord] = []
            for op in restored where op.state != .finished {
                var cascaded = false
                for d in op.dependencyIDs {
                    if let dep = core.ops[d.raw] {
                        if dep.state != .finished {
                            dep.dependents.append(op)
                            op.unfinishedDependencies += 1
                        } else if let at = dep.cascadeAt, op.createdAt <= at {
                            cascaded = true
                        }
                    } else if remote[d] == false {
                        core.waitRemote(op, for: d.raw)
                        watch.append(d)
                    } else if let at = cascades[d], op.createdAt <= at {
                        cascaded = true
                    }
                }
                if cascaded && clustered && !op.hasStarted { cascading.append(op) }
            }
            for op in restored { core.remoteBecameLocal(op) }
            if !watch.isEmpty { core.effects.append(.watchRemote(watch)) }
            for op in cascading { core.cancelCascading(op) }
            for op in restored {
                switch op.state {
                case .ready:
                    if op.unfinishedDependencies > 0 {
                        core.applyChecked(.dependencyAdded, to: op)
                    } else {
                        // Its wait counts from now: when it became ready before is not stored.
                        op.readySince = core.now.nanoseconds
                        op.queue.push(op)
                        core.dirty.append(op.queue)
                    }
                case .pending:
                    core.makeReadyIfPossible(op)
                case .executing:
                    op.queue.executing += 1
                    op.runStartedAt = core.now.nanoseconds
                    if op.isCancelled {
                        core.completeOp(op, .failed(type: "cancelled", detail: "cancelled before a restart"))
                        continue
                    }
                    if recovered.poisoned.contains(OperationID(raw: op.id)) {
                        // Whatever retries it has left: it may be what kills the server.
                        core.completeOp(
                            op,
                            .failed(
                                type: "crashed-server",
                                detail: "the server stopped uncleanly 3 times in a row while this operation was executing; it is not run again"))
                        core.record(op)
                        continue
                    }
                    switch op.kind.recover(op.snapshot()) {
                    case .resume:
                        // Never paused: it has executed since it started (downtime included).
                        if op.executedNanos == 0, let started = op.startedAt {
                            op.executedNanos = max(0, core.now.nanoseconds.saturatingSubtract(started.nanoseconds))
                        }
                        core.beginRun(op, resume: true)
                    case .retry:
                        let old = op.attempt
                        op.attempt = op.attempt == Int.max ? op.attempt : op.attempt + 1
                        op.runToken &+= 1
                        op.executedNanos = 0
                        core.emit(op, .attempt, .int(old), .int(op.attempt))
                        if let h = op.host, h.room(now: core.now.nanoseconds) == 0 {
                            // Its host came back held (open): the new attempt waits for it, ready.
                            core.holdRun(op)
                            continue
                        }
                        op.host?.takeStart(op)
                        core.beginRun(op, resume: false)
                    case let .fail(type):
                        core.completeOp(op, .failed(type: type, detail: "the server stopped while attempt \(op.attempt) was executing"))
                    case .keep:
                        core.beginRun(op, resume: true, takingUp: true)
                    }
                    core.record(op)
                case .paused:
                    // Paused while it executed, driven from outside: the kind takes up what it
                    // saved (a worker's lease), and starts nothing.
                    if op.hasStarted, op.kind.recover(op.snapshot()) == .keep {
                        core.effects.append(.takeUpPaused(op.kind, core.context(op, resume: true)))
                    }
                case .finished:
                    break
                }
            }
            for ss in recovered.schedules { core.restoreSchedule(ss, handedOver: recovered.handedOver.contains(ss.queue)) }
        }
    }
}
