import Dispatch
import Locking
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Settings of an engine.
public struct EngineConfiguration: Sendable {
    /// What `maxConcurrentOperationCount = -1` means.
    public var defaultMaxConcurrentOperationCount: Int
    /// Unfinished operations across all queues; more are refused with `limitReached`.
    public var maxUnfinishedOperations: Int
    public var maxQueues: Int
    /// Unfinished operations in one queue.
    public var maxUnfinishedPerQueue: Int
    /// Dependencies of one operation, a barrier's (every unfinished operation of its queue) included.
    public var maxDependencies: Int
    /// Start a kind only once the change that made its operation executing is durable. A
    /// cluster owner sets it: its commits are fenced by its ownership epoch, so an owner that
    /// lost its queues (paused past its lease) cannot start anything the new owner also starts.
    /// One store alone does without it: a start lost in a crash is restarted by the restart rules.
    public var startAfterCommit: Bool
    /// With `startAfterCommit`, asked right before each start: false while the cluster owner
    /// cannot be sure it still owns the queues (its lease may have run out); the operation is
    /// then not started here, and the closure has the owner give its role up (the next owner
    /// restarts it).
    public var mayStart: (@Sendable () -> Bool)?
    /// Limiters, at most (`--max-limiters`).
    public var maxLimiters: Int = 1_000
    /// Keys in use per limiter, at most (`--max-limiter-keys`).
    public var maxLimiterKeys: Int = 100_000
    /// The hosts' breakers (`--breaker-failures`, `--breaker-open`, `--breaker-max-open`, `--max-hosts`).
    public var breaker = BreakerSettings()
    /// Schedules in all queues, at most (`--max-schedules`).
    public var maxSchedules: Int = 10_000
    public init(
        defaultMaxConcurrentOperationCount: Int = 4, maxUnfinishedOperations: Int = 10_000_000, maxQueues: Int = 10_000,
        maxUnfinishedPerQueue: Int = 10_000_000, maxDependencies: Int = 100_000, startAfterCommit: Bool = false,
        mayStart: (@Sendable () -> Bool)? = nil
    ) {
        self.startAfterCommit = startAfterCommit
        self.mayStart = mayStart
        self.defaultMaxConcurrentOperationCount = defaultMaxConcurrentOperationCount
        self.maxUnfinishedOperations = maxUnfinishedOperations
        self.maxQueues = maxQueues
        self.maxUnfinishedPerQueue = maxUnfinishedPerQueue
        self.maxDependencies = maxDependencies
    }
}

/// Operation queues with `NSOperation`/`OperationQueue` semantics.
///
/// The hot API is synchronous under one lock, so it can be called from libmicrohttpd's
/// threads. Each call applies the pure transitions under the lock and then, after releasing
/// it, starts/stops kinds, hands records to the store and reports changes to observers.
public final class QueueEngine: Sendable {
    let state: Lock<EngineCore>
    let observers: ObserverHub
    let durable = DurablePublisher()
    /// Kind effects waiting for their commit (`startAfterCommit`).
    let held = Lock<(effects: [(ticket: UInt64, effect: Effect)], running: Bool, again: UInt64?)>(([], false, nil))
    /// The store that makes changes durable.
    public let store: any OperationStore
    public let configuration: EngineConfiguration
    /// Immutable after init, so looked up without the lock.
    let kinds: [String: any OperationKind]
    /// Where the engine's timers (timeout, retry backoff, `notBefore`) and its kinds' run.
    public let scheduler: any EngineScheduler
    /// Answers for operations this engine does not hold (`setRemoteOperations`).
    let remoteDirectory = Lock<(any RemoteOperations)?>(nil)
    /// Where shared limiter budgets are leased (`setLeaseClient`); nil: every budget is this engine's.
    let leaseClient = Lock<(any LimiterLeaseClient)?>(nil)
    /// Where the limiters other instances made are read (`setLimiterDirectory`); nil: only this
    /// engine makes limiters.
    let limiterDirectory = Lock<(any LimiterDirectory)?>(nil)
    /// The queues this engine may create (`onlyQueues`); nil: any.
    let queueFilter = Lock<(@Sendable (String) -> Bool)?>(nil)

