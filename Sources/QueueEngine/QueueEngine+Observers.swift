extension QueueEngine {
    // MARK: - observers

    /// Registers an observer for every change, called with batches in `seq` order.
    public func observeAll(_ callback: @escaping @Sendable ([ChangeEvent]) -> Void) -> ObserverToken {
        observers.add(operation: nil, keys: nil, batch: callback)
    }

    /// Registers an observer for one operation (optionally some keys). It is dropped after the
    /// operation's `isFinished` change has been reported.
    public func observe(_ id: OperationID, keys: Set<ChangeKey>? = nil, _ callback: @escaping @Sendable (ChangeEvent) -> Void) -> ObserverToken {
        observers.add(operation: id, keys: keys, batch: { events in events.forEach(callback) })
    }

    /// Registers an observer for every change once it is durable: called with batches in `seq`
    /// order, only after the store has committed them (at once with a store that keeps nothing).
    /// This is what anything a client sees (feed, stream, webhooks) hangs off: a change shown
    /// can never be taken back by a crash. Register before changes are made.
    public func observeDurable(_ callback: @escaping @Sendable ([ChangeEvent]) -> Void) {
        _ = durable.add(callback)
    }

    /// Removes an observer.
    public func removeObserver(_ token: ObserverToken) { observers.remove(token) }

    /// Removes an observer registered with `observe(id, ...)`: the same as
    /// `removeObserver(_:)`, in time independent of how many operations are observed.
    public func removeObserver(_ token: ObserverToken, of id: OperationID) { observers.remove(token, of: id) }

    /// `waitUntilFinished()` without blocking a thread: calls `callback` once the operation's
    /// `isFinished` change has been reported to observers, or at once (before returning nil)
    /// when it is finished already; also when the operation leaves this engine unfinished (its
    /// queue went to another cluster instance: `wasReleased` says so). Otherwise returns a token for ``cancelFinishWait(_:of:)``,
    /// which a caller with a deadline must call at the deadline. The callback runs on the
    /// thread that reports changes, outside the engine's lock; it may be called after the
    /// finish is applied but before it is durable (see ``whenDurable(_:)``).
    public func onFinished(_ id: OperationID, _ callback: @escaping @Sendable () -> Void) throws(EngineError) -> ObserverToken? {
        if try read({ core throws(EngineError) in try core.op(id).state == .finished }) {
            callback()
            return nil
        }
        let fired = OneShot()
        // Registered before the state is read again: a finish applied after that read is
        // reported after it, so to this observer.
        let token = observers.add(operation: id, keys: [.isFinished], gone: { if fired.fire() { callback() } }) { events in
            for e in events { if case .bool(true) = e.new, fired.fire() { callback() } }
        }
        let finished: Bool
        do throws(EngineError) {
            finished = try read { core throws(EngineError) in try core.op(id).state == .finished }
        } catch {
            removeObserver(token, of: id)
            throw error
        }
        guard finished else { return token }
        removeObserver(token, of: id)
        if fired.fire() { callback() }
        return nil
    }

    /// How many observers of single operations (finish waiters included) are registered: what
    /// long polls hold on to, so tests can see that a waiter whose client went away is let go.
    public var operationObserverCount: Int { observers.perOperationCount }

    /// Forgets a finish waiter (its long poll timed out). Safe after it fired.
    public func cancelFinishWait(_ token: ObserverToken, of id: OperationID) { removeObserver(token, of: id) }

    /// Counts for metrics: operations by queue and state.
    public func stateCounts() -> [(queue: String, counts: [OperationState: Int])] {
        queues().map { ($0.name, $0.counts) }
    }

    /// The sequence number the next change will get.
    public var nextSequence: UInt64 { state.withLock { $0.nextSeq } }
}
