import Dispatch
import Locking
import QueueEngine
import StoreKit
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The single writer: a dedicated thread that owns the write connection and commits everything
/// submitted while the previous commit ran in ONE transaction (group commit), exactly as the
/// SQLite store's `StoreWriter` does; `synchronous_commit` stays at the server's `on`, so a
/// commit that returned is on the server's disk (and its synchronous standbys, if any).
///
/// A batch is one round trip: pipeline mode sends `BEGIN`, one `INSERT ... SELECT unnest($1),
/// unnest($2), ...` per table (every row of the batch in array parameters; `ON CONFLICT DO
/// UPDATE` for queues and operations, a plain INSERT for events, retried as an upsert after a
/// unique violation), the few other statements, `COMMIT` and a sync point, then reads the
/// answers. The statements of the common commit are prepared once per connection (`Statement`).
///
/// Without a fence, the connection also holds the session-level advisory lock that keeps a
/// second opqd off the database. Holding it on the connection that commits, rather than a
/// separate one, means a lost lock cannot go unnoticed: the lock goes with the connection, and
/// the writer takes it again on its new connection before it commits anything more. With a
/// fence (a cluster owner), every transaction starts with `opqd.fence` instead.
///
/// Events get their `seq` in the commit, from the sequence `opqd.event_seq` under a
/// transaction advisory lock (see `PGSchema.lockEvents`): several writers (cluster owners)
/// share one global seq, and a feed reader never skips an event that becomes visible later.
/// The engine's own seqs only order the rows.
///
/// When the connection breaks, the writer reconnects with backoff and commits the batch again.
/// Every statement but the events' INSERT is an upsert or a delete, so running it twice gives
/// the same result as once; the INSERT would number the events twice, so a batch with events
/// first moves this writer's mark (`opqd.mark`: its newest committed batch), which refuses a
/// batch that an earlier attempt committed though its answer was lost (and waits for an
/// attempt still running on the server). Nothing is reported durable until a COMMIT is
/// answered (or the mark shows it was); `lastError` says why meanwhile (readiness reads it).
///
/// @unchecked Sendable: `connection`, `bulk` and the dedup tables are touched only by the writer
/// thread while it runs, and by `init` before it starts. Everything callers touch is in `queue`
/// or atomic.
final class PGWriter: @unchecked Sendable {
    let queue = GroupCommitQueue()
    /// Where a commit's aftermath runs (its events published, then marking it durable and its
    /// callbacks: answers, held starts), in commit order, as in the SQLite store's
    /// `StoreWriter`: on the writer thread it was 42 % of that thread's CPU with workers claiming
    /// and finishing (`scripts/bench-pgqueuer.sh`, perf), time in which nothing was written.
    let aftermath = CommitAftermath(label: "opqd.pg.completions")
    private let url: String
    let displayURL: String

    let counters = WriterCounters()
    let lastError = Lock<PostgresStoreError?>(nil)
    let lastSeq: Atomic<UInt64>

    private var connection: PGConnection?
    /// Names this writer's row in `opqd.commit_mark`: random, as batch numbers start again with
    /// every writer.
    let writerID: String = {
        var g = SystemRandomNumberGenerator()
        return hex64(g.next()) + hex64(g.next())
    }()
    private var bulk = BulkRows()
    /// Batches this writer took, the one being committed included (its mark's numbering).
    private var batches: UInt64 = 0
    private var lastOperation: [UInt64: Int] = [:]
    private var lastQueue: [String: Int] = [:]
    private var lastEvent: [UInt64: Int] = [:]
    private var lastLimiter: [String: Int] = [:]
    private var lastHost: [String: Int] = [:]
    private var lastSchedule: [String: Int] = [:]
    private var thread: pthread_t?

    /// How long an idle writer waits before checking its connection (so readiness notices a
    /// server that went away even when nothing is written).
    static let idleCheckSeconds = 2.0

    /// With a fence, every commit first checks (`opqd.fence`) that this instance still owns the
    /// queues at that epoch, instead of the advisory lock; a refused commit is never retried:
    /// `fenced` turns true, `onFenced` is called once, and nothing more is committed or reported
    /// durable.
    let fence: PGFence?
    private let onFenced: @Sendable () -> Void
    let fenced = Atomic<Bool>(false)