    /// `kinds` maps a kind name (`delay`, `http`, ...) to what it does.
    public init(
        kinds: [String: any OperationKind], store: any OperationStore = InMemoryStore(),
        clock: any EngineClock = SystemClock(), scheduler: any EngineScheduler = DispatchScheduler(),
        configuration: EngineConfiguration = EngineConfiguration()
    ) {
        var all = kinds
        all["barrier"] = ImmediateKind()
        let core = EngineCore(
            clock: clock, kinds: all, defaultMaxConcurrent: configuration.defaultMaxConcurrentOperationCount,
            maxUnfinished: configuration.maxUnfinishedOperations, wantsRecords: store.wantsRecords)
        self.kinds = all
        self.scheduler = scheduler
        self.state = Lock(core)
        self.observers = ObserverHub()
        self.store = store
        self.configuration = configuration
        state.withLock {
            $0.engine = self
            $0.breaker = configuration.breaker
        }
    }

    // MARK: - the lock discipline

    /// Runs `body` under the lock, then the work it produced outside the lock.
    @inline(__always)
    func mutate<T>(_ body: (EngineCore) throws(EngineError) -> T) throws(EngineError) -> T {
        // No thread-local lookup (and no reference counting) unless some thread is in `withSlot`.
        let arm = SlotArm.armed.load(ordering: .relaxed) == 0 ? nil : SlotArm.currentPointer
        let (result, work): (Result<T, EngineError>, Work) = state.withLock { core in
            core.begin()
            if let arm { SlotArm.open(arm, in: core) }
            do throws(EngineError) {
                let r = try body(core)
                return (.success(r), core.finish())
            } catch {
                return (.failure(error), core.finish())
            }
        }
        if !work.isEmpty { perform(work) }
        return try result.get()
    }

    func read<T>(_ body: (EngineCore) throws(EngineError) -> T) throws(EngineError) -> T {
        try state.withLock { core throws(EngineError) in try body(core) }
    }

    /// Effects run on a per-thread trampoline: a kind that finishes inside `start` makes the
    /// engine start the next operation, and that must loop, not recurse.
    func perform(_ work: Work) {
        if work.drains { drain(work) }
        guard !work.effects.isEmpty else { return }
        if let runner = EffectRunner.current {
            runner.pending.append(contentsOf: work.effects)
            return
        }
        let runner = EffectRunner()
        EffectRunner.current = runner
        defer { EffectRunner.current = nil }
        runner.pending = work.effects
        var i = 0
        while i < runner.pending.count {
            run(runner.pending[i])
            i += 1
            if i >= 4096 {
                runner.pending.removeFirst(i)
                i = 0
            }
        }
    }

    private func run(_ effect: Effect) {
        switch effect {
        case .start, .cancel, .pause:
            if configuration.startAfterCommit { hold(effect) } else { runKind(effect) }
        case let .takeUp(kind, ctx):
            // Right after the restore or adoption that made it (not `mayStart`: nothing is
            // started outside, and the commits that follow are fenced).
            if !configuration.startAfterCommit || ctx.isCurrent { kind.start(ctx) }
        case let .takeUpPaused(kind, ctx): kind.takeUpPaused(ctx)
        case let .call(f): f()
        case let .watchRemote(ids): remote?.watch(ids)
        case let .timeout(id, token, seconds):
            scheduler.after(seconds: seconds) { [self] in timeoutFired(id, token: token) }
        case let .retry(id, token, seconds):
            scheduler.after(seconds: seconds) { [self] in retryFired(id, token: token) }
        case let .flowWake(wake, seconds):
            // 50 µs late, so the token is whole when it is read (one early re-arms itself); any
            // more is lost from the rate when the burst is small.
            scheduler.after(seconds: seconds + 0.00005) { [self] in
                try? mutate { core throws(EngineError) in core.flowWakeFired(wake) }
            }
        case let .wake(id, seconds):
            // A millisecond late: Dispatch's clock is not the wall clock `notBefore` is read
            // on, and a wake-up that comes early only arms another one.
            scheduler.after(seconds: seconds + 0.001) { [self] in
                try? mutate { core throws(EngineError) in
                    guard let op = core.ops[id.raw], op.waitingForTime else { return }
                    op.waitingForTime = false
                    core.makeReadyIfPossible(op)
                }
            }
        }
    }

