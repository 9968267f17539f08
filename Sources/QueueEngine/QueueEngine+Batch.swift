/// A dependency of one element of a batch: an operation that exists, or an earlier element.
public enum BatchDependency: Sendable, Equatable {
    case operation(OperationID)
    /// The element at this index of the same batch; it must come before the one that names it.
    case element(Int)
}

/// One operation of `addOperations`: the queue it goes to and what a create would say, with
/// its dependencies as `dependencies` here (the request's own list is not read).
public struct BatchElement: Sendable {
    public var queue: String
    public var request: OperationRequest
    public var dependencies: [BatchDependency]
    public init(queue: String, request: OperationRequest, dependencies: [BatchDependency] = []) {
        self.queue = queue; self.request = request; self.dependencies = dependencies
    }
}

/// A refused batch: the element that was refused (its index) and why. Nothing was added.
public struct BatchRefusal: Error, Sendable, Equatable {
    public let index: Int
    public let error: EngineError
    public init(index: Int, error: EngineError) { self.index = index; self.error = error }
}

extension QueueEngine {
    /// `addOperations(_:waitUntilFinished:)`, across queues and atomic: every element is checked
    /// (its kind and spec, its queue, its dependencies, and the limits for the whole batch)
    /// before any is added; then all are added in order, in one locked section, so one commit
    /// to the store holds them all and observers hear of them only once all are in. A refusal
    /// names the first element that failed and changes nothing (no event, no id used).
    ///
    /// An element may depend on an earlier element (`.element(i)` with i below its own index)
    /// and on operations that exist. No cycle can form: new operations have no dependents
    /// except later elements, and an element can only name earlier ones, so the edges among
    /// them all point backwards in the batch.
    @discardableResult
    public func addOperations(_ elements: [BatchElement]) throws(BatchRefusal) -> [OperationSnapshot] {
        try admitOperations(elements).map(\.operation)
    }

    /// `addOperations`, with each element's admission (API.md "Admission"): its entry is the
    /// operation that now stands for it (new, merged into, or skipped for), and what happened.
    /// An element may be absorbed by an earlier one of the same batch; one that depends on it
    /// (`ref:`) then depends on the operation that absorbed it.
    public func admitOperations(_ elements: [BatchElement]) throws(BatchRefusal) -> [Admitted] {
        // Kinds and specs first, outside the lock (they need no engine state).
        var resolvedKinds: [any OperationKind] = []
        resolvedKinds.reserveCapacity(elements.count)
        var requests: [OperationRequest] = []
        requests.reserveCapacity(elements.count)
        for (i, e) in elements.enumerated() {
            let kind = try check(e, at: i)
            if let admission = e.request.admission {
                do throws(EngineError) { try Self.validate(admission) } catch { throw BatchRefusal(index: i, error: error) }
            }
            var request = e.request
            if request.options.retry == nil { request.options.retry = kind.defaultRetry }
            resolvedKinds.append(kind)
            requests.append(request)
        }
        let remote: [OperationID: Bool]
        do throws(EngineError) {
            try ensureLimiters(elements.flatMap { $0.request.options.limits.map(\.limiter) })
            remote = try remoteStates(named: elements.map(\.dependencies))
        } catch {
            throw BatchRefusal(index: 0, error: error)
        }
        let result: Result<[Admitted], BatchRefusal>
        do {
            result = try mutate { core throws(EngineError) -> Result<[Admitted], BatchRefusal> in
                // Every check that needs the engine's state, before anything is added.
                let queues: [QueueRecord]
                switch room(core, elements, at: Array(elements.indices), remote: remote) {
                case let .success(found): queues = found
                case let .failure(refusal): return .failure(refusal)
                }
                // What each admission does, decided for the whole batch before anything changes
                // (a refusal, a merge across kinds, leaves nothing behind).
                let plans: [BatchAdmission?]
                switch core.planBatch(elements, queues: queues) {
                case let .success(found): plans = found
                case let .failure(refusal): return .failure(refusal)
                }
                do throws(EngineError) { try core.reserveIDs(elements.count) } catch { return .failure(BatchRefusal(index: 0, error: error)) }
                // Then all of it, in order. Edges to earlier elements resolve to their new records.
                var made: [OpRecord] = []
                made.reserveCapacity(elements.count)
                var outcomes: [AdmissionOutcome?] = []
                outcomes.reserveCapacity(elements.count)
                for (i, e) in elements.enumerated() {
                    var after: OpRecord?
                    if let plan = plans[i], let admission = e.request.admission {
                        switch plan {
                        case let .skip(s):
                            made.append(s.resolve(made))
                            outcomes.append(.skipped)
                            continue
                        case let .merge(s):
                            let op = s.resolve(made)
                            // `requests[i]`: with the kind's default retry, as a single create's merge.
                            core.absorb(op, requests[i], admission)
                            made.append(op)
                            outcomes.append(.merged)
                            continue
                        case let .create(s):
                            after = s?.resolve(made)
                        }
                    }
                    var deps: [OpRecord] = []
                    deps.reserveCapacity(e.dependencies.count)
                    var ids: [OperationID] = []
                    ids.reserveCapacity(e.dependencies.count)
                    var remoteWaits: [UInt64] = []
                    for d in e.dependencies {
                        switch d {
                        case let .operation(id):
                            if let op = core.ops[id.raw] {
                                deps.append(op); ids.append(id)
                            } else if let finished = remote[id] {
                                ids.append(id)
                                if !finished { remoteWaits.append(id.raw) }
                            }
                        case let .element(k):
                            deps.append(made[k]); ids.append(made[k].operationID)
                        }
                    }
                    var request = requests[i]
                    var tag: AdmissionTag?
                    if let admission = request.admission {
                        tag = core.tag(for: admission)
                        request.options.notBefore = core.debounceStart(admission, since: core.now, asked: request.options.notBefore)
                        if let after, !deps.contains(where: { $0 === after }) {
                            deps.append(after); ids.append(after.operationID)
                        }
                    }
                    request.dependencies = ids
                    made.append(
                        core.insert(
                            into: queues[i], req: request, kind: resolvedKinds[i], deps: deps, remote: remoteWaits, barrier: false, admission: tag))
                    outcomes.append(request.admission == nil ? nil : .created)
                }
                core.settle()
                return .success(zip(made, outcomes).map { Admitted(operation: core.status($0), outcome: $1) })
            }
        } catch {
            // The body answers refusals as a value; nothing in it throws.
            throw BatchRefusal(index: 0, error: error)
        }
        return try result.get()
    }

