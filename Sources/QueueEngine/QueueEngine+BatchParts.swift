/// `addOperations` across cluster instances (API.md "Many instances": a batch over queues of
/// different owners is atomic as on one instance). Each owner holds a part of the batch: the
/// elements whose queues it runs. The batch is decided in two steps:
///
/// 1. `prepareBatchPart`: the owner checks its part as `addOperations` checks a whole batch,
///    and sets aside an id for each element; nothing is added, nothing is written, no event.
///    The queues of the part cannot be deleted until the part is added or let go.
/// 2. Once the batch's outcome is committed in the store (by whoever coordinates it), each
///    owner adds its part with the ids it set aside (`applyBatchPart`), or lets it go
///    (`releaseBatchPart`). Adding cannot fail: everything was checked in step 1, and the
///    holds kept it so.
///
/// An owner that takes a part's queues over after the outcome was committed adds the part from
/// the store (`applyBatchPart` with no hold: the same call).
struct BatchHold {
    /// Operations set aside per queue.
    var queues: [String: Int]
    /// The ids set aside, one per element of the part, in the part's order.
    var ids: [UInt64]
}

extension QueueEngine {
    /// Step 1 (see above): `elements` is the whole batch (so that refusals and dependencies name
    /// elements by their index in it); `mine` the indices of the elements of queues this engine
    /// runs, ascending. A dependency on an element outside `mine` is on an operation another
    /// instance adds with its part: it is not looked at here. Returns one id per index of
    /// `mine`. A refusal names the first element of `mine` that failed, and changes nothing.
    /// `token` names the batch; preparing the same one twice is refused.
    public func prepareBatchPart(_ token: String, _ elements: [BatchElement], mine: [Int]) throws(BatchRefusal) -> [OperationID] {
        var named: [[BatchDependency]] = []
        for i in mine {
            guard elements.indices.contains(i) else { throw BatchRefusal(index: 0, error: .invalidArgument(field: "operations", detail: "no element \(i)")) }
            let e = elements[i]
            _ = try check(e, at: i)
            named.append(e.dependencies)
        }
        let remote: [OperationID: Bool]
        do throws(EngineError) {
            remote = try remoteStates(named: named)
        } catch {
            throw BatchRefusal(index: mine.first ?? 0, error: error)
        }
        let result: Result<[OperationID], BatchRefusal>
        do {
            result = try mutate { core throws(EngineError) -> Result<[OperationID], BatchRefusal> in
                guard core.batchHolds[token] == nil else {
                    return .failure(
                        BatchRefusal(index: mine.first ?? 0, error: .invalidArgument(field: "batch", detail: "this batch is being decided already")))
                }
                var added: [ObjectIdentifier: Int] = [:]
                var queues: [QueueRecord] = []
                for (n, i) in mine.enumerated() {
                    let e = elements[i]
                    guard let q = core.queues[e.queue] else { return .failure(BatchRefusal(index: i, error: .queueNotFound(e.queue))) }
                    for d in e.dependencies {
                        if case let .operation(id) = d, core.ops[id.raw] == nil, remote[id] == nil {
                            return .failure(BatchRefusal(index: i, error: .operationNotFound(id.description)))
                        }
                    }
                    let inQueue = added[ObjectIdentifier(q), default: 0] + 1
                    added[ObjectIdentifier(q)] = inQueue
                    let held = core.batchHolds.values.reduce(0) { $0 + $1.ids.count }
                    guard core.unfinishedTotal + held < core.maxUnfinished - n else {
                        return .failure(
                            BatchRefusal(
                                index: i,
                                error: .limitReached(
                                    "at most \(core.maxUnfinished) unfinished operations in all queues (--max-unfinished); \(core.unfinishedTotal + held) now, the batch adds \(mine.count) here",
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
                do throws(EngineError) { try core.reserveIDs(mine.count) } catch { return .failure(BatchRefusal(index: mine.first ?? 0, error: error)) }
                let first = core.nextID
                core.nextID += UInt64(mine.count)
                var hold = BatchHold(queues: [:], ids: (0..<UInt64(mine.count)).map { first + $0 })
                for q in queues {
                    q.held += 1
                    hold.queues[q.name, default: 0] += 1
                }
                core.batchHolds[token] = hold
                return .success(hold.ids.map { OperationID(raw: $0) })
            }
        } catch {
            throw BatchRefusal(index: 0, error: error)
        }
        return try result.get()
    }

    /// Lets the part of batch `token` go (its outcome: not committed), if this engine holds it.
    /// Its ids are given back when nothing was given out after them. Returns whether it held it.
    @discardableResult
    public func releaseBatchPart(_ token: String) -> Bool {
        (try? mutate { core throws(EngineError) -> Bool in
            guard let hold = core.batchHolds.removeValue(forKey: token) else { return false }
            core.unhold(hold)
            if let first = hold.ids.first, core.nextID == first + UInt64(hold.ids.count) { core.nextID = first }
            return true
        }) ?? false
    }

    /// Whether this engine holds a part of batch `token` (prepared, not added or let go).
    public func holdsBatchPart(_ token: String) -> Bool {
        (try? read { core throws(EngineError) in core.batchHolds[token] != nil }) ?? false
    }

    /// Step 2 (see above): adds the elements at `mine` of the committed batch `token`, with
    /// `ids` (one per element of the whole batch, in its order). Elements whose operation exists
    /// here already were added before (a repeat, or a part added by this instance before it
    /// was asked again): their status is answered and nothing changes. A dependency on an
    /// element outside `mine` that this engine does not hold waits for that operation like one
    /// held by another instance (its owner adds it with its part). Every queue of `mine` must be
    /// here; otherwise `notHere` and nothing changes (the part is added by the queue's holder).
    /// Returns the statuses of `mine`, in its order.
    public func applyBatchPart(_ token: String, _ elements: [BatchElement], mine: [Int], ids: [OperationID]) throws(EngineError) -> [OperationSnapshot] {
        guard ids.count == elements.count, mine.allSatisfy({ elements.indices.contains($0) }) else {
            throw .invalidArgument(field: "batch", detail: "one id per element is needed")
        }
        var named: [OperationID] = []
        for i in mine {
            for d in elements[i].dependencies { if case let .operation(id) = d { named.append(id) } }
        }
        let remote = try remoteStates(named)
        return try mutate { core throws(EngineError) -> [OperationSnapshot] in
            for i in mine where core.queues[elements[i].queue] == nil && core.ops[ids[i].raw] == nil {
                throw .notHere(elements[i].queue)
            }
            if let hold = core.batchHolds.removeValue(forKey: token) { core.unhold(hold) }
            var made: [OperationSnapshot] = []
            made.reserveCapacity(mine.count)
            var records: [UInt64: OpRecord] = [:]
            for i in mine {
                if let existing = core.ops[ids[i].raw] {
                    records[existing.id] = existing
                    continue
                }
                let e = elements[i]
                guard let q = core.queues[e.queue], let kind = kinds[e.request.kind] else { continue }
                var deps: [OpRecord] = []
                var depIDs: [OperationID] = []
                var remoteWaits: [UInt64] = []
                for d in e.dependencies {
                    let id: OperationID
                    switch d {
                    case let .operation(named): id = named
                    case let .element(k):
                        guard ids.indices.contains(k) else { continue }
                        id = ids[k]
                    }
                    depIDs.append(id)
                    if let op = core.ops[id.raw] {
                        deps.append(op)
                    } else if case .element = d {
                        // Another instance's part: added there, not finished yet (it ends later).
                        remoteWaits.append(id.raw)
                    } else if remote[id] == false {
                        remoteWaits.append(id.raw)
                    }
                }
                var request = e.request
                if request.options.retry == nil { request.options.retry = kind.defaultRetry }
                request.dependencies = depIDs
                let op = core.insert(into: q, req: request, kind: kind, deps: deps, remote: remoteWaits, barrier: false, id: ids[i].raw)
                records[op.id] = op
            }
            core.settle()
            for i in mine { if let op = records[ids[i].raw] ?? core.ops[ids[i].raw] { made.append(op.snapshot()) } }
            return made
        }
    }
}

extension EngineCore {
    /// Lets the queues of a batch part go (`QueueEngine.releaseBatchPart`, `applyBatchPart`).
    func unhold(_ hold: BatchHold) {
        for (name, n) in hold.queues { if let q = queues[name] { q.held = max(0, q.held - n) } }
    }
}