    private func runKind(_ effect: Effect) {
        switch effect {
        case let .start(kind, ctx):
            guard configuration.startAfterCommit else { return kind.start(ctx) }
            if ctx.isCurrent && configuration.mayStart?() != false { kind.start(ctx) }
        case let .cancel(kind, ctx): kind.cancel(ctx)
        case let .pause(kind, ctx): kind.pause(ctx)
        default: run(effect)
        }
    }

    // MARK: - kinds after the commit (`startAfterCommit`)

    /// Holds a kind's effect (start, cancel, pause) until the change that made it is durable,
    /// then runs it with the others in the order they were made: a start, a pause and a resume
    /// made before one commit run as start, pause, resume after it (not as two starts).
    private func hold(_ effect: Effect) {
        // The records of this change were appended before its effects run (`perform`).
        let ticket = currentTicket
        held.withLock { $0.effects.append((ticket, effect)) }
        store.whenDurable(ticket) { [self] in releaseHeld(upTo: ticket) }
    }

    /// Runs the held effects whose change is durable, oldest first, one thread at a time (a
    /// call while another runs makes that one look again).
    private func releaseHeld(upTo ticket: UInt64) {
        var upTo = ticket
        let first = held.withLock { h -> Bool in
            if h.running {
                h.again = max(h.again ?? 0, ticket)
                return false
            }
            h.running = true
            return true
        }
        guard first else { return }
        while true {
            let ready: [Effect] = held.withLock { h in
                // From the front only: a later ticket ahead in the list (two threads raced to
                // hold) keeps those behind it for its own commit, a moment later.
                var k = 0
                while k < h.effects.count && h.effects[k].ticket <= upTo { k += 1 }
                let out = h.effects[0..<k].map(\.effect)
                h.effects.removeFirst(k)
                return out
            }
            for e in ready { runKind(e) }
            let more = held.withLock { h -> Bool in
                if let again = h.again {
                    upTo = max(upTo, again)
                    h.again = nil
                    return true
                }
                h.running = false
                return false
            }
            if !more { return }
        }
    }

    /// Hands the outbox to the store and the observers, in `seq` order, until it is empty.
    /// Only one thread drains at a time, so a slow observer delays reports, never the lock.
    private func drain(_ first: Work) {
        var batch: Work? = first
        while let b = batch {
            if !b.records.isEmpty || store.wantsRecords { store.append(b.records, upTo: b.ticket) }
            if !b.events.isEmpty {
                if durable.hasObservers {
                    durable.enqueue(ticket: b.ticket, b.events)
                    let (durable, ticket) = (self.durable, b.ticket)
                    store.whenDurable(ticket) { durable.release(upTo: ticket) }
                }
                observers.deliver(b.events)
            }
            batch = state.withLock { $0.takeOutbox() }
        }
    }

