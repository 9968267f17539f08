import Dispatch
import QueueEngine
import StoreKit
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The single writer: a dedicated thread that owns the write connection and commits
/// everything submitted while the previous commit ran in ONE transaction (group commit).
///
/// A request's cost is then one fsync shared by every request that arrived during the last
/// one, instead of one fsync each: at 1-5 ms per fsync that is the difference between a few
/// hundred and tens of thousands of durable creates per second.
///
/// @unchecked Sendable: `connection`, the statements and `binder` are touched only by the
/// writer thread while it runs, and by `init` / `finish()` before it starts and after it has
/// been joined. Everything callers touch is in `queue` or atomic.
final class StoreWriter: @unchecked Sendable {
    let queue = GroupCommitQueue()
    let path: String
    /// Where a commit's aftermath runs (marking it durable, then its callbacks: answers, event
    /// publication), in commit order: on the writer thread the callbacks took a quarter of its
    /// time at high rates, time in which nothing was being written.
    private let aftermath = CommitAftermath(label: "opqd.store.completions")

    let counters = WriterCounters()
    let lastError = StoreLock<StoreError?>(nil)
    /// The newest event seq committed.
    let lastSeq: Atomic<UInt64>

    // Writer-thread state.
    private let connection: SQLiteConnection
    private let begin, commit, rollback: SQLiteStatement
    private let upsertOperation, upsertQueue, insertEvent, replaceEvent, upsertIdempotency, setLastSeq: SQLiteStatement
    private let upsertLimiter, deleteLimiter, upsertHost, deleteOldHostEvents: SQLiteStatement
    private let upsertSchedule, deleteSchedule, deleteQueueSchedules: SQLiteStatement
    private let upsertHistory, deleteQueueHistory: SQLiteStatement
    private let deleteQueueEvents, deleteQueueOperations, deleteQueue: SQLiteStatement
    private let selectPurgeable, deleteOperationEvents, deleteOperation, deleteOldIdempotency: SQLiteStatement
    private let upsertMeta, deleteMeta, deleteMetaPrefix: SQLiteStatement
    private var binder = RecordBinder()
    private var lastOperation: [UInt64: Int] = [:]
    private var lastQueue: [String: Int] = [:]
    private var lastLimiter: [String: Int] = [:]
    private var lastHost: [String: Int] = [:]
    private var lastSchedule: [String: Int] = [:]
    private var purgeIDs: [Int64] = []
    /// Set once by `start`, before the store is shared.
    private var thread: pthread_t?

    init(connection: SQLiteConnection, path: String, lastSeq: UInt64) throws(SQLiteFailure) {
        self.connection = connection
        self.path = path
        self.lastSeq = Atomic(lastSeq)
        begin = try connection.prepare("BEGIN IMMEDIATE")
        commit = try connection.prepare("COMMIT")
        rollback = try connection.prepare("ROLLBACK")
        upsertOperation = try connection.prepare(Schema.upsertOperation)
        upsertQueue = try connection.prepare(Schema.upsertQueue)
        insertEvent = try connection.prepare(Schema.insertEvent)
        replaceEvent = try connection.prepare(Schema.replaceEvent)
        upsertIdempotency = try connection.prepare(Schema.upsertIdempotency)
        setLastSeq = try connection.prepare(Schema.setLastSeq)
        upsertLimiter = try connection.prepare(Schema.upsertLimiter)
        deleteLimiter = try connection.prepare(Schema.deleteLimiter)
        upsertHost = try connection.prepare(Schema.upsertHost)
        upsertSchedule = try connection.prepare(Schema.upsertSchedule)
        deleteSchedule = try connection.prepare(Schema.deleteSchedule)
        deleteQueueSchedules = try connection.prepare(Schema.deleteQueueSchedules)
        upsertHistory = try connection.prepare(Schema.upsertHistory)
        deleteQueueHistory = try connection.prepare(Schema.deleteQueueHistory)
        deleteOldHostEvents = try connection.prepare(Schema.deleteOldHostEvents)
        deleteQueueEvents = try connection.prepare(Schema.deleteQueueEvents)
        deleteQueueOperations = try connection.prepare(Schema.deleteQueueOperations)
        deleteQueue = try connection.prepare(Schema.deleteQueue)
        selectPurgeable = try connection.prepare(Schema.selectPurgeable)
        deleteOperationEvents = try connection.prepare(Schema.deleteOperationEvents)
        deleteOperation = try connection.prepare(Schema.deleteOperation)
        deleteOldIdempotency = try connection.prepare(Schema.deleteOldIdempotency)
        upsertMeta = try connection.prepare("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)")
        deleteMeta = try connection.prepare("DELETE FROM meta WHERE key = ?1")
        // substr rather than LIKE: keys may hold `%` and `_`.
        deleteMetaPrefix = try connection.prepare("DELETE FROM meta WHERE substr(key, 1, length(?1)) = ?1")
    }

    // MARK: - callers

    /// Queues `job`; false once the store is closing.
    @discardableResult
    func submit(_ job: WriteJob) -> Bool { queue.submit(job) }

