/// What `GET /v1/queues/{name}/archive` reads: the queue's settings and its unfinished
/// operations, taken in one locked section, so no change lands between two of them.
public struct QueueArchive: Sendable {
    public let queue: QueueSnapshot
    /// The unfinished operations in creation order (the order they were added, which is the
    /// order a queue starts operations of equal priority), each with only its unfinished
    /// dependencies: a finished one holds nothing back, and its id, restored on another server,
    /// could name an unrelated operation there. Empty when `unfinished` is over the limit the
    /// caller gave.
    public let operations: [OperationSnapshot]
    /// How many unfinished operations the queue has.
    public let unfinished: Int
}

/// One operation of an archive to restore: what a create would say, its dependencies (inside
/// the archive by element index, in either direction; outside it by id), whether it is paused,
/// the attempt it was at, and whether it is a barrier.
public struct ArchiveElement: Sendable {
    public var request: OperationRequest
    /// `.element(k)` names element `k` of the same archive (any index but its own);
    /// `.operation(id)` an operation outside it, kept if it exists here, dropped otherwise.
    public var dependencies: [BatchDependency]
    public var isPaused: Bool
    /// The attempt it was at; 0 when it never started. A restored operation starts as this
    /// attempt again (an executing one is archived as one to run again).
    public var attempt: Int
    /// A barrier (`addBarrierBlock`): restored as a barrier of the queue, depending on every
    /// operation restored before it; its own listed dependencies are not read.
    public var isBarrier: Bool
    public init(request: OperationRequest, dependencies: [BatchDependency], isPaused: Bool = false, attempt: Int = 0, isBarrier: Bool = false) {
        self.request = request; self.dependencies = dependencies; self.isPaused = isPaused
        self.attempt = attempt; self.isBarrier = isBarrier
    }
}

/// A refused restore; nothing changed (no queue, no operation, no event).
public enum ArchiveRefusal: Error, Sendable, Equatable {
    /// About the queue or the archive as a whole (`queueNotIdle` when the queue has
    /// unfinished operations).
    case queue(EngineError)
    /// About element `index`.
    case element(Int, EngineError)
}

/// What a restore made: the new operation of each element, in the archive's order, and the
/// outside dependencies that name no operation here (dropped), in the order met.
public struct ArchiveRestore: Sendable {
    public let queue: QueueSnapshot
    public let operations: [OperationSnapshot]
    public let droppedDependencies: [OperationID]
}

extension QueueEngine {
    /// The queue's settings and every unfinished operation, read under the lock in one go.
    /// When the queue has more than `limit` unfinished operations none are copied (the caller
    /// refuses), so an export never holds more than `limit` snapshots.
    public func archive(queue name: String, limit: Int) throws(EngineError) -> QueueArchive {
        try read { core throws(EngineError) in
            let q = try core.queue(name)
            let snapshot = q.snapshot(defaultMax: core.defaultMaxConcurrent)
            guard q.unfinished <= limit else { return QueueArchive(queue: snapshot, operations: [], unfinished: q.unfinished) }
            var ops: [OperationSnapshot] = []
            ops.reserveCapacity(q.unfinished)
            for op in q.ops where op.state != .finished {
                var snapshot = op.snapshot()
                // Unfinished ones only: held here, or held elsewhere and still waited for.
                snapshot.dependencies.removeAll { id in core.ops[id.raw].map { $0.state == .finished } ?? !op.remoteWaits.contains(id.raw) }
                ops.append(snapshot)
            }
            return QueueArchive(queue: snapshot, operations: ops, unfinished: q.unfinished)
        }
    }

