import Digest
import Dispatch
import Locking
import Logging
import QueueEngine

/// Sends a webhook's POST. Failure modes are results, never traps: the implementation is the
/// outbound client that the `http` kind uses too (`OutboundWebhookTransport`).
package protocol WebhookTransport: Sendable {
    /// POSTs `body` to `url`; `done(nil)` for a 2xx answer, `done(reason)` for anything else.
    /// Returns what cancels the POST (then `done` is called with a reason).
    @discardableResult
    func post(url: String, body: [UInt8], headers: [(String, String)], timeout: Double, _ done: @escaping @Sendable (String?) -> Void)
        -> @Sendable () -> Void
}

/// What one webhook observer watches: the changes of one operation, or of every operation of a
/// queue, present and future.
enum ObserverScope: Sendable, Equatable {
    case operation(OperationID, queue: String)
    case queue(String)

    var queue: String {
        switch self {
        case let .operation(_, queue): return queue
        case let .queue(queue): return queue
        }
    }
}

/// How deliveries are paced (server options).
package struct DeliveryPolicy: Sendable {
    package init(timeout: Double = 10, backoff: Double = 1, maxBackoff: Double = 300, maxBuffered: Int = 256, window: UInt64 = 10_000) {
        self.timeout = timeout
        self.backoff = backoff
        self.maxBackoff = maxBackoff
        self.maxBuffered = maxBuffered
        self.window = window
    }

    /// Seconds one POST may take before it counts as failed.
    var timeout: Double = 10
    /// The first retry's delay; each further one doubles, up to `maxBackoff`.
    var backoff: Double = 1
    var maxBackoff: Double = 300
    /// Matched events an observer holds in memory; past it, it reads them back from the store.
    var maxBuffered = 256
    /// Seqs scanned per read from the store while catching up.
    var window: UInt64 = 10_000
}

/// Delivers one observer's events by cursor: in `seq` order, one POST at a time, at least once.
///
/// `cursor` is the seq of the last event the receiver acknowledged (2xx); it is written to the
/// store about once a second, so after a crash the events after it are sent again (receivers
/// deduplicate by `X-Opqd-Event-Seq`). New events are pushed in once they are durable and held
/// in a bounded buffer; an observer that falls behind (its receiver slow, failing or hanging)
/// stops buffering and later reads what it missed back from the store, window by window, so its
/// memory stays bounded and nothing is lost. A failed POST is retried, the same event, with
/// exponential backoff up to a cap, for as long as the observer exists: a receiver that fails
/// or hangs delays only its own observer. With a store that keeps no history (`--store memory`),
/// events past the buffer are dropped and counted instead.
final class Delivery: Sendable {
    struct State: Sendable {
        /// Matched events with seq > `cursor`, ascending, from `head`.
        var buffer: [ChangeEvent] = []
        var head = 0
        /// The last acknowledged seq (or where the observer started).
        var cursor: UInt64
        /// Every matching event with seq <= `covered` is delivered or in the buffer.
        var covered: UInt64
        /// False while catching up from the store.
        var live: Bool
        /// A POST, a store read or a retry's wait is in progress.
        var busy = false
        var stopped = false
        var persisted: UInt64
        var lastDelivered: UInt64? = nil
        var delivered: UInt64 = 0
        var failures: UInt64 = 0
        var consecutiveFailures = 0
        var dropped: UInt64 = 0
        var lastError: String? = nil
        var lastAttemptAt: Timestamp? = nil
        var lastSuccessAt: Timestamp? = nil
        var nextAttemptAt: Timestamp? = nil
        var sending = false
        /// Cancels the POST in flight, the one numbered `sends`.
        var cancel: (@Sendable () -> Void)? = nil
        var sends: UInt64 = 0

        var buffered: Int { buffer.count - head }
        /// The cursor worth keeping: past non-matching events once everything is sent (up to
        /// what every observer was pushed, `pushedThrough`).
        func durableCursor(pushedThrough: UInt64) -> UInt64 {
            live && buffered == 0 && !busy ? max(cursor, covered, pushedThrough) : cursor
        }
    }

    /// What `GET …/observers/{observer}` shows of a delivery.
    struct Snapshot: Sendable {
        var state: String
        var cursor: UInt64
        var lastDelivered: UInt64?
        var pending: Int
        var delivered: UInt64
        var failures: UInt64
        var consecutiveFailures: Int
        var dropped: UInt64
        var lastError: String?
        var lastAttemptAt: Timestamp?
        var lastSuccessAt: Timestamp?
        var nextAttemptAt: Timestamp?
        /// Seqs between the cursor and the newest durable event (an upper bound of what is owed).
        var behind: UInt64
    }

