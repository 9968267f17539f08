import Dispatch
import Locking

/// A piece of background work the service does every `period` seconds, by name: the
/// retention sweep, the heartbeat, the feed's pull, a cluster instance's lease round. A
/// service's list of them is its background work, in one place (as River lists its
/// maintenance services and Hummingbird its `services`).
package struct PeriodicService: Sendable {
    package let name: String
    /// Seconds between runs; the first runs one period after the start.
    package let period: Double
    /// Where it runs: runs of one service never overlap there (a serial queue), or on the
    /// global queue when nil (a timer's runs never overlap either way).
    package let queue: DispatchQueue?
    package let work: @Sendable () -> Void

    package init(_ name: String, every period: Double, on queue: DispatchQueue? = nil, _ work: @escaping @Sendable () -> Void) {
        self.name = name
        self.period = period
        self.queue = queue
        self.work = work
    }
}

/// The periodic services of a running service: started in the order listed, stopped all at
/// once (a run under way finishes; none starts after `stopAll`).
package final class BackgroundServices: @unchecked Sendable {
    // @unchecked: `running` is touched only under `lock`.
    private let lock = Lock<Void>(())
    private var running: [(name: String, timer: DispatchSourceTimer)] = []

    package init() {}

    package func start(_ services: [PeriodicService]) {
        lock.withLock { _ in
            for s in services {
                let timer = DispatchSource.makeTimerSource(queue: s.queue ?? .global())
                timer.schedule(deadline: .now() + s.period, repeating: s.period)
                timer.setEventHandler(handler: s.work)
                timer.resume()
                running.append((s.name, timer))
            }
        }
    }

    /// The names of the services running, in the order they started.
    package var names: [String] { lock.withLock { _ in running.map(\.name) } }

    package func stopAll() {
        lock.withLock { _ in
            for r in running { r.timer.cancel() }
            running = []
        }
    }
}
