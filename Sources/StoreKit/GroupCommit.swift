import Dispatch
import Locking
import QueueEngine
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What a group-commit writer (SQLite's `StoreWriter`, PostgreSQL's `PGWriter`) and its callers
/// share: the jobs submitted since the writer last looked, who waits for which ticket, and the
/// newest ticket committed. The writer thread takes every pending job at once (`take`), commits
/// them in one transaction, and reports the newest ticket they held (`committed(through:)`).
///
/// The commit itself (SQL, retries, connections) is each store's; this is the part both
/// wrote alike before.
public final class GroupCommitQueue: Sendable {
    /// Not generic: both writers take the same jobs, and a generic class used across modules
    /// runs unspecialised (a metadata lookup per call: +0.6% instructions per durable create).
    public typealias Job = WriteJob

    private struct State {
        var jobs: [Job] = []
        var waiters: [(ticket: UInt64, done: @Sendable () -> Void)] = []
        /// The highest ticket whose records are committed.
        var committed: UInt64 = 0
        /// The writer is about to wait on `wake`: the next submitter must signal it.
        var sleeping = false
        /// `stop` was called: no new work is taken.
        var stopping = false
        /// `stop` was called on the writer thread: it finishes (closes its connection) as it exits.
        var finishOnExit = false
    }

    private let state = Lock(State())
    /// Mirror of `state.committed` for the lock-free fast path of `whenDurable`.
    private let committedTicket = Atomic<UInt64>(0)
    private let wake = DispatchSemaphore(value: 0)

    public init() {}

    /// The highest ticket committed.
    public var durableTicket: UInt64 { committedTicket.load(ordering: .acquiring) }

    /// Queues `job`; false once the writer is stopping.
    @discardableResult
    public func submit(_ job: Job) -> Bool {
        let (accepted, signal): (Bool, Bool) = state.withLock { s in
            if s.stopping { return (false, false) }
            s.jobs.append(job)
            if s.sleeping { s.sleeping = false; return (true, true) }
            return (true, false)
        }
        if signal { wake.signal() }
        return accepted
    }

    /// Calls `done` once everything up to `ticket` is committed: at once (on the caller's
    /// thread) if it already is, else from `committed(through:)`.
    public func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) {
        if ticket <= committedTicket.load(ordering: .acquiring) { done(); return }
        let now: Bool = state.withLock { s in
            if ticket <= s.committed { return true }
            s.waiters.append((ticket, done))
            return false
        }
        if now { done() }
    }

    /// What the writer thread is to do next.
    public enum Next {
        /// Commit the jobs taken.
        case commit
        /// Stopping and nothing is left: exit.
        case exit
        /// Woken with nothing to do (look again).
        case again
        /// Idle for `idleSeconds`: a moment to check the connection.
        case idle
    }

    /// On the writer thread: moves every pending job into `jobs` (empty on entry), or sleeps
    /// until one is submitted, `stop` is called, or (with `idleSeconds`) that long passes.
    public func take(into jobs: inout [Job], idleSeconds: Double? = nil) -> Next {
        let exit: Bool = state.withLock { s in
            swap(&jobs, &s.jobs)
            if jobs.isEmpty {
                if s.stopping { return true }
                s.sleeping = true
            }
            return false
        }
        if !jobs.isEmpty { return .commit }
        if exit { return .exit }
        guard let idleSeconds else {
            wake.wait()
            return .again
        }
        if wake.wait(timeout: .now() + idleSeconds) == .success { return .again }
        let signalled = state.withLock { s -> Bool in
            if s.sleeping { s.sleeping = false; return false }
            return true
        }
        // A submitter saw `sleeping` and signalled just as the wait ended: take its signal.
        if signalled { wake.wait() }
        return .idle
    }

    /// Stops taking work and wakes the writer, which commits what is queued and exits.
    /// `finishOnExit`: called on the writer thread itself, which then finishes on its own.
    public func stop(finishOnExit: Bool = false) {
        let signal: Bool = state.withLock { s in
            s.stopping = true
            s.finishOnExit = finishOnExit
            if s.sleeping { s.sleeping = false; return true }
            return false
        }
        if signal { wake.signal() }
    }

    public var isStopping: Bool { state.withLock { $0.stopping } }
    public var finishesOnExit: Bool { state.withLock { $0.finishOnExit } }
    public var hasJobs: Bool { state.withLock { !$0.jobs.isEmpty } }

    /// After a commit of everything up to `ticket`: runs (outside the lock, on this thread) the
    /// waiters it satisfies.
    public func committed(through ticket: UInt64) {
        var ready: [@Sendable () -> Void] = []
        state.withLock { s in
            if ticket > s.committed {
                s.committed = ticket
                committedTicket.store(ticket, ordering: .releasing)
            }
            let c = s.committed
            guard !s.waiters.isEmpty else { return }
            var keep: [(ticket: UInt64, done: @Sendable () -> Void)] = []
            for w in s.waiters {
                if w.ticket <= c { ready.append(w.done) } else { keep.append(w) }
            }
            s.waiters = keep
        }
        // Outside the lock: a callback may append or wait again.
        for done in ready { done() }
    }
}