    init(
        connection: PGConnection, url: String, displayURL: String, lastSeq: UInt64, fence: PGFence? = nil,
        onFenced: @escaping @Sendable () -> Void = {}
    ) throws(PGFailure) {
        self.fence = fence
        self.onFenced = onFenced
        bulk.epoch = fence?.epoch
        try connection.enterPipelineMode()
        try connection.prepare(Statement.allCases.map { ($0.name, $0.sql) })
        self.connection = connection
        self.url = url
        self.displayURL = displayURL
        self.lastSeq = Atomic(lastSeq)
    }

    // MARK: - callers

    @discardableResult
    func submit(_ job: WriteJob) -> Bool { queue.submit(job) }

    func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) { queue.whenDurable(ticket, done) }

    /// True when called on the writer thread itself or from a commit's aftermath (where
    /// waiting for the writer would deadlock).
    var isWriterThread: Bool {
        if aftermath.isCurrent { return true }
        guard let t = thread else { return false }
        return pthread_equal(t, pthread_self()) != 0
    }

    // MARK: - the thread

    /// Starts the thread; false when the system would not start one.
    func start() -> Bool {
        let context = Unmanaged.passRetained(self).toOpaque()
        var tid = pthread_t()
        let rc = pthread_create(
            &tid, nil,
            { arg in
                guard let arg else { return nil }
                let writer = Unmanaged<PGWriter>.fromOpaque(arg).takeRetainedValue()
                writer.run()
                return nil
            }, context)
        if rc != 0 {
            Unmanaged<PGWriter>.fromOpaque(context).release()
            return false
        }
        thread = tid
        return true
    }

    /// Stops taking work and lets the thread commit what is queued (giving up after a few
    /// failed attempts), then closes the connection, which releases the instance lock. On the
    /// writer thread itself (a durability callback) it cannot wait for itself.
    func stopAndFinish() {
        let onWriter = isWriterThread
        queue.stop()
        guard let t = thread else {
            connection?.close()
            return
        }
        if onWriter {
            pthread_detach(t)
        } else {
            pthread_join(t, nil)
            aftermath.drain()  // the last commits' aftermath has run
        }
    }

    private func run() {
        var jobs: [WriteJob] = []
        while true {
            // A commit left unannounced is announced when its spacing is up, if no commit did.
            let idle =
                owed ? max(0, Double(lastNotified &+ notifySpacing.load(ordering: .relaxed) &- clockNanos(CLOCK_MONOTONIC)) / 1e9) : Self.idleCheckSeconds
            switch queue.take(into: &jobs, idleSeconds: idle) {
            case .commit:
                commitWithRetry(jobs)
                jobs.removeAll(keepingCapacity: true)
            case .exit:
                if owed { announce() }
                connection?.close()
                connection = nil
                return
            case .idle where owed:
                announce()
            case .idle:
                checkIdleConnection()
            case .again:
                continue
            }
        }
    }

    // MARK: - NOTIFY

    /// At most one `NOTIFY opqd_events` per this many nanoseconds (the feed's own spacing,
    /// `FeedTail.spacing`): a commit with events sooner after the last one sends none and is
    /// announced by the next NOTIFY, its own commit's or `announce`'s when the spacing is up.
    /// Every NOTIFY wakes every instance's listener (its backend reads the notification queue
    /// in a transaction of its own, its opqd thread reads the feed): one per commit was 12 %
    /// of PostgreSQL's CPU at 3 instances, and at 1 instance woke its own listener for nothing.
    static let notifySpacingNanos = 5_000_000
    /// This writer's spacing (tests lengthen it to see a NOTIFY held back).
    let notifySpacing = Atomic<Int>(PGWriter.notifySpacingNanos)
    /// When the last NOTIFY was sent (monotonic ns), and whether a commit with events came after
    /// it (writer thread only).
    private var lastNotified = 0
    private var owed = false

    /// Whether the commit being sent carries a NOTIFY (a writer with a fence, the only kind
    /// whose commits others read).
    private func notifiesNow() -> Bool {
        fence != nil && clockNanos(CLOCK_MONOTONIC) &- lastNotified >= notifySpacing.load(ordering: .relaxed)
    }

    /// A commit with events committed, `notified` or not (nothing to do without a fence).
    private func committed(notified: Bool) {
        guard fence != nil else { return }
        if notified {
            lastNotified = clockNanos(CLOCK_MONOTONIC)
            owed = false
        } else {
            owed = true
        }
    }

    /// The NOTIFY owed to the last commits, on its own. When it fails (the connection broke),
    /// the next commit's NOTIFY, or the feeds' one-second read, brings them in.
    private func announce() {
        guard let fence else { return }
        committed(notified: true)
        do throws(PGFailure) {
            let conn = try usableConnection()
            try conn.send(prepared: Statement.notifyEvents.name, [PGParameter(fence.instance)])
            try conn.sync()
            _ = try conn.readPipeline(count: 1)
        } catch {
            failed(error, counting: false)
        }
    }

    /// An empty round trip while idle: a broken connection is found (and replaced) now, not at
    /// the next commit, so readiness says so meanwhile.
    private func checkIdleConnection() {
        var delay: UInt32 = 50_000
        while !queue.isStopping {
            do throws(PGFailure) {
                let conn = try usableConnection()
                try conn.send("SELECT 1")
                try conn.sync()
                _ = try conn.readPipeline(count: 1)
                lastError.withLock { $0 = nil }
                return
            } catch {
                failed(error, counting: false)
                // Work that arrives meanwhile is taken by the commit loop, which retries too.
                if queue.hasJobs { return }
                usleep(delay)
                delay = min(delay * 2, 2_000_000)
            }
        }
    }

    /// Session settings of the write connection, whatever the server, database or role set:
    /// a commit that returned must be durable (`synchronous_commit=off` is raised to `on`;
    /// `local` and the replication levels are kept), and a large batch must not be cut off by a
    /// `statement_timeout` (it would be retried, and cut off, forever).
    static func prepareSession(_ c: PGConnection) throws(PGFailure) {
        if try c.exec("SELECT current_setting('synchronous_commit')").text(0, 0) == "off" {
            try c.exec("SET synchronous_commit TO on")
        }
        try c.exec("SET statement_timeout TO 0")
    }

    /// A cluster owner's write connection: a transaction it leaves open (the link cut in the
    /// middle of a pipeline, so COMMIT never arrived) holds the fence's share lock on the
    /// ownership row, and the takeover would wait for it until TCP gives up, which can take
    /// hours: the server ends such a session after the lease. Keepalives find a dead link
    /// sooner too.
    static func prepareFencedSession(_ c: PGConnection, leaseSeconds: Double) throws(PGFailure) {
        let ms = Int(max(1, min(leaseSeconds, 300)) * 1000)
        try c.exec("SELECT set_config('idle_in_transaction_session_timeout', $1, false)", [PGParameter(String(ms))])
        try c.exec("SET tcp_keepalives_idle TO 5")
        try c.exec("SET tcp_keepalives_interval TO 2")
        try c.exec("SET tcp_keepalives_count TO 3")
    }

    /// The connection, reconnecting (and taking the instance lock again) when it broke.
    private func usableConnection() throws(PGFailure) -> PGConnection {
        if let c = connection, c.isUsable { return c }
        connection?.close()
        connection = nil
        let c = try PGConnection(url: url)
        if let fence { try Self.prepareFencedSession(c, leaseSeconds: fence.leaseSeconds) }
        var locked = fence != nil
        if !locked { locked = try c.exec("SELECT pg_try_advisory_lock($1::bigint)", [PGParameter(PGSchema.instanceLock)]).bool(0, 0) == true }
        guard locked else {
            throw PGFailure(
                message: "another opqd instance took the database's instance lock while this one was disconnected", sqlState: nil,
                connectionLost: true)
        }
        try Self.prepareSession(c)
        try c.enterPipelineMode()
        try c.prepare(Statement.allCases.map { ($0.name, $0.sql) })
        connection = c
        return c
    }

    /// Drops a broken connection and says why in `lastError`; `counting`: a commit failed (the
    /// `failures` counter), not an idle check.
    private func failed(_ error: PGFailure, counting: Bool = true) {
        if counting { counters.failures.add(1, ordering: .relaxed) }
        if error.connectionLost {
            connection?.close()
            connection = nil
        }
        let e = PostgresStoreError(error.connectionLost ? .cannotConnect : .io, url: displayURL, detail: error.description)
        lastError.withLock { $0 = e }
    }

    /// Commits `jobs`, retrying with backoff (reconnecting when the connection broke): nothing
    /// is reported durable until it is. While closing it gives up after a few attempts, and the
    /// callbacks of what was lost never fire.
    private func commitWithRetry(_ jobs: [WriteJob]) {
        // Fenced: another instance owns the queues now; nothing of this one may be written.
        if fenced.load(ordering: .acquiring) {
            for case let .purge(_, _, reply) in jobs { reply.send(0) }
            for case let .purgeIdempotency(_, reply) in jobs { reply.send(0) }
            return
        }
        var delay: UInt32 = 20_000
        var attempt = 0
        var catchUp = false
        batches += 1
        let batch = batches
        while true {
            attempt += 1
            do throws(PGFailure) {
                let conn = try usableConnection()
                let start = WriterCounters.clocks()
                var outcome = try apply(jobs, on: conn, batch: batch, catchUp: catchUp)
                if outcome.hadEvents { committed(notified: outcome.notified) }
                outcome.seconds = counters.timed(since: start)
                lastError.withLock { $0 = nil }
                report(outcome)
                return
            } catch {
                if error.sqlState == PGSchema.fencedState {
                    lastError.withLock {
                        $0 = PostgresStoreError(.io, url: displayURL, detail: "this instance no longer owns the queues: \(error.message)")
                    }
                    // Told after the aftermath of every commit before this one (their answers and
                    // events), but never on the writer thread.
                    let first = !fenced.exchange(true, ordering: .acquiringAndReleasing)
                    aftermath.after { [onFenced] in
                        for case let .purge(_, _, reply) in jobs { reply.send(0) }
                        for case let .purgeIdempotency(_, reply) in jobs { reply.send(0) }
                        if first { DispatchQueue.global().async { onFenced() } }
                    }
                    return
                }
                if error.sqlState == PGSchema.committedState {
                    // An earlier attempt at this batch committed, though its answer was lost
                    // (the mark says so): done, and its events are not numbered twice. Whether
                    // it sent a NOTIFY is not known: one more is owed.
                    if Self.hasEvents(jobs) { committed(notified: false) }
                    lastError.withLock { $0 = nil }
                    report(Self.outcomeWithoutCommit(jobs))
                    return
                }
                if error.sqlState == "23505" && !catchUp {
                    // unique_violation: the sequence is behind the stored events (a database
                    // edited by hand). Move it past them rather than wedge the writer.
                    catchUp = true
                    continue
                }
                failed(error)
                if queue.isStopping && attempt >= 3 {
                    for case let .purge(_, _, reply) in jobs { reply.send(0) }
                    for case let .purgeIdempotency(_, reply) in jobs { reply.send(0) }
                    return
                }
                usleep(delay)
                delay = min(delay * 2, 2_000_000)
            }
        }
    }

    /// The statements of the common commit, prepared on every write connection: parsed once per
    /// connection, not once per commit, and planned once when the generic plan is as good.
    /// (Parsing and planning them was about a third of PostgreSQL's CPU per commit.)
    enum Statement: String, CaseIterable {
        case begin, fence, fenceParts, markCommit, fencePartsMark, fencePartsMarkNotify, lockEvents, upsertQueue, upsertQueues, upsertOperations
        case lockAndInsertEvents, insertEvents, upsertIdempotency, notifyEvents, commit

        var name: String { "opqd_write_" + rawValue }

        var sql: String {
            switch self {
            case .begin: "BEGIN"
            case .fence: PGSchema.fence
            case .fenceParts: PGSchema.fenceParts
            case .markCommit: PGSchema.markCommit
            case .fencePartsMark: PGSchema.fencePartsMark
            case .fencePartsMarkNotify: PGSchema.fencePartsMarkNotify
            case .lockEvents: PGSchema.lockEvents
            case .upsertQueue: PGSchema.upsertQueue
            case .upsertQueues: PGSchema.upsertQueues
            case .upsertOperations: PGSchema.upsertOperations
            case .lockAndInsertEvents: PGSchema.lockAndInsertEvents
            case .insertEvents: PGSchema.insertEvents
            case .upsertIdempotency: PGSchema.upsertIdempotency
            case .notifyEvents: PGSchema.notifyEvents
            case .commit: "COMMIT"
            }
        }
    }

    private struct Outcome: Sendable {
        var ticket: UInt64 = 0
        var records = 0
        var callbacks: [@Sendable () -> Void] = []
        var replies: [(CommitReply, Int)] = []
        /// The newest seq the commit handed out (0: it had no events).
        var lastSeq: UInt64 = 0
        /// The committed events with the seqs they were given; nil when unknown (a commit whose
        /// answer was lost).
        var events: [ChangeEvent]? = []
        /// Whether the commit had events, and whether it sent the NOTIFY.
        var hadEvents = false
        var notified = false
        /// Its wall-clock seconds.
        var seconds = 0.0
    }

    /// Whether a batch has events (then it moves its writer's mark).
    static func hasEvents(_ jobs: [WriteJob]) -> Bool {
        jobs.contains { job in
            guard case let .records(records, _) = job else { return false }
            return records.contains { if case .event = $0 { true } else { false } }
        }
    }

    /// What a batch that was committed, though its answer was lost, reports: every callback;
    /// the counts of its deletes are unknown (0: a purge goes on at its next round).
    private static func outcomeWithoutCommit(_ jobs: [WriteJob]) -> Outcome {
        var out = Outcome()
        out.events = nil
        for job in jobs {
            switch job {
            case let .records(records, ticket):
                out.ticket = max(out.ticket, ticket)
                out.records += records.count
            case let .meta(pairs, done):
                out.records += pairs.count
                if let done { out.callbacks.append(done) }
            case let .deleteMetaPrefix(_, done):
                if let done { out.callbacks.append(done) }
            case let .purge(_, _, reply), let .purgeIdempotency(_, reply):
                out.replies.append((reply, 0))
            }
        }
        return out
    }

    /// Whether `jobs` write to `meta`.
    static func hasMeta(_ jobs: [WriteJob]) -> Bool {
        jobs.contains { job in
            switch job {
            case .meta, .deleteMetaPrefix: return true
            default: return false
            }
        }
    }

    /// One transaction for everything in `jobs`, in order. An operation, queue or event seq
    /// written several times is written once, at its last position (the upserts replace whole
    /// rows, so that is the same result as writing each), which also keeps every key to one row
    /// per statement as `ON CONFLICT DO UPDATE` requires. A limiter's row is its last record's
    /// too: the last upsert, or a delete after it.
    /// `batch`: this writer's number for the batch (the same on every attempt), which its mark
    /// holds once committed.
    private func apply(_ jobs: [WriteJob], on conn: PGConnection, batch: UInt64, catchUp: Bool) throws(PGFailure) -> Outcome {
        var out = Outcome()
        lastOperation.removeAll(keepingCapacity: true)
        lastQueue.removeAll(keepingCapacity: true)
        lastEvent.removeAll(keepingCapacity: true)
        lastLimiter.removeAll(keepingCapacity: true)
        lastHost.removeAll(keepingCapacity: true)
        lastSchedule.removeAll(keepingCapacity: true)
        var hostEvents = false
        var position = 0
        let partitioned = fence?.partitions != nil
        var touched = Set<Int>()
        for case let .records(records, _) in jobs {
            for r in records {
                switch r {
                case let .operation(s):
                    lastOperation[s.id.raw] = position
                    if partitioned { touched.insert(QueuePartitions.of(queue: s.queue)) }
                case let .queue(q):
                    lastQueue[q.name] = position
                    if partitioned { touched.insert(QueuePartitions.of(queue: q.name)) }
                case let .event(e):
                    lastEvent[e.seq] = position
                    // A host's event names no queue: global, like a limiter.
                    if e.key == .breaker {
                        hostEvents = true
                    } else if partitioned {
                        touched.insert(QueuePartitions.of(queue: e.queue))
                    }
                case let .queueDeleted(name):
                    if partitioned { touched.insert(QueuePartitions.of(queue: name)) }
                case let .limiter(l): lastLimiter[l.name] = position
                case let .limiterDeleted(name): lastLimiter[name] = position
                case let .host(h): lastHost[h.host] = position
                case let .schedule(s):
                    lastSchedule[s.queue + "\u{0}" + s.spec.name] = position
                    if partitioned { touched.insert(QueuePartitions.of(queue: s.queue)) }
                case let .scheduleDeleted(queue, name):
                    lastSchedule[queue + "\u{0}" + name] = position
                    if partitioned { touched.insert(QueuePartitions.of(queue: queue)) }
                case let .history(row):
                    if partitioned { touched.insert(QueuePartitions.of(queue: row.queue)) }
                case .kept: break
                case let .batchPartAdded(_, part):
                    if partitioned { touched.insert(part) }
                }
                position += 1
            }
        }
        // Partitioned: the epochs of the partitions written to, as this instance won them. One
        // it does not hold (given up meanwhile) fences the commit like a lost one.
        var partitionEpochs: [Int: Int64] = [:]
        var anyOf: [Int: Int64] = [:]
        if let held = fence?.partitions {
            let all = held.all
            for p in touched {
                guard let e = all[p] else {
                    throw PGFailure(
                        message: "partition \(p) is not held by this instance", sqlState: PGSchema.fencedState, connectionLost: false)
                }
                partitionEpochs[p] = e
            }
            // Meta writes (counts of unclean stops, observers and their cursors) and limiters
            // (global, `opqd.limiters`) name no partition: a batch with one and no other fence
            // is fenced by any one of the partitions held (`PGSchema.fenceAny`), so an instance
            // cut off past its leases, whose partitions all went to others, writes none, while
            // one partition given up meanwhile does not fence a healthy instance's write. (An
            // instance that holds no partition yet sends no fence: it writes them unfenced.)
            if touched.isEmpty, !lastLimiter.isEmpty || !lastHost.isEmpty || hostEvents || Self.hasMeta(jobs) { anyOf = all }
        }
        var sent = 0
        /// Statement index -> the reply that gets its row count.
        var counted: [(Int, CommitReply)] = []
        /// Statements that answer the newest seq they handed out, with their events in order.
        var numbering: [(statement: Int, events: [ChangeEvent])] = []
        var pending: [ChangeEvent] = []
        var deletes = false
        var notified = false
        func send(_ sql: String, _ parameters: [PGParameter] = []) throws(PGFailure) {
            try conn.send(sql, parameters)
            sent += 1
        }
        func send(_ statement: Statement, _ parameters: [PGParameter] = []) throws(PGFailure) {
            try conn.send(prepared: statement.name, parameters)
            sent += 1
        }
        func flush() throws(PGFailure) {
            if bulk.queueCount == 1, let q = bulk.lastQueue {
                try send(.upsertQueue, PGSchema.queueParameters(q))
            } else if bulk.queueCount > 0 {
                try send(.upsertQueues, bulk.queues.map(\.parameter))
            }
            if bulk.operationCount > 0 { try send(.upsertOperations, bulk.operations.map(\.parameter)) }
            if bulk.eventCount > 0 {
                // The commit's first numbering takes the events lock in the same statement.
                let first = numbering.isEmpty
                numbering.append((sent, pending))
                pending.removeAll()
                let parameters = bulk.events.map(\.parameter) + [PGParameter(bulk.eventCount)]
                try send(first ? .lockAndInsertEvents : .insertEvents, parameters)
            }
            bulk.reset()
        }
        bulk.reset()
        bulk.epoch = fence?.epoch
        // A failure while sending leaves the pipeline half-written: the connection is dropped
        // (and the batch retried on a new one).
        do throws(PGFailure) {
            try send(.begin)
            let events = Self.hasEvents(jobs)
            out.hadEvents = events
            let notify = events && notifiesNow()
            let mark = [PGParameter(writerID), PGParameter(Int64(clamping: batch))]
            var marked = false
            if let fence, fence.partitions != nil {
                // The instance, then the partitions' scopes and epochs, in partition order.
                func fencing(_ epochs: [Int: Int64]) -> [PGParameter] {
                    let parts = epochs.keys.sorted()
                    return [PGParameter(fence.instance), PGMembership.scopes(parts), PGMembership.epochs(parts.map { epochs[$0] ?? 0 })]
                }
                if !partitionEpochs.isEmpty {
                    let fencing = fencing(partitionEpochs)
                    // The common commit of a partition holder: fence, mark (and NOTIFY) in one statement.
                    if events {
                        try send(notify ? .fencePartsMarkNotify : .fencePartsMark, fencing + mark)
                        (marked, notified) = (true, notify)
                    } else {
                        try send(.fenceParts, fencing)
                    }
                } else if !anyOf.isEmpty {
                    // A commit of meta or limiters alone: any one partition held (`PGSchema.fenceAny`).
                    try send(PGSchema.fenceAny, fencing(anyOf))
                }
            } else if let fence {
                try send(.fence, [PGParameter(fence.instance), PGParameter(fence.epoch)])
            }
            // First, so that a retry of a batch still running on the server waits for it.
            if events && !marked { try send(.markCommit, mark) }
            if catchUp {
                try send(.lockEvents)
                try send(PGSchema.settleEventSeq)
            }
            position = 0
            for job in jobs {
                if case .records = job {} else { try flush() }
                switch job {
                case let .records(records, ticket):
                    out.ticket = max(out.ticket, ticket)
                    out.records += records.count
                    for r in records {
                        defer { position += 1 }
                        switch r {
                        case let .operation(s):
                            if lastOperation[s.id.raw] == position { bulk.add(s) }
                        case let .event(e):
                            if lastEvent[e.seq] == position {
                                if partitioned {
                                    // A host's event is written under any epoch this commit holds.
                                    bulk.epoch =
                                        e.key == .breaker
                                        ? (partitionEpochs.values.first ?? anyOf.values.first) : partitionEpochs[QueuePartitions.of(queue: e.queue)]
                                }
                                bulk.add(e)
                                pending.append(e)
                            }
                        case let .queue(q):
                            if lastQueue[q.name] == position { bulk.add(q) }
                        case let .queueDeleted(name):
                            try flush()
                            // Events numbered above may be deleted here: read back what stays.
                            deletes = true
                            for sql in [
                                PGSchema.deleteQueueEvents, PGSchema.deleteQueueOperations, PGSchema.deleteQueueSchedules, PGSchema.deleteQueueHistory,
                                PGSchema.deleteQueue,
                            ] {
                                try send(sql, [PGParameter(name)])
                            }
                        case let .kept(r):
                            // Kept with the partition of its change's queue (`IdempotencyRecord.queue`).
                            let part = r.queue.map { PGParameter(QueuePartitions.of(queue: $0)) } ?? .null
                            try send(.upsertIdempotency, idempotencyParameters(r) + [part])
                        case let .batchPartAdded(batch, part):
                            // Gone in the commit that adds its operations: a part is added once.
                            try send(PGSchema.forgetBatchPart, [PGParameter(batch), PGParameter(part)])
                        case let .limiter(l):
                            // Global, not partitioned: fenced with the rest of the commit.
                            if lastLimiter[l.name] == position { try send(PGSchema.upsertLimiter, PGSchema.limiterParameters(l)) }
                        case let .limiterDeleted(name):
                            if lastLimiter[name] == position { try send(PGSchema.deleteLimiter, [PGParameter(name)]) }
                        case let .host(h):
                            // Global, not partitioned: fenced with the rest of the commit.
                            if lastHost[h.host] == position { try send(PGSchema.upsertHost, PGSchema.hostParameters(h)) }
                        case let .schedule(s):
                            if lastSchedule[s.queue + "\u{0}" + s.spec.name] == position {
                                try send(PGSchema.upsertSchedule, PGSchema.scheduleParameters(s))
                            }
                        case let .scheduleDeleted(queue, name):
                            if lastSchedule[queue + "\u{0}" + name] == position {
                                try send(PGSchema.deleteSchedule, [PGParameter(queue), PGParameter(name)])
                            }
                        case let .history(row):
                            try send(
                                PGSchema.upsertHistory,
                                [
                                    PGParameter(row.queue), PGParameter(row.step), PGParameter(row.slot), PGParameter(row.bucket.start),
                                    PGParameter(HistoryText.write(row.bucket)),
                                ])
                        }
                    }
                case let .purge(cutoff, limit, reply):
                    counted.append((sent, reply))
                    try send(PGSchema.purge, [PGParameter(cutoff.nanoseconds), PGParameter(limit)])
                case let .meta(pairs, done):
                    for (key, value) in pairs {
                        if let value {
                            try send(PGSchema.upsertMeta, [PGParameter(bytea: key.utf8), PGParameter(bytea: value.utf8)])
                        } else {
                            try send(PGSchema.deleteMeta, [PGParameter(bytea: key.utf8)])
                        }
                    }
                    out.records += pairs.count
                    if let done { out.callbacks.append(done) }
                case let .deleteMetaPrefix(prefix, done):
                    try send(PGSchema.deleteMetaPrefix, [PGParameter(bytea: prefix.utf8)])
                    if let done { out.callbacks.append(done) }
                case let .purgeIdempotency(before, reply):
                    counted.append((sent, reply))
                    try send(PGSchema.deleteOldIdempotency, [PGParameter(before.nanoseconds)])
                }
            }
            try flush()
            // Every instance's feed wakes on it (delivered at commit, once the events are
            // visible): one per commit, not per event.
            if notify, !notified, let fence {
                try send(.notifyEvents, [PGParameter(fence.instance)])
                notified = true
            }
            try send(.commit)
            try conn.sync()
        } catch {
            conn.close()
            throw PGFailure(message: error.message, sqlState: error.sqlState, connectionLost: true)
        }
        let results: [PGResult]
        do throws(PGFailure) {
            results = try conn.readPipeline(count: sent)
        } catch {
            // A prepared statement is gone from the session (a pooler's server connection
            // changed): a new connection prepares them again.
            if error.sqlState == "26000" {
                conn.close()
                throw PGFailure(message: error.message, sqlState: error.sqlState, connectionLost: true)
            }
            // A statement failed: the transaction block is aborted (COMMIT was skipped) and must
            // be ended before the connection can be used again.
            if !error.connectionLost {
                do throws(PGFailure) {
                    try conn.send("ROLLBACK")
                    try conn.sync()
                    _ = try conn.readPipeline(count: 1)
                } catch {
                    conn.close()
                }
            }
            throw error
        }
        out.notified = notified
        for (index, reply) in counted where index < results.count { out.replies.append((reply, results[index].changes)) }
        if deletes { out.events = nil }
        // Each statement numbered its events newest - count + 1 ... newest, in order.
        for (index, events) in numbering {
            guard index < results.count, let newest = results[index].int64(0, 0), let top = UInt64(exactly: newest),
                top >= UInt64(events.count)
            else {
                out.events = nil
                continue
            }
            out.lastSeq = max(out.lastSeq, top)
            var seq = top - UInt64(events.count)
            for var e in events {
                seq += 1
                e.seq = seq
                out.events?.append(e)
            }
        }
        return out
    }

    private func idempotencyParameters(_ r: IdempotencyRecord) -> [PGParameter] {
        var headers: [UInt8] = [UInt8(ascii: "[")]
        for (i, (name, value)) in r.headers.enumerated() {
            if i > 0 { headers.append(UInt8(ascii: ",")) }
            headers.append(UInt8(ascii: "["))
            JSONWriter.string(name, to: &headers)
            headers.append(UInt8(ascii: ","))
            JSONWriter.string(value, to: &headers)
            headers.append(UInt8(ascii: "]"))
        }
        headers.append(contentsOf: [UInt8(ascii: "]"), 0])
        var hash = Array(r.bodyHash.utf8.filter { $0 != 0 })
        hash.append(0)
        return [
            PGParameter(bytea: r.scope.utf8), PGParameter(bytes: hash), PGParameter(r.status), PGParameter(bytes: headers),
            PGParameter(bytea: r.body), PGParameter(r.createdAt.nanoseconds),
        ]
    }

    /// Called after each commit with events, in commit order (in the writer's `aftermath`),
    /// before anyone waiting for it is told: the events with the seqs PostgreSQL gave
    /// them, or nil when they are not known (read them back). See
    /// `PostgresStore.onCommittedEvents`. Read with `value` (see `Lock.value`): once per commit.
    let committedEvents = Lock<(@Sendable ([ChangeEvent]?) -> Void)?>(nil)

    /// On the writer thread, once `out` is committed: what the writer itself needs now (the
    /// newest seq, the counters), then the rest in `aftermath`, in commit order.
    private func report(_ out: Outcome) {
        counters.counted(records: out.records, seconds: out.seconds)
        if out.lastSeq > lastSeq.load(ordering: .relaxed) { lastSeq.store(out.lastSeq, ordering: .relaxed) }
        // Events not known (read back from PostgreSQL in the aftermath): never on this thread.
        aftermath.run(writerIdle: !queue.hasJobs && out.events != nil) { [self, out] in afterCommit(out) }
    }

    private func afterCommit(_ out: Outcome) {
        if out.events?.isEmpty != true, let tell = committedEvents.value { tell(out.events) }
        queue.committed(through: out.ticket)
        for done in out.callbacks { done() }
        for (reply, n) in out.replies { reply.send(n) }
    }
}