    let id: String
    let scope: ObserverScope
    let target: String
    private let transport: any WebhookTransport
    private let logger: Logger
    private let scheduler: any EngineScheduler
    private let secret: [UInt8]?
    private let policy: DeliveryPolicy
    /// Whether missed events can be read back from the store (false with `--store memory`).
    private let keepsHistory: Bool
    /// Reads matched events with `after` < seq <= `through` back from the store, and how far it
    /// got (`through`, or less when it hit `limit`); nil: the store keeps none.
    private let history: @Sendable (_ after: UInt64, _ through: UInt64, _ limit: Int) -> (events: [ChangeEvent], scanned: UInt64)?
    /// The newest durable seq (the feed's): catching up reads the store up to it.
    private let newestSeq: @Sendable () -> UInt64
    private let state: Lock<State>

    init(
        id: String, scope: ObserverScope, target: String, cursor: UInt64, newestSeq: @escaping @Sendable () -> UInt64, transport: any WebhookTransport,
        logger: Logger,
        scheduler: any EngineScheduler, secret: [UInt8]?, policy: DeliveryPolicy, keepsHistory: Bool,
        history: @escaping @Sendable (_ after: UInt64, _ through: UInt64, _ limit: Int) -> (events: [ChangeEvent], scanned: UInt64)?
    ) {
        self.id = id; self.scope = scope; self.target = target; self.transport = transport; self.logger = logger
        self.scheduler = scheduler; self.secret = secret; self.policy = policy; self.history = history
        self.keepsHistory = keepsHistory; self.newestSeq = newestSeq
        state = Lock(State(cursor: cursor, covered: cursor, live: cursor >= newestSeq() || !keepsHistory, persisted: cursor))
    }

    /// The headers of one delivery: the event's seq, the observer, and with a secret the body's
    /// HMAC-SHA256 (API.md: `X-Opqd-Signature: sha256=<hex HMAC of the body>`), over the exact
    /// bytes sent.
    static func headers(for event: ChangeEvent, body: [UInt8], observer: String, secret: [UInt8]?) -> [(String, String)] {
        var headers = [("Content-Type", "application/json"), ("X-Opqd-Event-Seq", "\(event.seq)"), ("X-Opqd-Observer", observer)]
        if let secret { headers.append(("X-Opqd-Signature", "sha256=" + SHA256.hex(SHA256.hmac(key: secret, message: body)))) }
        return headers
    }

    /// Durable events this observer wants, in seq order; `last` is the newest seq of the batch
    /// they came from. Only observers with a match are pushed to: one that is catching up
    /// compares with `newestSeq` instead, under its lock, so a batch is either read back from
    /// the store or pushed after it went live, never neither.
    func push(_ matched: [ChangeEvent], last: UInt64) {
        state.withLock { s in
            guard !s.stopped, s.live else { return }
            for e in matched where e.seq > s.covered {
                if s.buffered >= policy.maxBuffered {
                    if keepsHistory {
                        // Read the rest back from the store once the buffer has drained.
                        s.live = false
                        return
                    }
                    s.dropped += 1
                    if s.dropped == 1 || s.dropped % 1000 == 0 {
                        logger.warning(
                            "webhook backlog full and the store keeps no history: dropping events", metadata: ["observer": "\(id)", "dropped": "\(s.dropped)"])
                    }
                    s.covered = e.seq
                    continue
                }
                s.buffer.append(e)
                s.covered = e.seq
            }
            s.covered = max(s.covered, last)
        }
        pump()
    }

    /// Starts whatever is due: the next POST, or the next read from the store.
    func pump() {
        enum Next { case send(ChangeEvent, UInt64), read(after: UInt64, through: UInt64) }
        let next: Next? = state.withLock { s in
            guard !s.stopped, !s.busy else { return nil }
            if s.buffered > 0 {
                s.busy = true; s.sending = true
                s.lastAttemptAt = SystemClock().now()
                s.sends &+= 1
                return .send(s.buffer[s.head], s.sends)
            }
            guard !s.live else { return nil }
            let newest = newestSeq()
            let through = newest > s.covered && newest - s.covered > policy.window ? s.covered + policy.window : newest
            if through <= s.covered {
                s.live = true
                return nil
            }
            s.busy = true
            return .read(after: s.covered, through: through)
        }
        switch next {
        case let .send(event, number)?: send(event, number)
        case let .read(after, through)?: Self.readQueue.async { self.catchUp(after: after, through: through) }
        case nil: break
        }
    }

    /// Store reads of every observer, one at a time: a restart with many observers behind
    /// must not queue a thread per observer on the store's one read connection.
    static let readQueue = DispatchQueue(label: "opqd.webhooks.catch-up")