/// One unit of work for a store's writer thread, the same for both stores.
public enum WriteJob: Sendable {
    case records([StoreRecord], ticket: UInt64)
    case purge(cutoff: Timestamp, limit: Int, reply: CommitReply)
    case purgeIdempotency(before: Timestamp, reply: CommitReply)
    /// Sets (or, with nil, deletes) rows of the `meta` table: durable settings of the API layer
    /// such as webhook observers and crash counters.
    case meta([(key: String, value: String?)], done: (@Sendable () -> Void)?)
    /// Deletes every `meta` row whose key starts with the prefix.
    case deleteMetaPrefix(String, done: (@Sendable () -> Void)?)
}

extension GroupCommitQueue {
    /// Deletes up to `limit` operations that finished before `cutoff`, with their events, oldest
    /// first, in chunks of at most 500 operations, each part of a group commit, so creates keep
    /// flowing meanwhile. Blocks until done (never call it on the writer thread); returns how
    /// many were deleted (0 once stopping).
    public func purge(finishedBefore cutoff: Timestamp, limit: Int) -> Int {
        var total = 0
        while total < limit {
            let chunk = min(500, limit - total)
            let reply = CommitReply()
            guard submit(.purge(cutoff: cutoff, limit: chunk, reply: reply)) else { break }
            let n = reply.wait()
            total += n
            if n < chunk { break }
        }
        return total
    }

    /// Deletes kept idempotency answers saved before `cutoff`. Blocks; returns how many.
    public func purgeIdempotency(before cutoff: Timestamp) -> Int {
        let reply = CommitReply()
        guard submit(.purgeIdempotency(before: cutoff, reply: reply)) else { return 0 }
        return reply.wait()
    }
}

/// A count handed back from the writer thread to a caller blocked on it (purges).
public final class CommitReply: Sendable {
    private let value = Atomic<Int>(0)
    private let ready = DispatchSemaphore(value: 0)
    public init() {}
    public func send(_ n: Int) { value.store(n, ordering: .releasing); ready.signal() }
    public func wait() -> Int { ready.wait(); return value.load(ordering: .acquiring) }
}

/// A writer's counters, for benchmarks and `/metrics` (relaxed: nothing is ordered by them).
public final class WriterCounters: Sendable {
    /// `append` calls.
    public let appends = Atomic<Int>(0)
    /// Commits that failed and were retried.
    public let failures = Atomic<Int>(0)
    /// Nanoseconds the writer spent in transactions: wall clock (fsync waits included) and its
    /// own CPU time.
    private let busyNanos = Atomic<Int>(0)
    private let cpuNanos = Atomic<Int>(0)
    /// Per commit reported: the counts and its wall-clock seconds and records, under one lock
    /// (taken once per commit, and by `/metrics`), so a scrape never sees a commit in one and
    /// not in another.
    private let perCommit = Lock(
        (
            commits: 0, records: 0, largest: 0, seconds: StoreHistogram(bounds: StoreHistogram.secondsBounds),
            sizes: StoreHistogram(bounds: StoreHistogram.recordsBounds)
        ))

    public init() {}

    /// When a transaction starts: its clocks (`timed(since:records:)` when it committed).
    public static func clocks() -> (wall: Int, cpu: Int) { (clockNanos(CLOCK_MONOTONIC), clockNanos(CLOCK_THREAD_CPUTIME_ID)) }

    /// A transaction that started at `start` (`clocks()`) committed: its wall-clock seconds,
    /// for `counted` once it is reported.
    public func timed(since start: (wall: Int, cpu: Int)) -> Double {
        let wall = clockNanos(CLOCK_MONOTONIC) &- start.wall
        busyNanos.add(wall, ordering: .relaxed)
        cpuNanos.add(clockNanos(CLOCK_THREAD_CPUTIME_ID) &- start.cpu, ordering: .relaxed)
        return Double(wall) / 1e9
    }

    /// A commit of `n` records that took `seconds` is reported.
    public func counted(records n: Int, seconds: Double) {
        perCommit.withLock { c in
            c.commits += 1
            c.records += n
            c.largest = max(c.largest, n)
            c.seconds.observe(seconds)
            c.sizes.observe(Double(n))
        }
    }

    public var stats: StoreStats {
        let c = perCommit.value
        return StoreStats(
            commits: c.commits, records: c.records, appends: appends.load(ordering: .relaxed), largestCommit: c.largest,
            failures: failures.load(ordering: .relaxed),
            busySeconds: Double(busyNanos.load(ordering: .relaxed)) / 1e9,
            cpuSeconds: Double(cpuNanos.load(ordering: .relaxed)) / 1e9,
            commitSeconds: c.seconds, commitRecords: c.sizes)
    }
}

/// `clock_gettime` in nanoseconds.
public func clockNanos(_ clock: clockid_t) -> Int {
    var ts = timespec()
    clock_gettime(clock, &ts)
    return Int(ts.tv_sec) &* 1_000_000_000 &+ Int(ts.tv_nsec)
}
