/// Every change of an operation's state, in one place: the transition table decides the move
/// (`OperationState.applying`, taken by `OpRecord.take`), and `apply` carries out what the
/// move means for the engine's books, in the manner of a state machine that returns actions.
/// Callers only choose the action and add what is particular to them (an outcome, a record).
extension EngineCore {
    /// Applies `action` to `op`: counts, one event per boolean key that changed (keys that turn
    /// off first, then keys that turn on: KVO's will/did order), then what leaving the old state
    /// and entering the new one mean (slots, the ready heap, the kind's run, finishing).
    /// A move the table refuses throws and changes nothing.
    @discardableResult
    func apply(_ action: OperationAction, to op: OpRecord, dependenciesMet: Bool? = nil) throws(EngineError) -> TransitionEffect {
        let before = op.flags
        let (from, effect) = try op.take(action, dependenciesMet: dependenciesMet ?? (op.unfinishedDependencies == 0))
        let to = op.state
        let q = op.queue
        if from != to {
            q.counts[from.index] -= 1
            q.counts[to.index] += 1
        }
        switch effect {
        case .requestStop, .markCancelled: op.isCancelled = true
        case .none, .pauseRun: break
        }
        let after = op.flags
        if before != after {
            op.revision += 1
            bump(q)
            let off = before & ~after
            let on = after & ~before
            for bit in 0..<5 where off & (1 << bit) != 0 {
                emit(op, Self.flagKeys[bit], .bool(true), .bool(false))
            }
            for bit in 0..<5 where on & (1 << bit) != 0 {
                emit(op, Self.flagKeys[bit], .bool(false), .bool(true))
            }
        }
        guard from != to else { return effect }
        if !op.limitKeys.isEmpty { flowLeft(op, from) }
        if let h = op.host { hostLeft(op, h, from) }
        switch from {
        case .ready:
            op.heapKey = 0  // its heap entry goes stale
        case .executing:
            q.executing -= 1
            op.executedNanos = op.executedNanos.saturatingAdd(now.nanoseconds.saturatingSubtract(op.runStartedAt))
        case .pending, .paused, .finished:
            break
        }
        switch to {
        case .ready:
            op.readySince = now.nanoseconds
            q.push(op)
            dirty.append(q)
        case .executing:
            q.executing += 1
            op.runStartedAt = now.nanoseconds
            if from == .ready, op.readySince > 0 {
                let wait = now.nanoseconds.saturatingSubtract(op.readySince)
                noteHistory(q) { $0.wait.add(nanoseconds: wait) }
            }
        case .paused:
            if effect == .pauseRun {
                op.resumeOnStart = true
                effects.append(.pause(op.kind, context(op, resume: false)))
                dirty.append(q)
            }
        case .finished:
            finished(op)
        case .pending:
            break
        }
        if !op.limitKeys.isEmpty { flowEntered(op, to) }
        if let h = op.host { hostEntered(op, h, to) }
        return effect
    }

    /// The boolean keys in the bit order of `OpRecord.flags`.
    private static let flagKeys: [ChangeKey] = [.isCancelled, .isPaused, .isReady, .isExecuting, .isFinished]

    /// `apply` for a move the caller has already checked (it looked at the state first): a
    /// refusal is an engine bug, caught by the tests' debug builds; in release nothing changes.
    @discardableResult
    func applyChecked(_ action: OperationAction, to op: OpRecord, dependenciesMet: Bool? = nil) -> TransitionEffect {
        do throws(EngineError) {
            return try apply(action, to: op, dependenciesMet: dependenciesMet)
        } catch {
            assertionFailure("the engine asked for a move its table refuses: \(error)")
            return .none
        }
    }

    /// The common end of every operation: edges released, dependents woken, idle waiters told.
    private func finished(_ op: OpRecord) {
        op.finishedAt = now
        op.runToken &+= 1
        op.inBackoff = false
        let q = op.queue
        q.unfinished -= 1
        unfinishedTotal -= 1
        if q.deleted { ops[op.id] = nil }
        if q.barrier === op { q.barrier = nil }
        if op.admission != nil { admissionFinished(op) }
        if !op.isBarrier { historyFinished(op) }
        record(op)
        let dependents = op.dependents
        op.dependents = []
        for d in dependents {
            d.unfinishedDependencies -= 1
            if d.unfinishedDependencies == 0 { makeReadyIfPossible(d) }
        }
        dirty.append(q)
        if q.unfinished == 0 && !q.idleWaiters.isEmpty {
            let waiters = q.idleWaiters
            q.idleWaiters = []
            for (_, w) in waiters { effects.append(.call({ w(true) })) }
        }
    }
}
