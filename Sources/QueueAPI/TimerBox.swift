import Dispatch
import Locking

/// The background timers of a running application.
package final class TimerBox: @unchecked Sendable {
    private let lock = Lock<Void>(())
    private var timers: [DispatchSourceTimer] = []
    package init() {}
    package func set(_ t: [DispatchSourceTimer]) { lock.withLock { _ in timers = t } }
    package func cancelAll() {
        lock.withLock { _ in
            for t in timers { t.cancel() }; timers = []
        }
    }
}