    private func catchUp(after: UInt64, through: UInt64) {
        let limit = policy.maxBuffered
        let read = history(after, through, limit)
        let failed: Bool = state.withLock { s in
            guard !s.stopped else { return false }
            guard let read else {
                // The read failed: nothing is taken for read; the same window again after a while.
                s.failures += 1
                s.lastError = "reading missed events back from the store failed"
                return true
            }
            s.busy = false
            for e in read.events where e.seq > s.covered && e.seq <= read.scanned { s.buffer.append(e) }
            s.covered = max(s.covered, min(read.scanned, through))
            return false
        }
        if failed {
            logger.warning("webhook catch-up: reading events from the store failed; retrying", metadata: ["observer": "\(id)"])
            scheduler.after(seconds: policy.backoff) { [self] in
                state.withLock { $0.busy = false }
                pump()
            }
            return
        }
        pump()
    }

    private func send(_ event: ChangeEvent, _ number: UInt64) {
        let body = event.json
        let cancel = transport.post(
            url: target, body: body, headers: Self.headers(for: event, body: body, observer: id, secret: secret), timeout: policy.timeout
        ) {
            [self] failure in
            state.withLock { $0.cancel = nil }
            if let failure {
                let delay: Double = state.withLock { s in
                    s.sending = false
                    s.failures += 1
                    s.consecutiveFailures += 1
                    s.lastError = failure
                    let exponent = min(s.consecutiveFailures - 1, 40)
                    let d = min(policy.backoff * Double(1 << UInt64(exponent)), policy.maxBackoff)
                    s.nextAttemptAt = SystemClock().now().adding(seconds: d)
                    return d
                }
                if state.withLock({ $0.consecutiveFailures }) == 1 {
                    logger.warning(
                        "webhook delivery failed; retrying with backoff", metadata: ["observer": "\(id)", "seq": "\(event.seq)", "error": "\(failure)"])
                }
                scheduler.after(seconds: delay) { [self] in
                    state.withLock { s in
                        s.busy = false; s.nextAttemptAt = nil
                    }
                    pump()
                }
                return
            }
            state.withLock { s in
                s.sending = false
                s.busy = false
                s.cursor = max(s.cursor, event.seq)
                s.lastDelivered = event.seq
                s.delivered += 1
                s.consecutiveFailures = 0
                s.nextAttemptAt = nil
                s.lastSuccessAt = SystemClock().now()
                if s.buffered > 0, s.buffer[s.head].seq == event.seq { s.head += 1 }
                if s.head >= 1024 || s.head == s.buffer.count {
                    s.buffer.removeFirst(s.head); s.head = 0
                }
            }
            pump()
        }
        // Kept so `stop` can cancel it, unless it already completed (or a later POST is out).
        let cancelNow: Bool = state.withLock { s in
            guard s.sends == number, s.sending else { return false }
            if s.stopped { return true }
            s.cancel = cancel
            return false
        }
        if cancelNow { cancel() }
    }

    /// Stops for good (the observer was removed or the server stops): a POST in flight is
    /// cancelled. Returns the final counters.
    @discardableResult
    func stop() -> Snapshot {
        let cancel: (@Sendable () -> Void)? = state.withLock { s in
            s.stopped = true; s.buffer = []; s.head = 0
            defer { s.cancel = nil }
            return s.cancel
        }
        cancel?()
        return snapshot(pushedThrough: 0)
    }

    /// The cursor to write if it moved since the last write (and marks it written); nil once
    /// stopped, so a removed observer's cursor is not written back after its deletion.
    func cursorToPersist(pushedThrough: UInt64) -> UInt64? {
        state.withLock { s in
            guard !s.stopped else { return nil }
            let c = s.durableCursor(pushedThrough: pushedThrough)
            guard c != s.persisted else { return nil }
            s.persisted = c
            return c
        }
    }

    func snapshot(pushedThrough: UInt64) -> Snapshot {
        let newest = newestSeq()
        return state.withLock { s in
            let status: String
            if s.nextAttemptAt != nil {
                status = "retrying"
            } else if s.sending {
                status = "sending"
            } else if !s.live {
                status = "catchingUp"
            } else {
                status = "idle"
            }
            let cursor = s.durableCursor(pushedThrough: pushedThrough)
            return Snapshot(
                state: status, cursor: cursor, lastDelivered: s.lastDelivered, pending: s.buffered, delivered: s.delivered, failures: s.failures,
                consecutiveFailures: s.consecutiveFailures, dropped: s.dropped, lastError: s.lastError, lastAttemptAt: s.lastAttemptAt,
                lastSuccessAt: s.lastSuccessAt, nextAttemptAt: s.nextAttemptAt, behind: newest > cursor ? newest - cursor : 0)
        }
    }
}
