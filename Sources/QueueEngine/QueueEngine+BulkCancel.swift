extension QueueEngine {
    /// Cancels every unfinished operation of the queue that `filter` matches, in one locked
    /// section (so in one commit), with `cancel()`'s meaning for each: one that has not started
    /// finishes `cancelled` without running, an executing one is asked to stop. Returns how many
    /// were cancelled by this call: an executing one counts when it is asked to stop, and one
    /// that was asked before (still winding down, `isCancelled`) is not counted again.
    ///
    /// The set is chosen before anything changes: an operation that a cancel in the same call
    /// would release (pending on a cancelled one) is judged by the state it had when asked.
    /// A `filter.state` of `finished` matches nothing.
    @discardableResult
    public func cancelOperations(in queueName: String, matching filter: OperationFilter) throws(EngineError) -> Int {
        try mutate { core throws(EngineError) in
            let q = try core.queue(queueName)
            var chosen: [OpRecord] = []
            // An executing operation already asked to stop is winding down: not counted again.
            for op in q.ops where op.state != .finished && !op.isCancelled && filter.matches(op) { chosen.append(op) }
            guard !chosen.isEmpty else { return 0 }
            core.detachFromDependencies(chosen)
            var n = 0
            for op in chosen where core.cancelOp(op, detached: op.state != .executing) { n += 1 }
            core.settle()
            return n
        }
    }
}

extension EngineCore {
    /// `cancelAllOperations()`: every unfinished operation of `q`, in one pass over each
    /// dependency's dependents (cancelling one at a time was quadratic when many of them
    /// waited on one). Executing ones already asked to stop are left to wind down.
    func cancelAll(of q: QueueRecord) {
        let chosen = q.ops.filter { $0.state != .finished && !$0.isCancelled }
        guard !chosen.isEmpty else { return }
        detachFromDependencies(chosen)
        for op in chosen { cancelOp(op, detached: op.state != .executing) }
    }

    /// Takes every operation of `chosen` that has not started out of its unfinished
    /// dependencies' `dependents`, with one pass over each such dependency's list: removing
    /// them one at a time is quadratic when many depend on one (a fan-in, a barrier). After
    /// it, a cancelled operation in `chosen` does not wake another one in `chosen` on the way.
    func detachFromDependencies(_ chosen: [OpRecord]) {
        var members = Set<ObjectIdentifier>()
        members.reserveCapacity(chosen.count)
        var dependencies: [ObjectIdentifier: OpRecord] = [:]
        for op in chosen where op.state != .executing {
            members.insert(ObjectIdentifier(op))
            guard op.unfinishedDependencies > 0 else { continue }
            for depID in op.dependencyIDs {
                if let dep = ops[depID.raw], dep.state != .finished { dependencies[ObjectIdentifier(dep)] = dep }
            }
        }
        for dep in dependencies.values {
            dep.dependents.removeAll { members.contains(ObjectIdentifier($0)) }
        }
        for op in chosen where op.state != .executing { op.unfinishedDependencies = 0 }
    }
}
