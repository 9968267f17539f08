/// What a copy takes from the request instead of from its source; nil keeps the source's.
public struct CopyOverrides: Sendable, Equatable {
    /// Another queue to add the copy to.
    public var queue: String?
    public var queuePriority: QueuePriority?
    /// Replaces the source's dependencies (`[]`: none).
    public var dependencies: [OperationID]?
    /// `.some(nil)` clears the source's `notBefore`.
    public var notBefore: Timestamp??
    /// Replaces the source's limits (`[]`: none).
    public var limits: [LimitRef]?
    /// `.some(nil)` clears the source's fairness key.
    public var fairnessKey: String??

    public init(
        queue: String? = nil, queuePriority: QueuePriority? = nil, dependencies: [OperationID]? = nil, notBefore: Timestamp?? = nil,
        limits: [LimitRef]? = nil, fairnessKey: String?? = nil
    ) {
        self.queue = queue; self.queuePriority = queuePriority; self.dependencies = dependencies; self.notBefore = notBefore
        self.limits = limits; self.fairnessKey = fairnessKey
    }
}

extension QueueEngine {
    /// `NSCopying`: adds a new operation with the source's kind, name, spec, options (timeout,
    /// retry, `notBefore`), priority and dependencies, to the source's queue or another, with
    /// `overrides` applied. The copy starts afresh (no attempt, result, error or progress), so
    /// this is how a failed or cancelled operation is run again; the source may be in any
    /// state and is not changed.
    ///
    /// The source's dependencies are copied as declared, less the barrier it was made to wait
    /// for when it was added (the copy waits for the barrier of the queue it is added to, if
    /// any, like any new operation) and less operations no longer kept (purged ones finished
    /// long ago, so leaving them out does not change when the copy may start). Otherwise it is
    /// validated and added exactly as a create, with the same refusals.
    @discardableResult
    public func copyOperation(_ id: OperationID, _ overrides: CopyOverrides = CopyOverrides()) throws(EngineError) -> OperationSnapshot {
        let held = try read { core throws(EngineError) -> (OperationRequest, String)? in
            guard let op = core.ops[id.raw] else { return nil }
            if op.isBarrier {
                throw .notCopyable("operation \(id) is a barrier; POST /v1/queues/{name}/barrier adds a new one")
            }
            var dependencies: [OperationID] = []
            if overrides.dependencies == nil {
                // Those held elsewhere are kept here and looked up below.
                dependencies = op.dependencyIDs.filter { $0.raw != op.implicitBarrier && (core.ops[$0.raw] != nil || remote != nil) }
            }
            let request = OperationRequest(
                kind: op.kindName, name: op.name, queuePriority: op.priority, dependencies: dependencies, spec: op.spec,
                options: op.options)
            return (request, op.queue.name)
        }
        let source: OperationRequest
        let sourceQueue: String
        if let held {
            (source, sourceQueue) = held
        } else if let remote, let s = try remote.operation(id) {
            // A copy into a queue of this instance of an operation another one holds (a
            // cluster): its committed row. The barrier it was made to wait for is not known
            // there; it is finished or a dependency like any other.
            if s.kind == "barrier" { throw .notCopyable("operation \(id) is a barrier; POST /v1/queues/{name}/barrier adds a new one") }
            source = OperationRequest(
                kind: s.kind, name: s.name, queuePriority: s.queuePriority, dependencies: overrides.dependencies == nil ? s.dependencies : [],
                spec: s.spec, options: s.options)
            sourceQueue = s.queue
        } else {
            throw .operationNotFound(id.description)
        }
        var request = source
        if overrides.dependencies == nil, remote != nil {
            let known = try remoteStates(request.dependencies)
            request.dependencies = try read { core in request.dependencies.filter { core.ops[$0.raw] != nil || known[$0] != nil } }
        }
        if let p = overrides.queuePriority { request.queuePriority = p }
        if let d = overrides.dependencies { request.dependencies = d }
        if let nb = overrides.notBefore { request.options.notBefore = nb }
        if let l = overrides.limits { request.options.limits = l }
        if let f = overrides.fairnessKey { request.options.fairnessKey = f }
        // The kind may no longer permit the spec here (a command's executable taken off the
        // allow list since): the same first check as a create.
        try checkPermitted(kind: request.kind, spec: request.spec)
        return try add(to: overrides.queue ?? sourceQueue, request, barrier: false) { core, op, _ in core.status(op) }
    }
}
