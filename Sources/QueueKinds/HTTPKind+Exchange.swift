import Locking
import OutboundHTTP
import QueueEngine
import Synchronization

// MARK: - one request

/// One sending of an operation's request. Exactly one party ends it — the client's
/// completion, cancel or pause — by winning `claim()`.
final class HTTPExchange: Sendable {
    let context: ExecutionContext
    private let ended = Atomic<Bool>(false)
    private let task = Lock<OutboundTask?>(nil)

    init(context: ExecutionContext) {
        self.context = context
    }

    /// True for the one caller that ends this exchange.
    func claim() -> Bool {
        ended.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
    }

    /// Records the client's task; aborts it at once when the exchange already ended.
    func attach(_ outbound: OutboundTask) {
        task.withLock { $0 = outbound }
        if ended.load(ordering: .acquiring) { outbound.cancel() }
    }

    /// Stops the transfer; the client's completion for it will find the exchange claimed.
    func abort() { task.withLock { $0 }?.cancel() }
}