    func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) { queue.whenDurable(ticket, done) }

    /// True when called on the writer thread itself or from a commit's callbacks (where
    /// waiting for the writer would deadlock).
    var isWriterThread: Bool {
        if aftermath.isCurrent { return true }
        guard let t = thread else { return false }
        return pthread_equal(t, pthread_self()) != 0
    }

    // MARK: - the thread

    func start() {
        let context = Unmanaged.passRetained(self).toOpaque()
        var tid = pthread_t()
        // The start routine must be a C function pointer: a non-capturing closure that gets
        // the writer back from its argument (retained until the thread takes it).
        let rc = pthread_create(
            &tid, nil,
            { arg in
                let writer = Unmanaged<StoreWriter>.fromOpaque(arg!).takeRetainedValue()
                writer.run()
                return nil
            }, context)
        precondition(rc == 0, "pthread_create failed: \(rc)")
        thread = tid
    }

    /// Stops taking work, lets the thread commit what is queued, then checkpoints and closes
    /// the connection. Called on the writer thread itself (from a durability callback, or a
    /// deinit there), it cannot join itself: the thread finishes on its own as it exits.
    func stopAndFinish() {
        let onWriter = isWriterThread
        queue.stop(finishOnExit: onWriter)
        guard let t = thread else { return }
        if onWriter {
            pthread_detach(t)
        } else {
            pthread_join(t, nil)
            aftermath.drain()  // the last commits' callbacks have run
            finish()
        }
    }

    /// Folds the WAL back into the database file and closes the connection.
    private func finish() {
        _ = try? connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.close()
    }

    private func run() {
        var jobs: [WriteJob] = []
        while true {
            switch queue.take(into: &jobs) {
            case .commit:
                commitWithRetry(jobs)
                jobs.removeAll(keepingCapacity: true)
            case .exit:
                if queue.finishesOnExit { finish() }
                return
            case .again, .idle:
                continue
            }
        }
    }

    /// Commits `jobs`, retrying a failed commit (disk full, I/O error) with backoff: nothing
    /// is reported durable until it is. While closing it gives up after a few attempts, and
    /// the callbacks of what was lost never fire.
    private func commitWithRetry(_ jobs: [WriteJob]) {
        var delay: UInt32 = 10_000
        var attempt = 0
        var replacing = false
        while true {
            attempt += 1
            do throws(SQLiteFailure) {
                let start = WriterCounters.clocks()
                var outcome = try apply(jobs, replacingEvents: replacing)
                outcome.seconds = counters.timed(since: start)
                lastError.withLock { $0 = nil }
                aftermath.run(writerIdle: !queue.hasJobs) { [self, outcome] in afterCommit(outcome) }
                return
            } catch {
                if error.isConstraint && !replacing {
                    // A seq written before: only an engine that did not restore can do that.
                    // Keep the newer events rather than wedging the writer.
                    replacing = true
                    continue
                }
                counters.failures.add(1, ordering: .relaxed)
                let e = StoreError(error.isCorrupt ? .corrupt : .io, path: path, detail: error.description)
                lastError.withLock { $0 = e }
                if queue.isStopping && attempt >= 3 {
                    for case let .purge(_, _, reply) in jobs { reply.send(0) }
                    for case let .purgeIdempotency(_, reply) in jobs { reply.send(0) }
                    return
                }
                usleep(delay)
                delay = min(delay * 2, 1_000_000)
            }
        }
    }

    private struct Outcome: Sendable {
        var ticket: UInt64 = 0
        var records = 0
        var callbacks: [@Sendable () -> Void] = []
        var replies: [(CommitReply, Int)] = []
        var maxSeq: UInt64 = 0
        /// Its wall-clock seconds.
        var seconds = 0.0
    }

    /// One transaction for everything in `jobs`, in order. An operation or queue written
    /// several times is written once, at its last position: upserts replace the whole row,
    /// so that gives the same result as writing each, even around a queue's deletion. A
    /// limiter's row is its last record's too: the last upsert, or a delete after it.
    private func apply(_ jobs: [WriteJob], replacingEvents: Bool) throws(SQLiteFailure) -> Outcome {
        var out = Outcome()
        lastOperation.removeAll(keepingCapacity: true)
        lastQueue.removeAll(keepingCapacity: true)
        lastLimiter.removeAll(keepingCapacity: true)
        lastHost.removeAll(keepingCapacity: true)
        lastSchedule.removeAll(keepingCapacity: true)
        var position = 0
        for case let .records(records, _) in jobs {
            for r in records {
                switch r {
                case let .operation(s): lastOperation[s.id.raw] = position
                case let .queue(q): lastQueue[q.name] = position
                case let .limiter(l): lastLimiter[l.name] = position
                case let .limiterDeleted(name): lastLimiter[name] = position
                case let .host(h): lastHost[h.host] = position
                case let .schedule(s): lastSchedule[s.queue + "\u{0}" + s.spec.name] = position
                case let .scheduleDeleted(queue, name): lastSchedule[queue + "\u{0}" + name] = position
                case .event, .queueDeleted, .kept, .batchPartAdded, .history: break
                }
                position += 1
            }
        }
        try begin.run()
        do throws(SQLiteFailure) {
            position = 0
            for job in jobs {
                switch job {
                case let .records(records, ticket):
                    out.ticket = max(out.ticket, ticket)
                    out.records += records.count
                    for r in records {
                        defer { position += 1 }
                        switch r {
                        case let .operation(s):
                            guard lastOperation[s.id.raw] == position else { continue }
                            try binder.write(s, with: upsertOperation)
                        case let .event(e):
                            try binder.write(e, with: replacingEvents ? replaceEvent : insertEvent)
                            out.maxSeq = max(out.maxSeq, e.seq)
                        case let .queue(q):
                            guard lastQueue[q.name] == position else { continue }
                            try binder.write(q, with: upsertQueue)
                        case let .queueDeleted(name):
                            for st in [deleteQueueEvents, deleteQueueOperations, deleteQueueSchedules, deleteQueueHistory, deleteQueue] {
                                st.bind(1, text: name)
                                try st.run()
                            }
                        case let .kept(record):
                            try binder.write(record, with: upsertIdempotency)
                        case .batchPartAdded:
                            // Batches across instances are PostgreSQL's alone.
                            continue
                        case let .limiter(l):
                            guard lastLimiter[l.name] == position else { continue }
                            try binder.write(l, with: upsertLimiter)
                        case let .limiterDeleted(name):
                            guard lastLimiter[name] == position else { continue }
                            deleteLimiter.bind(1, text: name)
                            try deleteLimiter.run()
                        case let .host(h):
                            guard lastHost[h.host] == position else { continue }
                            try binder.write(h, with: upsertHost)
                        case let .schedule(s):
                            guard lastSchedule[s.queue + "\u{0}" + s.spec.name] == position else { continue }
                            try binder.write(s, with: upsertSchedule)
                        case let .scheduleDeleted(queue, name):
                            guard lastSchedule[queue + "\u{0}" + name] == position else { continue }
                            deleteSchedule.bind(1, text: queue)
                            deleteSchedule.bind(2, text: name)
                            try deleteSchedule.run()
                        case let .history(row):
                            // A bucket written twice in one commit: the later one holds more.
                            upsertHistory.bind(1, text: row.queue)
                            upsertHistory.bind(2, row.step)
                            upsertHistory.bind(3, row.slot)
                            upsertHistory.bind(4, row.bucket.start)
                            upsertHistory.bind(5, text: HistoryText.write(row.bucket))
                            try upsertHistory.run()
                        }
                    }
                case let .purge(cutoff, limit, reply):
                    out.replies.append((reply, try purge(cutoff: cutoff, limit: limit)))
                case let .meta(pairs, done):
                    for (key, value) in pairs {
                        if let value {
                            upsertMeta.bind(1, text: key)
                            upsertMeta.bind(2, text: value)
                            try upsertMeta.run()
                        } else {
                            deleteMeta.bind(1, text: key)
                            try deleteMeta.run()
                        }
                    }
                    out.records += pairs.count
                    if let done { out.callbacks.append(done) }
                case let .deleteMetaPrefix(prefix, done):
                    deleteMetaPrefix.bind(1, text: prefix)
                    try deleteMetaPrefix.run()
                    if let done { out.callbacks.append(done) }
                case let .purgeIdempotency(before, reply):
                    deleteOldIdempotency.bind(1, before.nanoseconds)
                    try deleteOldIdempotency.run()
                    out.replies.append((reply, connection.changes))
                }
            }
            // Kept apart from the events so that deleting events never moves the sequence back.
            if out.maxSeq > lastSeq.load(ordering: .relaxed) {
                setLastSeq.bind(1, out.maxSeq)
                try setLastSeq.run()
            }
            try commit.run()
        } catch {
            // A failed COMMIT (or statement) can leave the transaction open: end it.
            try? rollback.run()
            throw error
        }
        return out
    }

    private func purge(cutoff: Timestamp, limit: Int) throws(SQLiteFailure) -> Int {
        purgeIDs.removeAll(keepingCapacity: true)
        selectPurgeable.bind(1, cutoff.nanoseconds)
        selectPurgeable.bind(2, limit)
        do throws(SQLiteFailure) {
            while try selectPurgeable.step() { purgeIDs.append(selectPurgeable.int64(0)) }
        } catch {
            selectPurgeable.reset()
            throw error
        }
        selectPurgeable.reset()
        deleteOldHostEvents.bind(1, cutoff.nanoseconds)
        try deleteOldHostEvents.run()
        for id in purgeIDs {
            deleteOperationEvents.bind(1, id)
            try deleteOperationEvents.run()
            deleteOperation.bind(1, id)
            try deleteOperation.run()
        }
        return purgeIDs.count
    }

    private func afterCommit(_ out: Outcome) {
        counters.counted(records: out.records, seconds: out.seconds)
        if out.maxSeq > lastSeq.load(ordering: .relaxed) { lastSeq.store(out.maxSeq, ordering: .relaxed) }
        queue.committed(through: out.ticket)
        for done in out.callbacks { done() }
        for (reply, n) in out.replies { reply.send(n) }
    }
}
