/// What an operation of some kind does. The engine does not know; it drives kinds through
/// this protocol and they report back through the `ExecutionContext`.
///
/// Every method is called outside the engine's lock and must return promptly: long work
/// runs on timers of ``ExecutionContext/scheduler`` or on the kind's own tasks or threads.
public protocol OperationKind: Sendable {
    /// Checks a spec when an operation is created; throw `EngineError.invalidArgument`
    /// naming the field (`spec.seconds`, ...) and what is allowed, or `.notPermitted` for a
    /// well-formed spec this server refuses to run.
    func validate(spec: JSONValue?) throws(EngineError)
    /// Refuses, before anything else about a request is checked, a spec this server will not
    /// run however the rest is fixed: throw `.notPermitted` (e.g. an executable that is not
    /// allowed). `validate` must refuse it too (it runs on every path that adds operations).
    func permit(spec: JSONValue?) throws(EngineError)
    /// The retry policy of an operation created without one (nil: no retries).
    var defaultRetry: RetryPolicy? { get }
    /// Starts the work, or continues it when `context.isResume` (after a pause).
    /// Report the end with `context.finish(_:)`, which may be called before `start` returns.
    func start(_ context: ExecutionContext)
    /// Asks the work to stop (cancel). The kind still reports the end through `finish`.
    func cancel(_ context: ExecutionContext)
    /// Asks the work to hold still (pause). The next `start` has `isResume` set.
    func pause(_ context: ExecutionContext)
    /// After a restart: what to do with an operation that was executing when the process
    /// stopped. The default starts a new attempt when `retry` allows, else fails it with
    /// `interrupted`.
    func recover(_ operation: OperationSnapshot) -> Recovery
    /// After a restart or a handover: an operation paused while it executed, whose kind recovers
    /// by `.keep`, is not started; its kind takes up what it saved (a worker's lease) and starts
    /// nothing. The default does nothing.
    func takeUpPaused(_ context: ExecutionContext)
    /// Seconds a run told to stop (`cancel`) may still take to be gone, e.g. a child process
    /// between SIGTERM and SIGKILL: a queue handed to another instance is not started there
    /// before. 0 (the default): gone at once.
    var stopGrace: Double { get }
    /// The target host (`host:port`, lowercase) an operation with `spec` sends to, which a
    /// circuit breaker guards (API.md "Hosts"); nil (the default): none.
    func host(spec: JSONValue?) -> String?
}

/// What happens at start-up to an operation that was executing when the process stopped.
public enum Recovery: Sendable, Equatable {
    /// Continue where it was (`isResume`, with its executed time): a timer's time left.
    case resume
    /// Start a new attempt (`attempt + 1`).
    case retry
    /// Finish it `failed` with this error type.
    case fail(String)
    /// Leave it executing, driven from outside (a worker's lease): the kind is started with
    /// `isResume` to take up its saved state at once, in a cluster before the commit of the
    /// queue's adoption (a worker's finish may come the moment the queue is served).
    case keep
}

extension OperationKind {
    public func validate(spec: JSONValue?) throws(EngineError) {}
    public func permit(spec: JSONValue?) throws(EngineError) {}
    public var defaultRetry: RetryPolicy? { nil }
    public var stopGrace: Double { 0 }
    public func takeUpPaused(_ context: ExecutionContext) {}
    public func host(spec: JSONValue?) -> String? { nil }
    public func recover(_ operation: OperationSnapshot) -> Recovery {
        if let r = operation.options.retry, operation.attempt < r.maxAttempts { return .retry }
        return .fail("interrupted")
    }
}

/// One run of one operation, handed to its kind. Reports carry a run token so that a report
/// from an earlier attempt can never change a later one.
public struct ExecutionContext: Sendable {
    public let operation: OperationID
    public let queue: String
    public let spec: JSONValue?
    /// 1 for the first attempt.
    public let attempt: Int
    /// True when this start continues an operation that was paused while executing.
    public let isResume: Bool
    /// Seconds the operation has executed before this start (paused time excluded).
    public let executedSeconds: Double
    /// What the kind saved for this operation (survives restarts).
    public let kindState: JSONValue?
    let token: UInt32
    let engine: QueueEngine

    /// Reports the end of the work. Later reports for the same run are ignored.
    public func finish(_ completion: Completion) {
        engine.complete(operation, token: token, completion)
    }

    /// Reports the end of the work with what it says about the operation's target host
    /// (`OperationKind.host(spec:)`): its breaker counts it, and a request to slow down
    /// (`.throttle`) puts the operation back to ready without using an attempt.
    public func finish(_ completion: Completion, host verdict: HostVerdict) {
        engine.complete(operation, token: token, completion, host: verdict)
    }

    /// Saves kind-private state with the operation (made durable like any change).
    public func save(_ state: JSONValue?) {
        engine.saveKindState(operation, token: token, state)
    }

    /// `save` for many runs in one step per engine (a kind handing out many at once).
    public static func save(_ items: [(context: ExecutionContext, state: JSONValue?)]) {
        for group in Dictionary(grouping: items, by: { ObjectIdentifier($0.context.engine) }).values {
            group[0].context.engine.saveKindStates(group.map { ($0.context.operation, $0.context.token, $0.state) })
        }
    }

    /// `finish` for many runs in one step per engine. The end of a paused operation applies at
    /// its resume; `saving` answers the kind state to save with it meanwhile (from the end and
    /// the attempt), in the same step, so that it survives a restart or a handover.
    public static func finish(
        _ items: [(context: ExecutionContext, completion: Completion)], savingParked saving: (@Sendable (Completion, Int) -> JSONValue)? = nil
    ) {
        for group in Dictionary(grouping: items, by: { ObjectIdentifier($0.context.engine) }).values {
            group[0].context.engine.complete(group.map { ($0.context.operation, $0.context.token, $0.completion) }, saving: saving)
        }
    }

    /// Whether this run is still the operation's current one (not cancelled, timed out,
    /// paused or superseded by a retry).
    public var isCurrent: Bool { engine.isCurrentRun(operation, token: token) }

    /// The engine's scheduler: a kind arms its own timers here, so tests can drive them.
    public var scheduler: any EngineScheduler { engine.scheduler }

    /// Reports progress; it becomes a `progress` change.
    public func progress(completed: Double, total: Double) {
        engine.reportProgress(operation, token: token, OperationProgress(completed: completed, total: total))
    }
}

/// A kind whose work ends the moment it starts, with the spec as its result. Used by the
/// benchmark and tests, and by barriers.
public struct ImmediateKind: OperationKind {
    public init() {}
    public func start(_ context: ExecutionContext) { context.finish(.succeeded(context.spec ?? .null)) }
    public func cancel(_ context: ExecutionContext) {}
    public func pause(_ context: ExecutionContext) {}
}
