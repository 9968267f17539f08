extension QueueEngine {
    // MARK: - operations

    /// Adds an operation (Foundation's `addOperation`).
    @discardableResult
    public func addOperation(to queueName: String, _ request: OperationRequest) throws(EngineError) -> OperationSnapshot {
        try add(to: queueName, request, barrier: false) { core, op, _ in core.status(op) }
    }

    /// Adds an operation as its `admission` decides (API.md "Admission"): a new one, or the
    /// one that absorbed the create (merged), or the one that stands for it (skipped).
    public func admitOperation(to queueName: String, _ request: OperationRequest) throws(EngineError) -> Admitted {
        try add(to: queueName, request, barrier: false) { core, op, outcome in Admitted(operation: core.status(op), outcome: outcome) }
    }

    /// Adds an operation and returns only its id: the cheap form for bulk callers.
    @discardableResult
    public func addOperationID(to queueName: String, _ request: OperationRequest) throws(EngineError) -> OperationID {
        try add(to: queueName, request, barrier: false) { _, op, _ in op.operationID }
    }

    /// `addBarrierBlock`: starts after every operation added before it has finished, and every
    /// operation added after it waits for it.
    @discardableResult
    public func addBarrier(to queueName: String, name: String? = nil) throws(EngineError) -> OperationSnapshot {
        try add(to: queueName, OperationRequest(kind: "barrier", name: name), barrier: true) { core, op, _ in core.status(op) }
    }

    /// The first check of a create: the kind exists and permits this spec (`OperationKind.permit`),
    /// so a refused request hears that before any complaint about its other fields.
    public func checkPermitted(kind: String, spec: JSONValue?) throws(EngineError) {
        guard let k = kinds[kind], kind != "barrier" else { throw .unknownKind(kind, allowed: kindNames) }
        try k.permit(spec: spec)
    }

    /// The kinds a client may name, sorted (the barrier kind is internal).
    public var kindNames: [String] { kinds.keys.filter { $0 != "barrier" }.sorted() }

    func add<T>(
        to queueName: String, _ request: OperationRequest, barrier: Bool, _ answer: (EngineCore, OpRecord, AdmissionOutcome?) -> T
    ) throws(EngineError) -> T {
        guard let kind = kinds[request.kind], barrier || request.kind != "barrier" else {
            throw .unknownKind(request.kind, allowed: kindNames)
        }
        try kind.validate(spec: request.spec)
        // Most operations name no limiter and no fairness key: they skip the flow checks, which
        // cost the flat benchmark 1.6% of its instructions per operation (opqd-bench flow).
        let limited = !request.options.limits.isEmpty
        if limited || request.options.fairnessKey != nil { try Self.validateFlow(request.options) }
        if limited { try ensureLimiters(request.options.limits.map(\.limiter)) }
        if let admission = request.admission { try Self.validate(admission) }
        var request = request
        if request.options.retry == nil { request.options.retry = kind.defaultRetry }
        let remote = try remoteStates(request.dependencies)
        return try mutate { core throws(EngineError) in
            let q = try core.queue(queueName)
            if limited {
                var newKeys: [String: Set<String>] = [:]
                try core.checkLimits(request.options.limits, pending: &newKeys)
            }
            var after: OpRecord?
            var admissionTag: AdmissionTag?
            if let admission = request.admission {
                // A merge or a skip does not use the create's dependencies, but a create naming
                // one that does not exist is refused all the same (404), whatever it becomes.
                for d in request.dependencies where core.ops[d.raw] == nil && remote[d] == nil {
                    throw .operationNotFound(d.description)
                }
                switch try core.plan(admission, in: q, kind: request.kind) {
                case let .skip(op):
                    return answer(core, op, .skipped)
                case let .merge(op):
                    core.absorb(op, request, admission)
                    core.settle()
                    return answer(core, op, .merged)
                case let .create(started):
                    after = started
                    let tag = core.tag(for: admission)
                    admissionTag = tag
                    request.options.notBefore = core.debounceStart(admission, since: core.now, asked: request.options.notBefore)
                }
            }
            try core.reserveIDs(1)
            // Operations set aside for batches across instances count (`prepareBatchPart`).
            guard core.unfinishedTotal + core.heldTotal < core.maxUnfinished else {
                throw .limitReached("at most \(core.maxUnfinished) unfinished operations in all queues (--max-unfinished)", limit: "too-many-operations")
            }
            guard q.unfinished + q.held < configuration.maxUnfinishedPerQueue else {
                throw .limitReached(
                    "at most \(configuration.maxUnfinishedPerQueue) unfinished operations in queue '\(q.name)' (--max-unfinished-per-queue)",
                    limit: "too-many-operations")
            }
            guard request.dependencies.count <= configuration.maxDependencies else {
                throw .invalidArgument(
                    field: "dependencies",
                    detail: "at most \(configuration.maxDependencies) dependencies (--max-dependencies); got \(request.dependencies.count)")
            }
            if barrier && q.unfinished > configuration.maxDependencies {
                throw .limitReached(
                    "a barrier depends on every unfinished operation of its queue: '\(q.name)' has \(q.unfinished), more than the \(configuration.maxDependencies) dependencies one operation may have (--max-dependencies)",
                    limit: "too-many-dependencies")
            }
            var deps: [OpRecord] = []
            deps.reserveCapacity(request.dependencies.count)
            var remoteWaits: [UInt64] = []
            for d in request.dependencies {
                if let dep = core.ops[d.raw] {
                    deps.append(dep)
                } else if let finished = remote[d] {
                    if !finished { remoteWaits.append(d.raw) }
                } else {
                    throw .operationNotFound(d.description)
                }
            }
            // replaceWaiting: the new one waits for the started one of its key.
            if let after, !deps.contains(where: { $0 === after }) {
                deps.append(after)
                request.dependencies.append(after.operationID)
            }
            let op = core.insert(into: q, req: request, kind: kind, deps: deps, remote: remoteWaits, barrier: barrier, admission: admissionTag)
            core.settle()
            return answer(core, op, request.admission == nil ? nil : .created)
        }
    }

    /// The operation's status.
    public func operation(_ id: OperationID) throws(EngineError) -> OperationSnapshot {
        try read { core throws(EngineError) in try core.status(core.op(id)) }
    }

    /// Several operations' statuses in one locked read (nil for an id it does not have).
    public func operations(_ ids: [OperationID]) -> [OperationSnapshot?] {
        (try? read { core throws(EngineError) in ids.map { id in core.ops[id.raw].map(core.status) } }) ?? ids.map { _ in nil }
    }

    /// The operation's revision (for ETags), without building its status.
    public func revision(of id: OperationID) throws(EngineError) -> UInt64 {
        try read { core throws(EngineError) in try core.op(id).revision }
    }

    /// A page of a queue's operations, oldest first, after the cursor `after`.
    public func operations(
        in queueName: String, state filter: OperationState? = nil, after: OperationID? = nil,
        limit: Int = 100
    ) throws(EngineError) -> (operations: [OperationSnapshot], next: OperationID?) {
        try operations(in: queueName, matching: OperationFilter(state: filter), after: after, limit: limit, scanLimit: .max)
    }

    /// A page of the queue's operations that `filter` matches, oldest first, after the cursor
    /// `after`, looking at no more than `scanLimit` operations (so a filter that rarely matches
    /// costs one request a bounded time under the lock).
    ///
    /// `next` is nil only when no operation after the page matches. When the scan budget runs
    /// out first, the page may be short (even empty) and `next` is the last operation looked
    /// at, which need not be on the page: following `next` until it is nil visits every match
    /// exactly once.
    public func operations(
        in queueName: String, matching filter: OperationFilter, after: OperationID? = nil, limit: Int = 100, scanLimit: Int
    ) throws(EngineError) -> (operations: [OperationSnapshot], next: OperationID?) {
        try read { core throws(EngineError) in
            let q = try core.queue(queueName)
            var lo = 0, hi = q.ops.count
            if let after {
                while lo < hi {
                    let mid = (lo + hi) / 2
                    if q.ops[mid].id <= after.raw { lo = mid + 1 } else { hi = mid }
                }
            }
            let limit = max(1, limit)
            // At least one page's worth, so an unfiltered page is never cut short.
            var budget = max(scanLimit, limit)
            var page: [OperationSnapshot] = []
            var i = lo
            while i < q.ops.count && page.count < limit && budget > 0 {
                let op = q.ops[i]
                if filter.matches(op) { page.append(core.status(op)) }
                i += 1
                budget -= 1
            }
            if page.count < limit {
                // The budget ran out before the end: carry on after the last one looked at.
                return (page, i < q.ops.count ? q.ops[i - 1].operationID : nil)
            }
            // A full page: is there a match after it? Looked for within what is left of the
            // budget; past it, `next` is given and the next page may turn out empty.
            var more = false
            while i < q.ops.count {
                if budget == 0 || filter.matches(q.ops[i]) { more = true; break }
                i += 1
                budget -= 1
            }
            return (page, more ? page.last?.id : nil)
        }
    }

    /// `cancel()`; with `cascade`, also every operation that transitively depends on it.
    @discardableResult
    public func cancel(_ id: OperationID, cascade: Bool = false) throws(EngineError) -> OperationSnapshot {
        try changing(id) { core, op throws(EngineError) in
            if op.state == .finished { throw .invalidTransition(from: .finished, action: .cancel) }
            if cascade { core.cancelCascading(op) } else { core.cancelOp(op) }
        }
    }

    /// Pauses a pending, ready or executing operation. It frees its queue slot and holds back
    /// its dependents.
    @discardableResult
    public func pause(_ id: OperationID) throws(EngineError) -> OperationSnapshot {
        try changing(id) { core, op throws(EngineError) in
            try core.apply(.pause, to: op)
            core.record(op)
        }
    }

    /// Resumes a paused operation: back to ready (or pending while dependencies are
    /// unfinished); given a slot again, its kind continues the work.
    @discardableResult
    public func resume(_ id: OperationID) throws(EngineError) -> OperationSnapshot {
        try changing(id) { core, op throws(EngineError) in
            // A `notBefore` still ahead holds back an operation that never started, as its
            // dependencies do; it goes back to pending and waits for the time to come.
            let timeHasCome = op.hasStarted || (op.options.notBefore.map { $0 <= core.now } ?? true)
            try core.apply(.resume, to: op, dependenciesMet: op.unfinishedDependencies == 0 && timeHasCome)
            if op.state == .pending { core.makeReadyIfPossible(op) }
            core.record(op)
        }
    }

    /// Before it starts: changes its priority and/or replaces its dependencies. A dependency
    /// that would close a cycle is refused.
    @discardableResult
    public func update(_ id: OperationID, queuePriority: QueuePriority? = nil, dependencies: [OperationID]? = nil) throws(EngineError) -> OperationSnapshot {
        let remote = try remoteStates(dependencies ?? [])
        // A cycle through operations held elsewhere: the directory walks every instance's
        // committed dependencies (`core.reaches` below, the ones held here, committed or not).
        // The walk only for a change that can be made: the operation is held here and has not
        // started (checked again under the lock below), the list is within the limit.
        if let dependencies, !dependencies.isEmpty, dependencies.count <= configuration.maxDependencies + 1, let directory = self.remote,
            try read({ core throws(EngineError) -> Bool in
                let op = try core.op(id)
                return !(op.state == .finished || op.hasStarted || op.state == .executing)
            }),
            try directory.reaches(id, from: dependencies)
        {
            throw .dependencyCycle("making \(id) depend on \(dependencies.map(\.description).joined(separator: ", ")) would close a cycle")
        }
        return try changing(id) { core, op throws(EngineError) in
            if op.state == .finished || op.hasStarted || op.state == .executing {
                throw .alreadyStarted(id.description)
            }
            var newDeps: [OpRecord]? = nil
            var newRemote: [UInt64] = []
            var dependencies = dependencies
            // An operation added after a barrier keeps waiting for it, whatever else it names.
            if var list = dependencies, let b = op.implicitBarrier, let barrier = core.ops[b], barrier.state != .finished,
                !list.contains(OperationID(raw: b))
            {
                list.append(OperationID(raw: b))
                dependencies = list
            }
            if let dependencies, dependencies.count > configuration.maxDependencies + 1 {
                throw .invalidArgument(
                    field: "dependencies", detail: "at most \(configuration.maxDependencies) dependencies (--max-dependencies); got \(dependencies.count)")
            }
            if let dependencies {
                var list: [OpRecord] = []
                for d in dependencies {
                    if let dep = core.ops[d.raw] {
                        list.append(dep)
                    } else if let finished = remote[d] {
                        if !finished { newRemote.append(d.raw) }
                    } else {
                        throw .operationNotFound(d.description)
                    }
                }
                if core.reaches(op.id, from: dependencies) {
                    throw .dependencyCycle("making \(id) depend on \(dependencies.map(\.description).joined(separator: ", ")) would close a cycle")
                }
                newDeps = list
            }
            if let p = queuePriority, p != op.priority {
                let old = op.priority
                op.priority = p
                op.revision += 1
                core.bump(op.queue)
                core.emit(op, .queuePriority, .priority(old), .priority(p))
                if op.state == .ready {
                    op.queue.push(op)  // the old heap entry goes stale
                    core.dirty.append(op.queue)
                }
            }
            if let newDeps, let dependencies {
                for depID in op.dependencyIDs {
                    if let dep = core.ops[depID.raw], let i = dep.dependents.firstIndex(where: { $0 === op }) {
                        dep.dependents.remove(at: i)
                    }
                }
                core.dropRemoteWaits(op)
                op.dependencyIDs = dependencies
                op.unfinishedDependencies = 0
                var seen = Set<ObjectIdentifier>()
                for dep in newDeps where dep.state != .finished && seen.insert(ObjectIdentifier(dep)).inserted {
                    dep.dependents.append(op)
                    op.unfinishedDependencies += 1
                }
                if !newRemote.isEmpty {
                    for r in newRemote { core.waitRemote(op, for: r) }
                    core.effects.append(.watchRemote(newRemote.map { OperationID(raw: $0) }))
                }
                op.revision += 1
                if op.state == .ready && op.unfinishedDependencies > 0 {
                    core.applyChecked(.dependencyAdded, to: op)
                } else if op.state == .pending {
                    core.makeReadyIfPossible(op)
                }
            }
            core.record(op)
        }
    }

    /// Runs `body` on the operation under the lock, starts what the change made startable,
    /// and answers the operation's status after it.
    private func changing(_ id: OperationID, _ body: (EngineCore, OpRecord) throws(EngineError) -> Void) throws(EngineError) -> OperationSnapshot {
        try mutate { core throws(EngineError) in
            let op = try core.op(id)
            try body(core, op)
            core.settle()
            return core.status(op)
        }
    }
}