    /// The checks of element `i` that need no engine state: its kind and spec, and its
    /// dependencies' count and order. Returns its kind.
    func check(_ e: BatchElement, at i: Int) throws(BatchRefusal) -> any OperationKind {
        do throws(EngineError) {
            guard let kind = kinds[e.request.kind], e.request.kind != "barrier" else {
                throw .unknownKind(e.request.kind, allowed: kindNames)
            }
            try kind.permit(spec: e.request.spec)
            try kind.validate(spec: e.request.spec)
            try Self.validateFlow(e.request.options)
            guard e.dependencies.count <= configuration.maxDependencies else {
                throw .invalidArgument(
                    field: "dependencies",
                    detail: "at most \(configuration.maxDependencies) dependencies (--max-dependencies); got \(e.dependencies.count)")
            }
            for (j, d) in e.dependencies.enumerated() {
                if case let .element(k) = d, !(0..<i).contains(k) {
                    throw .invalidArgument(field: "dependencies[\(j)]", detail: "may name only an earlier element of the batch")
                }
            }
            return kind
        } catch {
            throw BatchRefusal(index: i, error: error)
        }
    }

    /// The checks of elements `indices` (in order) that need the engine's state: each one's
    /// queue and named operations exist, and the limits on unfinished operations have room
    /// for them all, ids set aside for batches across instances counted. Returns their queues,
    /// or the first refusal. Called under the engine's lock.
    func room(_ core: EngineCore, _ elements: [BatchElement], at indices: [Int], remote: [OperationID: Bool]) -> Result<[QueueRecord], BatchRefusal> {
        var queues: [QueueRecord] = []
        queues.reserveCapacity(indices.count)
        var added: [ObjectIdentifier: Int] = [:]
        var newKeys: [String: Set<String>] = [:]
        for (n, i) in indices.enumerated() {
            let e = elements[i]
            guard let q = core.queues[e.queue] else { return .failure(BatchRefusal(index: i, error: .queueNotFound(e.queue))) }
            do throws(EngineError) {
                try core.checkLimits(e.request.options.limits, pending: &newKeys)
            } catch {
                return .failure(BatchRefusal(index: i, error: error))
            }
            for d in e.dependencies {
                if case let .operation(id) = d, core.ops[id.raw] == nil, remote[id] == nil {
                    return .failure(BatchRefusal(index: i, error: .operationNotFound(id.description)))
                }
            }
            let inQueue = added[ObjectIdentifier(q), default: 0] + 1
            added[ObjectIdentifier(q)] = inQueue
            guard core.unfinishedTotal + core.heldTotal < core.maxUnfinished - n else {
                return .failure(
                    BatchRefusal(
                        index: i,
                        error: .limitReached(
                            "at most \(core.maxUnfinished) unfinished operations in all queues (--max-unfinished); \(core.unfinishedTotal + core.heldTotal) now, the batch adds \(indices.count)",
                            limit: "too-many-operations")))
            }
            guard q.unfinished + q.held < configuration.maxUnfinishedPerQueue - (inQueue - 1) else {
                return .failure(
                    BatchRefusal(
                        index: i,
                        error: .limitReached(
                            "at most \(configuration.maxUnfinishedPerQueue) unfinished operations in queue '\(q.name)' (--max-unfinished-per-queue); \(q.unfinished + q.held) now, the batch adds \(inQueue) or more",
                            limit: "too-many-operations")))
            }
            queues.append(q)
        }
        return .success(queues)
    }
}
