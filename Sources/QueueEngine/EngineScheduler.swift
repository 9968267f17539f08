import Locking

/// Runs work later: the engine's timeouts, retry backoffs and `notBefore` wake-ups, and the
/// kinds' own timers (reachable as ``ExecutionContext/scheduler``). Injected so that tests
/// move time by hand (``ManualClock``) instead of sleeping.
public protocol EngineScheduler: Sendable {
    /// Calls `body` once, `seconds` from now, never before this call has returned. NaN and
    /// negative delays mean now; delays over ``EngineTimers/maxDelaySeconds`` are capped.
    func after(seconds: Double, _ body: @escaping @Sendable () -> Void)
}

/// Real time: ``EngineTimers/queue``, the serial queue every opqd timer fires on.
public struct DispatchScheduler: EngineScheduler {
    public init() {}
    public func after(seconds: Double, _ body: @escaping @Sendable () -> Void) {
        EngineTimers.queue.asyncAfter(deadline: EngineTimers.deadline(after: seconds), execute: body)
    }
}

/// A clock that moves only when told to, and the scheduler of that time: ``advance(seconds:)``
/// runs, on the calling thread and in deadline order, every timer that falls due, with the
/// clock showing each timer's deadline while it runs.
public final class ManualClock: EngineClock, EngineScheduler {
    private struct Timer {
        var due: Int64
        var order: UInt64
        var body: @Sendable () -> Void
    }
    private struct State {
        var now: Int64
        var timers: [Timer] = []
        var nextOrder: UInt64 = 0
    }
    private let state: Lock<State>

    public init(_ start: Timestamp = Timestamp(nanoseconds: 1_795_000_000_000_000_000)) { state = Lock(State(now: start.nanoseconds)) }

    public func now() -> Timestamp { Timestamp(nanoseconds: state.withLock { $0.now }) }

    public func after(seconds: Double, _ body: @escaping @Sendable () -> Void) {
        // The same clamping as the Dispatch scheduler's deadlines.
        guard case let .nanoseconds(delay) = EngineTimers.interval(seconds: seconds) else { return }
        state.withLock { s in
            s.timers.append(Timer(due: s.now.saturatingAdd(Int64(delay)), order: s.nextOrder, body: body))
            s.nextOrder &+= 1
        }
    }

    /// Timers armed and not yet run.
    public var pendingTimers: Int { state.withLock { $0.timers.count } }

    /// Moves time forward by `seconds`, running the timers that fall due on the way (timers
    /// they arm run too when they fall due before the end). Runs them outside the clock's
    /// lock, so they may read the clock and arm timers.
    public func advance(seconds: Double) {
        let end = state.withLock { Timestamp(nanoseconds: $0.now).adding(seconds: seconds).nanoseconds }
        while let body = state.withLock({ s -> (@Sendable () -> Void)? in
            let due = s.timers.indices.filter { s.timers[$0].due <= end }
            guard let next = due.min(by: { (s.timers[$0].due, s.timers[$0].order) < (s.timers[$1].due, s.timers[$1].order) }) else {
                s.now = end
                return nil
            }
            let timer = s.timers.remove(at: next)
            s.now = max(s.now, timer.due)
            return timer.body
        }) {
            body()
        }
    }
}
