extension QueueEngine {
    // MARK: - reports from kinds

    func complete(_ id: OperationID, token: UInt32, _ completion: Completion, host verdict: HostVerdict? = nil) {
        try? mutate { core throws(EngineError) in
            guard let op = core.ops[id.raw], op.runToken == token else { return }
            switch op.state {
            case .executing:
                if let verdict, let h = op.host {
                    if case let .throttle(retryAfter) = verdict, core.hostThrottled(op, h, retryAfter: retryAfter) { return }
                    core.hostReport(op, h, verdict, completion)
                }
                core.runEnded(op, completion)
            case .paused where op.hasStarted: op.parkedCompletion = completion
            default: return
            }
        }
    }

    /// `complete` for many runs in one locked step (one drain, one queue record per queue).
    /// An end of a paused operation is parked until its resume; with `saving`, the kind state it
    /// answers for that end is saved with the operation in the same step (the end then survives
    /// a restart or a handover, and no other save of the kind's replaces it: `saveKindStates`).
    func complete(_ items: [(id: OperationID, token: UInt32, completion: Completion)], saving: ((Completion, Int) -> JSONValue)? = nil) {
        try? mutate { core throws(EngineError) in
            for (id, token, completion) in items {
                guard let op = core.ops[id.raw], op.runToken == token else { continue }
                switch op.state {
                case .executing: core.runEnded(op, completion)
                case .paused where op.hasStarted:
                    op.parkedCompletion = completion
                    if let saving {
                        op.kindState = saving(completion, op.attempt)
                        core.record(op)
                    }
                default: continue
                }
            }
        }
    }

    func timeoutFired(_ id: OperationID, token: UInt32) {
        try? mutate { core throws(EngineError) in
            guard let op = core.ops[id.raw], op.runToken == token, op.state == .executing else { return }
            // Stop the work; its own report will carry a stale token and be ignored.
            core.effects.append(.cancel(op.kind, core.context(op, resume: false)))
            op.runToken &+= 1
            let limit = op.options.timeout ?? 0
            let completion = Completion.failed(type: "timeout", detail: "attempt \(op.attempt) ran longer than its timeout of \(limit) s")
            // A target too slow to answer is a failure of its host.
            if let h = op.host { core.hostReport(op, h, .failure, completion) }
            core.runEnded(op, completion)
        }
    }

    func retryFired(_ id: OperationID, token: UInt32) {
        try? mutate { core throws(EngineError) in
            guard let op = core.ops[id.raw], op.runToken == token, op.state == .executing, !op.isCancelled else { return }
            // Each attempt is a start: it waits for its queue's and its limiters' tokens.
            let wait = core.attemptWait(op)
            if wait < 0 { return }
            if wait > 0 {
                core.effects.append(.retry(id, token: token, seconds: wait.asSeconds + 0.00005))
                return
            }
            op.runStartedAt = core.now.nanoseconds
            core.beginRun(op, resume: false)
        }
    }

    func saveKindState(_ id: OperationID, token: UInt32, _ state: JSONValue?) {
        try? mutate { core throws(EngineError) in
            guard let op = core.ops[id.raw], op.runToken == token, op.state != .finished, op.parkedCompletion == nil else { return }
            op.kindState = state
            core.record(op)
        }
    }

    /// `saveKindState` for many runs in one locked step.
    func saveKindStates(_ items: [(id: OperationID, token: UInt32, state: JSONValue?)]) {
        try? mutate { core throws(EngineError) in
            for (id, token, state) in items {
                // Not over a parked end's saved state (a heartbeat saved after the finish).
                guard let op = core.ops[id.raw], op.runToken == token, op.state != .finished, op.parkedCompletion == nil else { continue }
                op.kindState = state
                core.record(op)
            }
        }
    }

    func isCurrentRun(_ id: OperationID, token: UInt32) -> Bool {
        state.withLock { core in
            guard let op = core.ops[id.raw] else { return false }
            return op.runToken == token && op.state == .executing
        }
    }

    func reportProgress(_ id: OperationID, token: UInt32, _ progress: OperationProgress) {
        try? mutate { core throws(EngineError) in
            guard let op = core.ops[id.raw], op.runToken == token, op.state != .finished else { return }
            let old = op.progress
            guard old != progress else { return }
            op.progress = progress
            op.revision += 1
            core.emit(op, .progress, old.map { .progress($0) } ?? .none, .progress(progress))
            core.record(op)
        }
    }
}
