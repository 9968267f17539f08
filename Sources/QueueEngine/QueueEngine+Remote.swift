/// Operations an engine does not hold: in a cluster, each instance's engine runs only the queues
/// it owns, and an operation may depend on one in a queue another instance owns (API.md: a
/// dependency may name an operation in any queue). The cluster layer answers for those.
///
/// An operation waiting for remote ones counts them in its unfinished dependencies like local
/// ones and is told of each one's end by `remoteOperationsFinished`, which is idempotent (a
/// wait is a set member): whoever reports an end may report it twice.
///
/// No end is missed: the engine registers a wait first and only then asks the directory to
/// `watch` the id (an effect, after the lock), so the directory's look at the operation comes
/// after the wait exists. Either that look sees it finished, or its end becomes visible after
/// the look and the directory reports it then.
public protocol RemoteOperations: Sendable {
    /// For each id: whether an operation with it exists outside this engine, and whether it is
    /// finished (`true`). Ids that name no operation are left out of the answer. Called without
    /// the engine's lock; may block briefly (a database read); throws to refuse the request
    /// (the directory cannot be read).
    func states(of ids: [OperationID]) throws(EngineError) -> [OperationID: Bool]
    /// Operations held here now wait for these ids: call `remoteOperationsFinished` for each once
    /// it is finished, even if it finished before this call.
    func watch(_ ids: [OperationID])
    /// Whether `target` is reachable from any of `ids` along the dependencies of unfinished
    /// operations, wherever they are held (the engine's own walk sees only those it holds).
    /// Called without the engine's lock; throws to refuse the request.
    func reaches(_ target: OperationID, from ids: [OperationID]) throws(EngineError) -> Bool
    /// The committed status of operation `id` held elsewhere (nil: none), spec and options
    /// included: the source of a copy into a queue held here.
    func operation(_ id: OperationID) throws(EngineError) -> OperationSnapshot?
}

/// Operations held elsewhere as a directory read them (a cluster instance's store).
public struct RemoteStates: Sendable, Equatable {
    /// Whether each exists and is finished; ids of no operation are left out.
    public var finished: [OperationID: Bool]
    /// Those cancelled by a cascade, and when (`OperationSnapshot.cascadeAt`).
    public var cascades: [OperationID: Timestamp]

    public init(finished: [OperationID: Bool] = [:], cascades: [OperationID: Timestamp] = [:]) {
        self.finished = finished
        self.cascades = cascades
    }
}

extension QueueEngine {
    /// Makes `remote` the directory of operations this engine does not hold. Set once, before
    /// serving; without one, a dependency the engine does not hold is refused as not found.
    public func setRemoteOperations(_ remote: any RemoteOperations) {
        remoteDirectory.withLock { $0 = remote }
    }

    var remote: (any RemoteOperations)? { remoteDirectory.withLock { $0 } }

    /// The states of the ids in `ids` this engine does not hold, from the remote directory
    /// (empty without one, or when it holds them all). Read before the change's lock: an id
    /// that moves in between is found locally or refused as not found.
    func remoteStates(_ ids: [OperationID]) throws(EngineError) -> [OperationID: Bool] {
        guard !ids.isEmpty, let remote else { return [:] }
        let missing = try read { core in ids.filter { core.ops[$0.raw] == nil } }
        guard !missing.isEmpty else { return [:] }
        return try remote.states(of: missing)
    }

    /// `remoteStates` of the operations that elements of a batch or an archive name.
    func remoteStates(named lists: [[BatchDependency]]) throws(EngineError) -> [OperationID: Bool] {
        var named: [OperationID] = []
        for list in lists {
            for d in list { if case let .operation(id) = d { named.append(id) } }
        }
        return try remoteStates(named)
    }

    /// These operations (held elsewhere) are finished: every operation here that waits for
    /// them stops waiting. Those in `cascades` were cancelled by a cascade, asked at the time
    /// given: the operations here that wait for one of them and were added before that time are
    /// cancelled too, with their own dependents (as `cancel` with `cascade` does with the
    /// dependents it holds; one added after it, while the cancelled one was still stopping,
    /// runs, as it would on one instance). Ids nobody here waits for are ignored; a second
    /// report changes nothing.
    public func remoteOperationsFinished(_ ids: [OperationID], cascades: [OperationID: Timestamp] = [:]) {
        try? mutate { core throws(EngineError) in
            for id in ids { core.remoteFinished(id.raw, cascadeAt: cascades[id]) }
        }
    }

    /// The remote operations that operations held here wait for (for a directory that checks
    /// them again, e.g. after its feed of ends was interrupted).
    public var remoteWaitedFor: [OperationID] {
        (try? read { core in core.remoteWaiters.keys.sorted().map { OperationID(raw: $0) } }) ?? []
    }

