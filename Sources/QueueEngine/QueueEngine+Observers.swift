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

    /// Counts for metrics: operations by queue and state.
    public func stateCounts() -> [(queue: String, counts: [OperationState: Int])] {
        queues().map { ($0.name, $0.counts) }
    }

    /// The sequence number the next change will get.
    public var nextSequence: UInt64 { state.withLock { $0.nextSeq } }
}