    /// Runs `body` holding a slot in the record stream from its first change on: the records of
    /// changes made from there (by anyone) wait in the engine until `fill` closes the slot, so a
    /// record made from the answer (an `Idempotency-Key`'s kept answer, `IdempotencyRecord`)
    /// goes to the store in the same `append`, and so the same commit, as the change. Records
    /// from before the slot go on as usual, and nothing waits while `body` only reads (a read
    /// of another instance's operation, for instance). The slot is nil when `body` changed
    /// nothing; when `body` throws, the slot is closed empty. Fill it soon: until then nothing
    /// made after it is written or reported to observers.
    public func withSlot<R>(_ body: () throws -> R) rethrows -> (result: R, slot: RecordSlot?) {
        let arm = SlotArm()
        let outer = SlotArm.current
        SlotArm.current = arm
        SlotArm.armed.add(1, ordering: .relaxed)
        defer {
            SlotArm.armed.subtract(1, ordering: .relaxed)
            SlotArm.current = outer
        }
        do {
            let r = try body()
            return (r, arm.slot.map(RecordSlot.init))
        } catch {
            if let id = arm.slot { fill(RecordSlot(id: id), with: nil) }
            throw error
        }
    }

    /// Closes `slot`, placing `record` (if any) right after the changes made while it was open;
    /// `whenDurable` called after this answers once that record is durable too.
    public func fill(_ slot: RecordSlot, with record: StoreRecord?) {
        let work = state.withLock { $0.fillSlot(slot.id, with: record) }
        if !work.isEmpty { perform(work) }
    }

    /// Hands `record` to the store behind every change made so far, with a ticket of its own
    /// (`whenDurable` called after this answers once it is durable).
    public func keep(_ record: StoreRecord) {
        let work = state.withLock { core in core.fillSlot(core.openSlot(), with: record) }
        if !work.isEmpty { perform(work) }
    }

    /// The newest change ticket handed to the store. Wait on it with `whenDurable`.
    public var currentTicket: UInt64 { state.withLock { $0.ticket } }

    /// Calls `done` once every change made so far is durable.
    public func whenDurable(_ done: @escaping @Sendable () -> Void) {
        let t = currentTicket
        // Records up to `t` may still sit in the outbox of a draining thread; the store
        // answers for a ticket only once it has appended and committed it.
        store.whenDurable(t, done)
    }
}

/// A place in the engine's record stream held open by `QueueEngine.withSlot`.
public struct RecordSlot: Sendable {
    let id: UInt64
}

/// This thread's `withSlot`: the slot its first change opened.
final class SlotArm {
    var slot: UInt64?

    /// Threads inside `withSlot` now: while 0, a change looks up no thread-local at all.
    static let armed = Atomic<Int>(0)

    /// This thread's arm, as set by `withSlot`, without retaining it.
    static var currentPointer: UnsafeMutableRawPointer? { pthread_getspecific(key) }

    /// Opens the arm's slot at the first change of its thread's `withSlot` (under the lock).
    static func open(_ pointer: UnsafeMutableRawPointer, in core: EngineCore) {
        let arm = Unmanaged<SlotArm>.fromOpaque(pointer).takeUnretainedValue()
        if arm.slot == nil { arm.slot = core.openSlot() }
    }

    private static let key: pthread_key_t = {
        var k = pthread_key_t()
        pthread_key_create(&k, nil)
        return k
    }()

    /// Unretained: `withSlot` keeps it alive while it is set.
    static var current: SlotArm? {
        get {
            guard let p = pthread_getspecific(key) else { return nil }
            return Unmanaged<SlotArm>.fromOpaque(p).takeUnretainedValue()
        }
        set {
            pthread_setspecific(key, newValue.map { Unmanaged.passUnretained($0).toOpaque() })
        }
    }
}

/// Per-thread queue of effects, so effects triggered by effects loop instead of recursing.
final class EffectRunner {
    var pending: [Effect] = []

    private static let key: pthread_key_t = {
        var k = pthread_key_t()
        pthread_key_create(&k, nil)
        return k
    }()

    static var current: EffectRunner? {
        get {
            guard let p = pthread_getspecific(key) else { return nil }
            return Unmanaged<EffectRunner>.fromOpaque(p).takeUnretainedValue()
        }
        set {
            if let newValue {
                pthread_setspecific(key, Unmanaged.passUnretained(newValue).toOpaque())
            } else {
                pthread_setspecific(key, nil)
            }
        }
    }
}