    /// From now on operations get ids in `block` only (a cluster instance's block, which no
    /// other instance hands out), from its start or above every id held here, whichever is
    /// higher; once it is used up, adding is refused as unavailable until the next block.
    /// Ids only grow, so a queue's operations keep the order they were added in.
    public func useIDs(_ block: Range<UInt64>) {
        try? mutate { core throws(EngineError) in
            let end = min(block.upperBound, QueueRecord.idMask + 1)
            core.nextID = max(core.nextID, block.lowerBound)
            core.idEnd = max(end, core.nextID)
        }
    }

    /// Whether operation `id` left this engine with its queue (`release`) and has not come
    /// back: a request that waited for it here is answered "moved" (503 with Retry-After, to
    /// be retried at its new owner) rather than "not found".
    public func wasReleased(_ id: OperationID) -> Bool {
        (try? read { core in core.released.contains(id.raw) }) ?? false
    }

    /// True when queue `name` is not here because it went to another cluster instance
    /// (`release`), not because it was deleted or never existed: a long poll on it may follow it.
    public func wasReleased(queue name: String) -> Bool {
        (try? read { core in core.queues[name] == nil && core.releasedQueues.contains(name) }) ?? false
    }

    /// How many ids are left in the block (`useIDs`).
    public var idsLeft: UInt64 { (try? read { core in core.idEnd &- core.nextID }) ?? 0 }

    /// Takes in queues and their operations read from the store while serving (a cluster
    /// instance that became the owner of more queues), with the restart rules of `restore`.
    /// `remote` gives, for dependencies outside `recovered`, whether they exist elsewhere and are
    /// finished (as `RemoteOperations.states`), and which ended by a cascade; operations held
    /// here that waited for an adopted one now wait for it locally. Queues already held are left
    /// as they are.
    public func adopt(_ recovered: RecoveredState, remote: RemoteStates) {
        restore(recovered, remote: remote.finished, cascades: remote.cascades)
    }

    /// From now on only queues `only` accepts may be created here (a cluster instance: the
    /// queues of the partitions it serves); checked inside the change, so a queue created
    /// after its partition was given up is refused (`notHere`) rather than left behind.
    public func onlyQueues(_ only: @escaping @Sendable (String) -> Bool) {
        queueFilter.withLock { $0 = only }
    }

    /// Gives up queues without writing anything (a cluster instance that no longer owns them:
    /// the store already belongs to the new owner). Their operations leave this engine; runs
    /// in progress are stopped (`cancel` to the kind, whose report is then ignored: the new owner
    /// restarts them by the restart rules); operations held here that wait for one of them now
    /// wait for it remotely; long waits on those queues are answered as not idle.
    @discardableResult
    public func release(queues names: Set<String>) -> ReleasedRuns { release { names.contains($0) } }

    /// `release(queues:)` of every queue whose name `leaving` accepts, decided inside the change
    /// (a queue created a moment before goes too). Answers how many runs were stopped.
    /// `handingOver`: the store is still this instance's (a clean hand-over, before its
    /// partitions are given up): the queues' last history changes are written in this change, so
    /// the new owner loads them. Nothing else is written.
    @discardableResult
    public func release(handingOver: Bool = false, where leaving: (String) -> Bool) -> ReleasedRuns {
        let (stopped, left) =
            (try? mutate { core throws(EngineError) -> (ReleasedRuns, [OperationID]) in
                var gone: [OpRecord] = []
                var stopped = ReleasedRuns()
                for name in core.queues.keys.sorted() where leaving(name) {
                    guard let q = core.queues[name] else { continue }
                    if handingOver { core.flushHistory(of: [name]) }
                    core.historyLeaves(q)
                    // Nothing of it reaches the store or the observers from here on (`record`, `emit`).
                    q.deleted = true
                    core.queues[name] = nil
                    // Bounded like `released`: past it, a wait on a queue that left long ago ends as
                    // on a deleted one.
                    if core.releasedQueues.count >= 100_000 { core.releasedQueues.removeAll() }
                    core.releasedQueues.insert(name)
                    core.dropSchedules(of: name)
                    for op in q.ops { gone.append(op) }
                    let waiters = q.idleWaiters
                    q.idleWaiters = []
                    for (_, w) in waiters { core.effects.append(.call({ w(false) })) }
                }
                var leaving = Set<ObjectIdentifier>()
                for op in gone { leaving.insert(ObjectIdentifier(op)) }
                var watch: [OperationID] = []
                // Bounded: past a million, the oldest knowledge goes (they answer as not found).
                if core.released.count + gone.count > 1_000_000 { core.released.removeAll() }
                for op in gone {
                    core.ops[op.id] = nil
                    core.released.insert(op.id)
                    core.dropRemoteWaits(op)
                    if op.state != .finished {
                        op.queue.unfinished -= 1
                        core.unfinishedTotal -= 1
                        core.detachFlow(op)
                    }
                    if (op.state == .executing && !op.inBackoff && op.parkedCompletion == nil)
                        || (op.state == .paused && op.hasStarted && op.parkedCompletion == nil)
                    {
                        core.effects.append(.cancel(op.kind, core.context(op, resume: false)))
                        stopped.runs += 1
                        stopped.grace = max(stopped.grace, op.kind.stopGrace)
                    }
                    op.runToken &+= 1
                    // Its local dependencies no longer wake it; its dependents that stay here wait
                    // for it as a remote operation.
                    for depID in op.dependencyIDs {
                        if let dep = core.ops[depID.raw], let i = dep.dependents.firstIndex(where: { $0 === op }) {
                            dep.dependents.remove(at: i)
                        }
                    }
                    let staying = op.dependents.filter { !leaving.contains(ObjectIdentifier($0)) }
                    op.dependents = []
                    if !staying.isEmpty {
                        core.remoteWaiters[op.id, default: []].append(contentsOf: staying)
                        for d in staying { d.remoteWaits.append(op.id) }
                        watch.append(op.operationID)
                    }
                }
                if !watch.isEmpty { core.effects.append(.watchRemote(watch)) }
                return (stopped, gone.map(\.operationID))
            }) ?? (ReleasedRuns(), [])
        // Their finish waits end now (`wasReleased`), not at their timeout: they follow the
        // queue to its new holder.
        if !left.isEmpty { observers.released(left) }
        return stopped
    }
}

