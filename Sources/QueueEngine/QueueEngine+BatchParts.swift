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
    /// Operations set aside per queue (the records: a queue given up and taken again is a new
    /// record, which an old hold does not touch).
    var queues: [(queue: QueueRecord, count: Int)]
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
        guard !mine.isEmpty else { return [] }
        var named: [[BatchDependency]] = []
        for i in mine {
            guard elements.indices.contains(i) else { throw BatchRefusal(index: 0, error: .invalidArgument(field: "operations", detail: "no element \(i)")) }
            let e = elements[i]
            _ = try check(e, at: i)
            named.append(e.dependencies)
        }
        let remote: [OperationID: Bool]
        do throws(EngineError) {
            try ensureLimiters(mine.flatMap { elements[$0].request.options.limits.map(\.limiter) })
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
                let queues: [QueueRecord]
                switch room(core, elements, at: mine, remote: remote) {
                case let .success(found): queues = found
                case let .failure(refusal): return .failure(refusal)
                }
                do throws(EngineError) { try core.reserveIDs(mine.count) } catch { return .failure(BatchRefusal(index: mine.first ?? 0, error: error)) }
                let first = core.nextID
                core.nextID += UInt64(mine.count)
                var counts: [ObjectIdentifier: (queue: QueueRecord, count: Int)] = [:]
                for q in queues { counts[ObjectIdentifier(q), default: (q, 0)].count += 1 }
                let hold = BatchHold(queues: Array(counts.values), ids: (0..<UInt64(mine.count)).map { first + $0 })
                for (q, n) in hold.queues { q.held += n }
                core.heldTotal += hold.ids.count
                core.batchHolds[token] = hold
                return .success(hold.ids.map { OperationID(raw: $0) })
            }
        } catch {
            throw BatchRefusal(index: 0, error: error)
        }
        return try result.get()
    }

    /// Lets the part of batch `token` go, if this engine holds it. `giveIDsBack`: the batch is
    /// known not to be committed (nobody can add it with these ids), so its ids are used again
    /// when nothing was given out after them. Returns whether it held it.
    @discardableResult
    public func releaseBatchPart(_ token: String, giveIDsBack: Bool = false) -> Bool {
        (try? mutate { core throws(EngineError) -> Bool in
            guard let hold = core.batchHolds.removeValue(forKey: token) else { return false }
            core.unhold(hold)
            if giveIDsBack, let first = hold.ids.first, core.nextID == first + UInt64(hold.ids.count) { core.nextID = first }
            return true
        }) ?? false
    }

    /// Whether this engine holds a part of batch `token` (prepared, not added or let go).
    public func holdsBatchPart(_ token: String) -> Bool {
        (try? read { core throws(EngineError) in core.batchHolds[token] != nil }) ?? false
    }

    /// Step 2 (see above): adds the elements of the committed batch `token` in `parts` (each a
    /// part of the store, with the indices of its elements), with `ids` (one per element of the
    /// whole batch, in its order), and records each part added (`StoreRecord.batchPartAdded`)
    /// in the same change. A part whose queues are not all here is left out whole (its holder
    /// adds it). Elements whose operation exists here already were added before (a repeat):
    /// their status is answered and nothing changes. A dependency this engine does not hold
    /// (another part's element, or an operation of another instance) is waited for as one of
    /// another instance: the look that follows tells whether it has finished. Returns the
    /// statuses by element index, and the parts left out.
    public func applyBatchPart(
        _ token: String, _ elements: [BatchElement], parts: [(part: Int, indices: [Int])], ids: [OperationID]
    ) throws(EngineError) -> (statuses: [Int: OperationSnapshot], notHere: [Int]) {
        guard ids.count == elements.count, parts.allSatisfy({ $0.indices.allSatisfy { elements.indices.contains($0) } }) else {
            throw .invalidArgument(field: "batch", detail: "one id per element is needed")
        }
        return try mutate { core throws(EngineError) -> (statuses: [Int: OperationSnapshot], notHere: [Int]) in
            if let hold = core.batchHolds.removeValue(forKey: token) { core.unhold(hold) }
            var records: [Int: OpRecord] = [:]
            var notHere: [Int] = []
            for (part, indices) in parts {
                guard indices.allSatisfy({ core.queues[elements[$0].queue] != nil || core.ops[ids[$0].raw] != nil }) else {
                    notHere.append(part)
                    continue
                }
                for i in indices.sorted() {
                    if let existing = core.ops[ids[i].raw] {
                        records[i] = existing
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
                        if let op = core.ops[id.raw] { deps.append(op) } else { remoteWaits.append(id.raw) }
                    }
                    var request = e.request
                    if request.options.retry == nil { request.options.retry = kind.defaultRetry }
                    request.dependencies = depIDs
                    records[i] = core.insert(into: q, req: request, kind: kind, deps: deps, remote: remoteWaits, barrier: false, id: ids[i].raw)
                }
                if core.wantsRecords { core.outRecords.append(.batchPartAdded(batch: token, part: part)) }
            }
            core.settle()
            return (records.mapValues(core.status), notHere)
        }
    }

    /// The statuses of the elements at `indices` of a batch whose ids are `ids`, where this
    /// engine holds them.
    public func batchStatuses(_ indices: [Int], ids: [OperationID]) -> [Int: OperationSnapshot] {
        let known = indices.filter { ids.indices.contains($0) }
        var out: [Int: OperationSnapshot] = [:]
        for (i, op) in zip(known, operations(known.map { ids[$0] })) { if let op { out[i] = op } }
        return out
    }
}

extension EngineCore {
    /// Lets the queues of a batch part go (`QueueEngine.releaseBatchPart`, `applyBatchPart`).
    func unhold(_ hold: BatchHold) {
        for (q, n) in hold.queues { q.held = max(0, q.held - n) }
        heldTotal = max(0, heldTotal - hold.ids.count)
    }
}
