import Dispatch
import Glibc
import Locking

/// What a placement that gives queues up keeps between its decision "served here" and the
/// engine: a request decided so passes the gate until its handler has handed its change to the
/// engine (`pass`), and a placement that takes queues out of its serving set waits for the
/// requests that passed in before that (`drain`), before its engine lets those queues go.
///
/// Without it, a request could be decided "here" a moment before its queue's partition left,
/// and reach the engine a moment after: a create, a finish or a cancel answered 404 for a
/// queue or operation that exists, on its next holder. Requests that enter after the serving
/// set changed are decided again from it (forwarded, or held while the queue moves), so the
/// wait is for the few in a handler at that instant, not for the load.
package final class ServingGate: Sendable {
    private struct State {
        /// Requests inside, by the generation they entered in (only generations with some).
        var inside: [UInt64: Int] = [:]
        var generation: UInt64 = 0
    }

    private let state = Lock(State())

    package init() {}

    /// Runs `body` inside the gate.
    package func pass<T>(_ body: () throws -> T) rethrows -> T {
        let entered = state.withLock { s in
            s.inside[s.generation, default: 0] += 1
            return s.generation
        }
        defer {
            state.withLock { s in
                let left = (s.inside[entered] ?? 1) - 1
                s.inside[entered] = left > 0 ? left : nil
            }
        }
        return try body()
    }

    /// Waits until every request that entered before this call has left, at most `seconds`
    /// (a handler stuck on a store outage must not hold a handover up for long). False when
    /// some were still inside at the bound.
    @discardableResult
    package func drain(within seconds: Double) -> Bool {
        let before = state.withLock { s in
            defer { s.generation &+= 1 }
            return s.generation
        }
        let deadline = DispatchTime.now() + max(0, min(seconds, 60))
        while true {
            let busy = state.withLock { s in s.inside.keys.contains { $0 <= before } }
            if !busy { return true }
            if DispatchTime.now() >= deadline { return false }
            usleep(200)
        }
    }
}
