import Dispatch
import Locking
import Logging
import PostgresStore
import QueueAPI
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
/// Reading `seq > newest` in seq order never skips an event: every commit numbers its events
/// under a transaction advisory lock held until the commit is visible, so a reader that sees
/// seq N sees every seq below it (see `PGSchema.lockEvents`).
package final class FeedTail: Sendable {
    let logger: Logger
    let read: @Sendable (_ after: UInt64, _ limit: Int) throws -> [ChangeEvent]
    let lastSeq: @Sendable () -> UInt64
    let publish: @Sendable ([ChangeEvent]) -> Void
    private let state = Locking.Lock<(running: Bool, again: Bool, failing: Bool)>((false, false, false))
    static let spacing = 0.005

    init(
        logger: Logger, read: @escaping @Sendable (_ after: UInt64, _ limit: Int) throws -> [ChangeEvent],
        lastSeq: @escaping @Sendable () -> UInt64, publish: @escaping @Sendable ([ChangeEvent]) -> Void
    ) {
        self.logger = logger
        self.read = read
        self.lastSeq = lastSeq
        self.publish = publish
    }

    /// Listens for the NOTIFY of commits with events (`PGListener`; the caller stops it), and
    /// pulls when one comes; `service` pulls every second besides (the safety net).
    package func listen(notifiedAt url: String, ignoring: String? = nil) -> PGListener {
        let l = PGListener(url: url, ignoring: ignoring) { [self] in pull() }
        l.start()
        return l
    }

    /// Pulls every second: all a lone writer's feed needs besides its own commits, and a
    /// listener's safety net.
    package var service: PeriodicService { PeriodicService("feed", every: 1) { [self] in pull() } }

    /// Reads and publishes everything after the newest, now, on the calling thread. Safe beside
    /// a pull: `publish` drops what is not newer.
    func readNow() throws {
        while true {
            let batch = try read(lastSeq(), 1000)
            if !batch.isEmpty { publish(batch) }
            if batch.count < 1000 { return }
        }
    }

    func pull() {
        guard claim() else { return }
        pulls()
    }

    /// A pull on another thread, unless one runs: then that one reads again, and no thread is
    /// woken for nothing. At 3 instances an instance asks after most of its own commits (the
    /// others' events come between), about 500 times a second, nearly always while a pull
    /// runs (it reads, then waits `spacing`).
    func pullSoon() {
        guard claim() else { return }
        DispatchQueue.global().async { [self] in pulls() }
    }

    /// True when the caller is to run the pulls; else the running one reads again.
    private func claim() -> Bool {
        state.withLock { s -> Bool in
            if s.running { s.again = true; return false }
            s.running = true
            return true
        }
    }

    /// Reads until no pull was asked for meanwhile (the caller claimed the run).
    private func pulls() {
        while true {
            do {
                try readNow()
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

/// The feed and webhooks of an opqd that writes to PostgreSQL (a cluster's owner): events carry
/// the seq PostgreSQL gave them in the commit (`PGWriter`), not the engine's. Its own commits
/// are published as its writer reports them, before the requests that made them are answered
/// (a client that got a 2xx finds its change in the feed, as on SQLite); when they do not
/// follow the feed's newest (seqs a failed commit drew, events deleted with their queue, or a
/// commit whose events are not known), what lies between is read back first, in the writer's
/// aftermath (one report at a time, in commit order), so the order holds.
package final class OwnerFeed: Sendable {
    let events: EventLog
    let webhooks: Webhooks
    package let tail: FeedTail
    /// Reads a gap before its own commit in the writer's aftermath (one writer: rare). False
    /// when other instances commit all the time (partitions): the gap is read by the tail, at
    /// once but not in the writer's aftermath, so a change may reach this instance's feed a few
    /// milliseconds after its request was answered.
    let readsGaps: Bool

    /// `published`: every event shown, in seq order (a partitioned instance's directory of
    /// remote ends). `delivers`: whether this instance sends the webhooks of a queue's events
    /// (a partitioned instance: the queues it serves).
    package init(
        events: EventLog, webhooks: Webhooks, logger: Logger,
        read: @escaping @Sendable (_ after: UInt64, _ limit: Int) throws -> [ChangeEvent],
        published: @escaping @Sendable ([ChangeEvent]) -> Void = { _ in },
        delivers: @escaping @Sendable (String) -> Bool = { _ in true }, readsGaps: Bool = true
    ) {
        self.readsGaps = readsGaps
        self.events = events
        self.webhooks = webhooks
        // The tail's reads and `committed` both publish through this lock: each event once,
        // in seq order.
        let publishing = Locking.Lock<Void>(())
        tail = FeedTail(logger: logger, read: read, lastSeq: { events.lastSeq }) { batch in
            publishing.withLock { _ in
                let newest = events.lastSeq
                let fresh = batch.filter { $0.seq > newest }
                guard !fresh.isEmpty else { return }
                events.append(fresh)
                let mine = fresh.filter { delivers($0.queue) }
                if !mine.isEmpty { webhooks.deliver(mine) }
                published(fresh)
            }
        }
    }

    /// From the writer's aftermath, in commit order, after a commit with events (nil: not
    /// known, read them back).
    package func committed(_ batch: [ChangeEvent]?) {
        // Published as it is when it follows the feed's newest, or when the tail read part of
        // it already (publish drops what is not newer; a commit's seqs have no gap).
        if let first = batch?.first, first.seq <= events.lastSeq &+ 1, let batch {
            tail.publish(batch)
            return
        }
        if !readsGaps {
            tail.pullSoon()
            return
        }
        do {
            try tail.readNow()
        } catch {
            // Not published past what could not be read (that would skip it for good): the
            // batch is committed, so the background pull (and the tail's timer) brings it in
            // order, a moment after its requests are answered.
            tail.logger.warning("cannot read the feed back from PostgreSQL", metadata: ["error": "\(error)"])
            tail.pullSoon()
            return
        }
        if let batch { tail.publish(batch) }
    }
}
