import Locking
import QueueEngine

/// `delay` `{"seconds": S}`: a timer (the seed documents' NSTimer-driven async operation). Cancel stops it at once;
/// pause keeps the time left (the engine counts executed time), resume runs only the rest.
public final class DelayKind: OperationKind {
    /// Longest accepted delay (31 days).
    public static let maxSeconds = 31.0 * 86400
    /// The live timer generation per operation; a timer that fires with another generation
    /// was cancelled or paused and does nothing.
    private let live = Lock<(next: UInt64, byOperation: [OperationID: UInt64])>((1, [:]))

    public init() {}

    public func validate(spec: JSONValue?) throws(EngineError) {
        guard let spec else { throw .invalidArgument(field: "spec", detail: "kind delay needs a spec {\"seconds\": number}") }
        guard case let .object(members) = spec else {
            throw .invalidArgument(field: "spec", detail: "must be an object {\"seconds\": number}; got \(spec.typeName)")
        }
        for (k, _) in members where k != "seconds" {
            throw .invalidArgument(field: "spec.\(k)", detail: "unknown field; kind delay allows only seconds")
        }
        guard let s = spec["seconds"] else {
            throw .invalidArgument(field: "spec.seconds", detail: "is required: a number of seconds from 0 to \(Int(Self.maxSeconds))")
        }
        guard case let .number(seconds) = s, seconds >= 0, seconds <= Self.maxSeconds else {
            throw .invalidArgument(field: "spec.seconds", detail: "must be a number from 0 to \(Int(Self.maxSeconds)); got \(s.text)")
        }
    }

    /// The spec's seconds, pinned to 0...maxSeconds: a spec read back from a store was not
    /// validated again, and a timer's nanoseconds must never overflow.
    static func seconds(_ spec: JSONValue?) -> Double {
        if case let .number(s)? = spec?["seconds"], s >= 0 { return min(s, maxSeconds) }
        return 0
    }

    public func start(_ context: ExecutionContext) {
        let total = Self.seconds(context.spec)
        let left = max(0, total - context.executedSeconds)
        let id = context.operation
        let generation = live.withLock { l in
            let g = l.next
            l.next += 1
            l.byOperation[id] = g
            return g
        }
        context.scheduler.after(seconds: left) { [self] in
            let current = live.withLock { l in
                guard l.byOperation[id] == generation else { return false }
                l.byOperation[id] = nil
                return true
            }
            if current { context.finish(.succeeded(.object([("seconds", .number(total))]))) }
        }
    }

    private func stop(_ id: OperationID) -> Bool {
        live.withLock { $0.byOperation.removeValue(forKey: id) != nil }
    }

    /// After a restart a timer resumes with its time left (wall-clock time counts, so one that
    /// should have fired while the server was down fires at once).
    public func recover(_ operation: OperationSnapshot) -> Recovery { .resume }

    public func cancel(_ context: ExecutionContext) {
        _ = stop(context.operation)
        context.finish(.failed(type: "cancelled", detail: "timer stopped"))
    }

    public func pause(_ context: ExecutionContext) {
        _ = stop(context.operation)
    }
}
