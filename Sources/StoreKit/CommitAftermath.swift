import Dispatch
import Synchronization

/// Where a group-commit writer runs each commit's aftermath (marking it durable, publishing its
/// events, its callbacks: answers, held starts), in commit order.
///
/// A busy writer hands the aftermath to a serial queue of its own and sends the next
/// transaction meanwhile: on the writer thread the aftermath was a quarter (SQLite) to 42 %
/// (PostgreSQL) of that thread's time at high rates, time in which nothing was written. At most
/// `room` aftermaths wait there; past that the writer waits, so a slow aftermath holds the writer
/// back instead of piling up outcomes.
///
/// A writer with nothing waiting for it runs the aftermath itself, when no earlier one is still
/// queued (so the order holds): handing it over would only wake another thread for it, and a
/// wake-up across cores is the dearest part of a small commit on a machine with few cores (on the
/// 2-core machine of CLUSTER.md, a pipe ping-pong across cores costs 47 µs, on one core 4 µs).
/// It helps little in figures: 16 clients creating on one instance on PostgreSQL did 12.8k/s
/// against 11.5k/s (means of 3 alternating runs of `opqd-bench cluster`, inside its noise).
///
/// @unchecked Sendable: `key` is set once in `init`; everything else is a queue, a semaphore or
/// atomic.
public final class CommitAftermath: @unchecked Sendable {
    private let queue: DispatchQueue
    /// This writer's own: another store's writer in the same process (a test's) is not it.
    private let key = DispatchSpecificKey<Bool>()
    private let room: DispatchSemaphore
    /// Aftermaths handed to `queue` that have not run yet.
    private let queued = Atomic<Int>(0)
    /// Whether an idle writer runs the aftermath itself (tests turn it off).
    public let runsOnIdleWriter = Atomic<Bool>(true)

    public init(label: String, room: Int = 64) {
        queue = DispatchQueue(label: label)
        self.room = DispatchSemaphore(value: max(1, room))
        queue.setSpecific(key: key, value: true)
    }

    /// True when called from an aftermath run on the queue (where waiting for the writer would
    /// deadlock; the writer thread checks for itself).
    public var isCurrent: Bool { DispatchQueue.getSpecific(key: key) == true }

    /// From the writer thread, once per commit, in commit order: runs `work` now, on this
    /// thread, when `writerIdle` and no earlier aftermath waits on the queue; else on the queue
    /// after those, waiting first while `room` of them wait.
    public func run(writerIdle: Bool, _ work: @escaping @Sendable () -> Void) {
        if writerIdle && queued.load(ordering: .acquiring) == 0 && runsOnIdleWriter.load(ordering: .relaxed) { return work() }
        room.wait()
        queued.add(1, ordering: .relaxed)
        queue.async { [self] in
            work()
            queued.subtract(1, ordering: .releasing)
            room.signal()
        }
    }

    /// Runs `work` on the queue after every aftermath handed over before it (never here).
    public func after(_ work: @escaping @Sendable () -> Void) {
        queued.add(1, ordering: .relaxed)
        queue.async { [self] in
            work()
            queued.subtract(1, ordering: .releasing)
        }
    }

    /// Returns once every aftermath handed over so far has run (the writer has stopped).
    public func drain() { queue.sync {} }
}
