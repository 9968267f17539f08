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
        // Kinds and specs first, outside the lock (they need no engine state).
        var resolvedKinds: [any OperationKind] = []
        resolvedKinds.reserveCapacity(elements.count)
        var requests: [OperationRequest] = []
        requests.reserveCapacity(elements.count)
        for (i, e) in elements.enumerated() {
            let kind = try check(e, at: i)
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
        let result: Result<[OperationSnapshot], BatchRefusal>
        do {
            result = try mutate { core throws(EngineError) -> Result<[OperationSnapshot], BatchRefusal> in
                // Every check that needs the engine's state, before anything is added.
                let queues: [QueueRecord]
                switch room(core, elements, at: Array(elements.indices), remote: remote) {
                case let .success(found): queues = found
                case let .failure(refusal): return .failure(refusal)
                }
                do throws(EngineError) { try core.reserveIDs(elements.count) } catch { return .failure(BatchRefusal(index: 0, error: error)) }
                // Then all of it, in order. Edges to earlier elements resolve to their new records.
                var made: [OpRecord] = []
                made.reserveCapacity(elements.count)
                for (i, e) in elements.enumerated() {
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
                    request.dependencies = ids
                    made.append(
                        core.insert(into: queues[i], req: request, kind: resolvedKinds[i], deps: deps, remote: remoteWaits, barrier: false))
                }
                core.settle()
                return .success(made.map(core.status))
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