    /// Restores an archive into the queue `name`, which must not exist or have no unfinished
    /// operation. All or nothing, like ``addOperations(_:)``: every element is checked (kind,
    /// spec, dependencies, limits) before anything changes; then, in one locked section (so one
    /// commit), the queue is created (or given the archive's settings), every operation added
    /// in the archive's order (an element that depends on a later one comes after it), the
    /// paused ones paused and each given its attempt, before anything can start.
    public func restoreArchive(
        into name: String, maxConcurrentOperationCount: Int, isSuspended: Bool, rateLimit: RateLimit? = nil,
        fairnessWeights: [String: Int] = [:], _ elements: [ArchiveElement]
    ) throws(ArchiveRefusal) -> ArchiveRestore {
        do throws(EngineError) {
            try Self.validateQueueName(name)
            try Self.validateMax(maxConcurrentOperationCount)
            if let rateLimit { try Self.validateRate(rateLimit, field: "queue.rateLimit") }
            try Self.validateFairnessWeights(fairnessWeights)
        } catch {
            throw .queue(error)
        }
        var resolvedKinds: [any OperationKind] = []
        resolvedKinds.reserveCapacity(elements.count)
        var requests: [OperationRequest] = []
        requests.reserveCapacity(elements.count)
        for (i, e) in elements.enumerated() {
            do throws(EngineError) {
                let kind: any OperationKind
                if e.isBarrier {
                    guard let k = kinds["barrier"] else { throw .unknownKind("barrier", allowed: kindNames) }
                    kind = k
                } else {
                    guard let k = kinds[e.request.kind], e.request.kind != "barrier" else { throw .unknownKind(e.request.kind, allowed: kindNames) }
                    try k.permit(spec: e.request.spec)
                    try k.validate(spec: e.request.spec)
                    kind = k
                }
                guard e.dependencies.count <= configuration.maxDependencies else {
                    throw .invalidArgument(
                        field: "dependencies",
                        detail: "at most \(configuration.maxDependencies) dependencies (--max-dependencies); got \(e.dependencies.count)")
                }
                for (j, d) in e.dependencies.enumerated() {
                    if case let .element(k) = d, !elements.indices.contains(k) || k == i {
                        throw .invalidArgument(field: "dependencies[\(j)]", detail: "names no other operation of the archive")
                    }
                }
                guard e.attempt >= 0 else { throw .invalidArgument(field: "attempt", detail: "must not be negative") }
                try Self.validateFlow(e.request.options)
                var request = e.request
                if request.options.retry == nil && !e.isBarrier { request.options.retry = kind.defaultRetry }
                resolvedKinds.append(kind)
                requests.append(request)
            } catch {
                throw .element(i, error)
            }
        }
        let order = try Self.archiveOrder(elements)
        let remote: [OperationID: Bool]
        do throws(EngineError) {
            try ensureLimiters(elements.flatMap { $0.request.options.limits.map(\.limiter) })
            remote = try remoteStates(named: elements.map(\.dependencies))
        } catch {
            throw .queue(error)
        }
        let result: Result<ArchiveRestore, ArchiveRefusal>
        do {
            result = try mutate { core throws(EngineError) -> Result<ArchiveRestore, ArchiveRefusal> in
                // Every check that needs the engine's state, before anything changes.
                let existing = core.queues[name]
                if existing == nil, let only = queueFilter.value, !only(name) { return .failure(.queue(.notHere(name))) }
                if let q = existing, q.unfinished > 0 { return .failure(.queue(.queueNotIdle(name, unfinished: q.unfinished))) }
                if existing == nil && core.queues.count >= configuration.maxQueues {
                    return .failure(.queue(.limitReached("at most \(configuration.maxQueues) queues (--max-queues)", limit: "too-many-queues")))
                }
                guard elements.count <= configuration.maxUnfinishedPerQueue else {
                    return .failure(
                        .queue(
                            .limitReached(
                                "at most \(configuration.maxUnfinishedPerQueue) unfinished operations in queue '\(name)' (--max-unfinished-per-queue); the archive has \(elements.count)",
                                limit: "too-many-operations")))
                }
                guard core.unfinishedTotal <= core.maxUnfinished - min(core.maxUnfinished, elements.count), elements.count <= core.maxUnfinished else {
                    return .failure(
                        .queue(
                            .limitReached(
                                "at most \(core.maxUnfinished) unfinished operations in all queues (--max-unfinished); \(core.unfinishedTotal) now, the archive adds \(elements.count)",
                                limit: "too-many-operations")))
                }
                do throws(EngineError) { try core.reserveIDs(elements.count) } catch { return .failure(.queue(error)) }
                var newKeys: [String: Set<String>] = [:]
                for (i, e) in elements.enumerated() {
                    do throws(EngineError) {
                        try core.checkLimits(e.request.options.limits, pending: &newKeys)
                    } catch {
                        return .failure(.element(i, error))
                    }
                }
                // Then all of it.
                let q: QueueRecord
                if let existing {
                    q = existing
                    if q.maxConcurrent != maxConcurrentOperationCount || q.isSuspended != isSuspended || q.rate?.limit != rateLimit
                        || q.fairnessWeights != fairnessWeights
                    {
                        q.maxConcurrent = maxConcurrentOperationCount
                        q.isSuspended = isSuspended
                        if q.rate?.limit != rateLimit { q.rate = rateLimit.map { TokenBucket($0, now: core.now.nanoseconds) } }
                        q.fairnessWeights = fairnessWeights
                        core.bump(q)
                        core.dirty.append(q)
                    }
                } else {
                    q = QueueRecord(
                        name: name, maxConcurrent: maxConcurrentOperationCount, isSuspended: isSuspended, createdAt: core.now,
                        generation: core.generation)
                    q.rate = rateLimit.map { TokenBucket($0, now: core.now.nanoseconds) }
                    q.fairnessWeights = fairnessWeights
                    core.queues[name] = q
                    core.releasedQueues.remove(name)
                    core.touch(q)
                }
                var made = [OpRecord?](repeating: nil, count: elements.count)
                var dropped: [OperationID] = []
                var droppedSeen = Set<UInt64>()
                for i in order {
                    let e = elements[i]
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
                            } else if droppedSeen.insert(id.raw).inserted {
                                dropped.append(id)
                            }
                        case let .element(k):
                            // `order` puts every element after those it names.
                            if let op = made[k] { deps.append(op); ids.append(op.operationID) }
                        }
                    }
                    var request = requests[i]
                    request.dependencies = ids
                    let op = core.insert(
                        into: q, req: request, kind: resolvedKinds[i], deps: e.isBarrier ? [] : deps, remote: e.isBarrier ? [] : remoteWaits,
                        barrier: e.isBarrier)
                    made[i] = op
                }
                // Before anything starts (`settle` below): paused ones paused, attempts given.
                for (i, e) in elements.enumerated() {
                    guard let op = made[i], e.isPaused || e.attempt > 0 else { continue }
                    op.attempt = e.attempt
                    if e.isPaused { core.applyChecked(.pause, to: op) }
                    core.record(op)
                }
                core.settle()
                return .success(
                    ArchiveRestore(
                        queue: q.snapshot(defaultMax: core.defaultMaxConcurrent), operations: made.compactMap { $0.map(core.status) },
                        droppedDependencies: dropped))
            }
        } catch {
            // The body answers refusals as a value; nothing in it throws.
            throw .queue(error)
        }
        return try result.get()
    }

    /// The order to add an archive's elements in: the archive's own, except that an element
    /// comes after every element it depends on (a dependency changed after creation may name
    /// a later one). A cycle among them (only a damaged document has one: the engine never
    /// lets one form) is refused, naming an element on it.
    static func archiveOrder(_ elements: [ArchiveElement]) throws(ArchiveRefusal) -> [Int] {
        // 0 unvisited, 1 on the current path, 2 placed. Iterative, so a long chain cannot
        // overflow the stack.
        var mark = [UInt8](repeating: 0, count: elements.count)
        var order: [Int] = []
        order.reserveCapacity(elements.count)
        for root in elements.indices where mark[root] == 0 {
            var stack: [(index: Int, next: Int)] = [(root, 0)]
            mark[root] = 1
            while let top = stack.last {
                let deps = elements[top.index].dependencies
                if top.next < deps.count {
                    stack[stack.count - 1].next += 1
                    guard case let .element(k) = deps[top.next], elements.indices.contains(k) else { continue }
                    switch mark[k] {
                    case 0:
                        mark[k] = 1
                        stack.append((k, 0))
                    case 1:
                        throw .element(top.index, .invalidArgument(field: "dependencies", detail: "close a cycle among the archive's operations"))
                    default:
                        break
                    }
                } else {
                    mark[top.index] = 2
                    order.append(top.index)
                    stack.removeLast()
                }
            }
        }
        return order
    }
}