/// What `release` stopped: how many runs, and the longest a stopped run may still take to be
/// gone (`OperationKind.stopGrace`).
public struct ReleasedRuns: Sendable, Equatable {
    public var runs = 0
    public var grace = 0.0
}

extension EngineCore {
    /// `op` waits for `id`, which this engine does not hold and which is not finished.
    func waitRemote(_ op: OpRecord, for id: UInt64) {
        guard !op.remoteWaits.contains(id) else { return }
        op.remoteWaits.append(id)
        op.unfinishedDependencies += 1
        remoteWaiters[id, default: []].append(op)
    }

    /// `op` no longer waits for anything remote (cancelled, its dependencies replaced, left).
    /// Leaves `unfinishedDependencies` to the caller, which resets it.
    func dropRemoteWaits(_ op: OpRecord) {
        for id in op.remoteWaits {
            guard var list = remoteWaiters[id] else { continue }
            list.removeAll { $0 === op }
            remoteWaiters[id] = list.isEmpty ? nil : list
        }
        op.remoteWaits = []
    }

    /// The remote operation `id` finished: its waiters here stop waiting for it, or, when a
    /// cascade cancelled it (`cascadeAt`), those added before the cascade are cancelled with
    /// their dependents (the same rule as `restore`'s).
    func remoteFinished(_ id: UInt64, cascadeAt: Timestamp?) {
        guard let waiters = remoteWaiters.removeValue(forKey: id) else { return }
        for op in waiters {
            guard let i = op.remoteWaits.firstIndex(of: id) else { continue }
            op.remoteWaits.remove(at: i)
            op.unfinishedDependencies -= 1
            if let at = cascadeAt, op.createdAt <= at {
                cancelCascading(op)
            } else if op.unfinishedDependencies == 0 {
                makeReadyIfPossible(op)
            }
        }
    }

    /// An operation `id` this engine now holds (adopted): the operations here that waited for
    /// it remotely wait for it locally, or stop waiting if it is finished (are cancelled, if a
    /// cascade cancelled it).
    func remoteBecameLocal(_ dep: OpRecord) {
        guard let waiters = remoteWaiters.removeValue(forKey: dep.id) else { return }
        for op in waiters {
            guard let i = op.remoteWaits.firstIndex(of: dep.id) else { continue }
            op.remoteWaits.remove(at: i)
            if dep.state == .finished {
                op.unfinishedDependencies -= 1
                if let at = dep.cascadeAt, op.createdAt <= at {
                    cancelCascading(op)
                } else if op.unfinishedDependencies == 0 {
                    makeReadyIfPossible(op)
                }
            } else {
                dep.dependents.append(op)
            }
        }
    }

    /// `cancel` with `cascade`: `op` and every operation here that transitively depends on it,
    /// each marked with the time (`cascadeAt`), which is what carries the cascade to dependents
    /// another instance holds. An executing one that was asked to stop before gets the mark too.
    func cancelCascading(_ op: OpRecord) {
        for o in [op] + transitiveDependents(of: op) where o.state != .finished {
            if o.cascadeAt == nil {
                o.cascadeAt = now
                // Recorded even when the cancel itself changes nothing (already stopping).
                record(o)
            }
            cancelOp(o)
        }
    }
}
