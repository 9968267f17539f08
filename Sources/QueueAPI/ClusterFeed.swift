import Dispatch
import Locking
import Logging
import PostgresStore
import QueueEngine

#if canImport(Glibc)
import Glibc
#endif

/// Reads committed events newer than the feed's newest from PostgreSQL and publishes them, one
/// pull at a time: a pull asked for while one runs makes that one read again, so a NOTIFY is
/// never lost between the two. Reads again at most every `spacing` seconds: an idle feed
/// answers a NOTIFY at once, a busy one (a commit every millisecond) costs PostgreSQL at most
/// one read per spacing per instance.
///
/// Reading `seq > newest` in seq order never skips an event: every commit takes its seqs from
/// the counter row `opqd.event_seq` and holds its lock until the commit is visible, so a
/// reader that sees seq N sees every seq below it (see `PGSchema.insertEvents`).
final class FeedTail: Sendable {
    let membership: PGMembership
    let logger: Logger
    let lastSeq: @Sendable () -> UInt64
    let publish: @Sendable ([ChangeEvent]) -> Void
    private let state = Locking.Lock<(running: Bool, again: Bool, failing: Bool)>((false, false, false))
    static let spacing = 0.005

    init(
        membership: PGMembership, logger: Logger, lastSeq: @escaping @Sendable () -> UInt64,
        publish: @escaping @Sendable ([ChangeEvent]) -> Void
    ) {
        self.membership = membership
        self.logger = logger
        self.lastSeq = lastSeq
        self.publish = publish
    }

    /// Pulls when a commit with events NOTIFYs (`PGListener`), and every second in any case.
    /// The caller stops both (`PGListener.stop`, the timer's `cancel`).
    func follow(url: String) -> (PGListener, DispatchSourceTimer) {
        let listener = PGListener(url: url) { [self] in pull() }
        listener.start()
        let timer = DispatchSource.makeTimerSource(queue: .global())
        timer.schedule(deadline: .now() + 1, repeating: 1)
        timer.setEventHandler { [self] in pull() }
        timer.resume()
        return (listener, timer)
    }

    /// A pull on a thread of its own (for callers that must not block on PostgreSQL).
    func pullSoon() {
        DispatchQueue.global().async { [self] in pull() }
    }

    func pull() {
        let start = state.withLock { s -> Bool in
            if s.running { s.again = true; return false }
            s.running = true
            return true
        }
        guard start else { return }
        while true {
            do {
                while true {
                    let batch = try membership.events(after: lastSeq(), limit: 1000)
                    if !batch.isEmpty { publish(batch) }
                    if batch.count < 1000 { break }
                }
                state.withLock { $0.failing = false }
            } catch {
                let first = state.withLock { s -> Bool in
                    defer { s.failing = true }
                    return !s.failing
                }
                if first { logger.warning("cannot read the feed from PostgreSQL", metadata: ["error": "\(error)"]) }
            }
            usleep(UInt32(Self.spacing * 1_000_000))
            let more = state.withLock { s -> Bool in
                if s.again { s.again = false; return true }
                s.running = false
                return false
            }
            if !more { return }
        }
    }
}

/// The owner's feed and webhooks in a cluster: events carry the seq PostgreSQL gave them in
/// the commit (`PGWriter`), not the engine's. The owner's own commits are published as its
/// writer reports them, before the requests that made them are answered (a client that got a
/// 2xx finds its change in the feed, as on one instance); anything between the feed's newest
/// and them (another writer's commits) is read back from PostgreSQL first (`FeedTail`).
final class OwnerFeed: Sendable {
    let events: EventLog
    let webhooks: Webhooks
    let tail: FeedTail

    init(events: EventLog, webhooks: Webhooks, membership: PGMembership, logger: Logger) {
        self.events = events
        self.webhooks = webhooks
        // The tail's reads and `committed` both publish through this lock: each event once,
        // in seq order.
        let publishing = Locking.Lock<Void>(())
        tail = FeedTail(membership: membership, logger: logger, lastSeq: { events.lastSeq }) { batch in
            publishing.withLock { _ in Self.publish(batch, to: events, webhooks) }
        }
    }

    /// Newer events only, in seq order: to the feed, then to the webhooks.
    private static func publish(_ batch: [ChangeEvent], to events: EventLog, _ webhooks: Webhooks) {
        let newest = events.lastSeq
        let fresh = batch.filter { $0.seq > newest }
        guard !fresh.isEmpty else { return }
        events.append(fresh)
        webhooks.deliver(fresh)
    }

    /// From the writer thread, after a commit with events (nil: not known, read them back).
    func committed(_ batch: [ChangeEvent]?) {
        guard let batch, let first = batch.first else {
            tail.pullSoon()
            return
        }
        // Another writer's commits come between: they are read back first, then these.
        if first.seq > events.lastSeq &+ 1 {
            tail.pullSoon()
            return
        }
        tail.publish(batch)
    }
}
