extension EngineCore {
    /// Adds one operation that has passed every check: its record, its edges to its unfinished
    /// dependencies (`deps`, resolved), the barrier of its queue, its first state and its
    /// creation event. Does not settle: the caller does, once, after everything it adds, so a
    /// batch starts nothing before all of it is in.
    /// `remote`: unfinished dependencies this engine does not hold (`QueueEngine+Remote`).
    /// `id`: one set aside for it before (`prepareBatchPart`); nil: the next.
    func insert(
        into q: QueueRecord, req request: OperationRequest, kind: any OperationKind, deps resolved: [OpRecord], remote: [UInt64] = [],
        barrier: Bool, id given: UInt64? = nil, tag: ScheduleTag? = nil, admission: AdmissionTag? = nil
    ) -> OpRecord {
        var deps = resolved
        var req = request
        if barrier {
            deps = q.ops.filter { $0.state != .finished }
            req.dependencies = deps.map(\.operationID)
        } else if let b = q.barrier, !deps.contains(where: { $0 === b }) {
            deps.append(b)
            req.dependencies.append(b.operationID)
        }
        let implicitBarrier = barrier ? nil : q.barrier?.id
        // Its first state, not a move: ready unless a dependency or `notBefore` holds it back.
        let readyNow = remote.isEmpty && !deps.contains { $0.state != .finished } && (req.options.notBefore.map { $0 <= now } ?? true)
        let op = OpRecord(
            id: given ?? nextID, queue: q, request: req, kind: kind, createdAt: now, isBarrier: barrier,
            state: readyNow ? .ready : .pending)
        if given == nil { nextID += 1 }
        op.implicitBarrier = implicitBarrier
        if let tag { op.scheduleTag = ScheduleTagBox(tag) }
        if let admission { indexAdmitted(op, admission) }
        ops[op.id] = op
        if let last = q.ops.last, last.id > op.id {
            // An id set aside earlier (a batch part across instances, `applyBatchPart`): the
            // queue's list stays in id order, which its pages' cursors search by.
            var lo = 0, hi = q.ops.count
            while lo < hi {
                let mid = (lo + hi) / 2
                if q.ops[mid].id < op.id { lo = mid + 1 } else { hi = mid }
            }
            q.ops.insert(op, at: lo)
        } else {
            q.ops.append(op)
        }
        q.counts[op.state.index] += 1
        q.unfinished += 1
        bump(q)
        unfinishedTotal += 1
        if barrier { q.barrier = op }
        var seen = Set<ObjectIdentifier>()
        for dep in deps where dep.state != .finished && seen.insert(ObjectIdentifier(dep)).inserted {
            dep.dependents.append(op)
            op.unfinishedDependencies += 1
        }
        if !remote.isEmpty {
            for id in remote { waitRemote(op, for: id) }
            effects.append(.watchRemote(remote.map { OperationID(raw: $0) }))
        }
        if !op.options.limits.isEmpty { attachFlow(op) }
        attachHost(op)
        if !barrier { noteHistory(q) { $0.created &+= 1 } }
        if readyNow {
            op.readySince = now.nanoseconds
            q.push(op)
            dirty.append(q)
        }
        // Creation is reported as `isReady` changing from nothing to its first value.
        emit(op, .isReady, .none, .bool(readyNow))
        if !readyNow { makeReadyIfPossible(op) }
        record(op)
        return op
    }
}
