/// The five states of API.md's lifecycle.
public enum OperationState: String, Sendable, CaseIterable {
    /// Some dependency is unfinished.
    case pending
    /// Waiting for a free slot in a queue that is not suspended.
    case ready
    case executing
    case paused
    case finished
}

/// Everything that can be asked of an operation's state machine.
public enum OperationAction: String, Sendable, CaseIterable {
    /// The last unfinished dependency finished.
    case dependenciesMet
    /// The scheduler gave it a slot.
    case start
    /// The kind reported that the work ended.
    case complete
    /// A client cancelled it.
    case cancel
    case pause
    case resume
    /// An unfinished dependency was added to a ready operation (`update`, or a restore that
    /// finds one of its dependencies unfinished): it waits again.
    case dependencyAdded
    /// The host of its run asked to slow down (API.md "Hosts": a 429, or a 503 with
    /// `Retry-After`), or holds the start of its next attempt: the run ends without using an
    /// attempt and it waits again, ready.
    case hold
}

/// A refused request or move. The API layer maps each case to an HTTP status.
public enum EngineError: Error, Sendable, Equatable {
    case queueNotFound(String)
    case queueExists(String)
    case queueNotIdle(String, unfinished: Int)
    case operationNotFound(String)
    case invalidTransition(from: OperationState, action: OperationAction)
    case dependencyCycle(String)
    case alreadyStarted(String)
    case invalidArgument(field: String, detail: String)
    /// `allowed` lists the kinds a client may name, in the server's order.
    case unknownKind(String, allowed: [String])
    /// The request is well formed but this server does not permit it (e.g. an executable the
    /// `command` kind may not run); `reason` is the problem's slug.
    case notPermitted(field: String, reason: String, detail: String)
    /// A configured bound was reached; `limit` is its slug (`too-many-queues`,
    /// `too-many-operations`, `too-many-dependencies`). Nothing changed.
    case limitReached(String, limit: String = "limit-reached")
    /// The operation cannot be copied (a barrier: its meaning is the queue's position it was
    /// added at; add a new barrier instead).
    case notCopyable(String)
    /// Something this change needs cannot be had right now (the cluster's store cannot be
    /// read, this instance's block of operation ids is used up); retry shortly. Nothing changed.
    case unavailable(String)
    /// The queue is not this engine's to run (a cluster instance that does not own its
    /// partition, or no longer does): retry shortly, the request reaches its owner then.
    case notHere(String)
    /// No limiter of this name.
    case limiterNotFound(String)
    /// No host of this name is tracked.
    case hostNotFound(String)
    /// The queue has no schedule of this name.
    case scheduleNotFound(queue: String, name: String)
    /// The change conflicts with what exists now (a duplicate limiter, a limiter in use);
    /// `slug` names the case.
    case conflict(slug: String, detail: String)
}

/// What a move does beyond changing the state; the engine acts on it (`EngineCore.apply`).
public enum TransitionEffect: Sendable, Equatable {
    case none
    /// Set `isCancelled` and ask the kind to stop; the state stays `executing`.
    case requestStop
    /// Set `isCancelled`: it finishes without running (on).
    case markCancelled
    /// Ask the kind to hold its run still; the next start continues it.
    case pauseRun
}

extension OperationState {
    /// The one table of valid moves (API.md "Lifecycle"), and the only way the engine changes
    /// an operation's state (`OpRecord.take`). `dependenciesMet` tells where a resumed
    /// operation goes back to: ready when nothing holds it back (its dependencies, a
    /// `notBefore` still ahead). Every other pair is `EngineError.invalidTransition`.
    public func applying(_ action: OperationAction, dependenciesMet: Bool) throws(EngineError) -> (OperationState, TransitionEffect) {
        switch (self, action) {
        case (.pending, .dependenciesMet): return (.ready, .none)
        case (.ready, .dependencyAdded): return (.pending, .none)
        case (.ready, .start): return (.executing, .none)
        case (.executing, .complete): return (.finished, .none)
        case (.pending, .cancel), (.ready, .cancel), (.paused, .cancel): return (.finished, .markCancelled)
        case (.executing, .cancel): return (.executing, .requestStop)
        case (.pending, .pause), (.ready, .pause): return (.paused, .none)
        // A completion that raced a pause is kept and applied when the operation gets a slot again.
        case (.executing, .pause): return (.paused, .pauseRun)
        case (.paused, .resume): return (dependenciesMet ? .ready : .pending, .none)
        case (.executing, .hold): return (.ready, .none)
        default: throw .invalidTransition(from: self, action: action)
        }
    }
}

/// The observable keys (Foundation's KVO names plus `isPaused`, `queuePriority`, `progress`).
public enum ChangeKey: String, Sendable, CaseIterable {
    case isReady, isExecuting, isFinished, isCancelled, isPaused, queuePriority, progress
    /// A failed attempt is retried: `old` and `new` are attempt numbers.
    case attempt
    /// A host's breaker changed (API.md "Hosts"): the event names the host, not an operation.
    case breaker
}

/// The old or new value of a change.
public enum ChangeValue: Sendable, Equatable {
    /// Used as `old` when the operation was just created.
    case none
    case bool(Bool)
    case priority(QueuePriority)
    case progress(OperationProgress)
    case int(Int)
    case breaker(BreakerState)
}

/// One observed change. `seq` is server-wide and only grows. A host's breaker change
/// (`key == .breaker`) carries the host in `queue` (a queue name never has a `:`, a host always
/// has its port), operation 0, and a `state` that means nothing (`ready`).
public struct ChangeEvent: Sendable, Equatable {
    public var seq: UInt64
    public var time: Timestamp
    public var queue: String
    public var operation: OperationID
    public var key: ChangeKey
    public var old: ChangeValue
    public var new: ChangeValue
    /// The operation's state after the change.
    public var state: OperationState
    public init(seq: UInt64, time: Timestamp, queue: String, operation: OperationID, key: ChangeKey, old: ChangeValue, new: ChangeValue, state: OperationState)
    {
        self.seq = seq; self.time = time; self.queue = queue; self.operation = operation
        self.key = key; self.old = old; self.new = new; self.state = state
    }
}
