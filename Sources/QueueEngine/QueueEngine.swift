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
    public init(defaultMaxConcurrentOperationCount: Int = 4, maxUnfinishedOperations: Int = 10_000_000, maxQueues: Int = 10_000,
                maxUnfinishedPerQueue: Int = 10_000_000, maxDependencies: Int = 100_000) {
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
    /// The store that makes changes durable.
    public let store: any OperationStore
    public let configuration: EngineConfiguration
    /// Immutable after init, so looked up without the lock.
    let kinds: [String: any OperationKind]
    /// Where the engine's timers (timeout, retry backoff, `notBefore`) and its kinds' run.
    public let scheduler: any EngineScheduler
    private let ticketCounter = Atomic<UInt64>(0)

    /// `kinds` maps a kind name (`delay`, `http`, ...) to what it does.
    public init(kinds: [String: any OperationKind], store: any OperationStore = InMemoryStore(),
                clock: any EngineClock = SystemClock(), scheduler: any EngineScheduler = DispatchScheduler(),
                configuration: EngineConfiguration = EngineConfiguration()) {
        var all = kinds
        all["barrier"] = ImmediateKind()
        let core = EngineCore(clock: clock, kinds: all, defaultMaxConcurrent: configuration.defaultMaxConcurrentOperationCount,
                              maxUnfinished: configuration.maxUnfinishedOperations, wantsRecords: store.wantsRecords)
        self.kinds = all
        self.scheduler = scheduler
        self.state = Lock(core)
        self.observers = ObserverHub()
        self.store = store
        self.configuration = configuration
        state.withLock { $0.engine = self }
    }

    // MARK: - the lock discipline

    /// Runs `body` under the lock, then the work it produced outside the lock.
    @inline(__always)
    func mutate<T>(_ body: (EngineCore) throws(EngineError) -> T) throws(EngineError) -> T {
        let (result, work): (Result<T, EngineError>, Work) = state.withLock { core in
            core.begin()
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
        case let .start(kind, ctx): kind.start(ctx)
        case let .cancel(kind, ctx): kind.cancel(ctx)
        case let .pause(kind, ctx): kind.pause(ctx)
        case let .call(f): f()
        case let .timeout(id, token, seconds):
            scheduler.after(seconds: seconds) { [self] in timeoutFired(id, token: token) }
        case let .retry(id, token, seconds):
            scheduler.after(seconds: seconds) { [self] in retryFired(id, token: token) }
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

    /// Hands the outbox to the store and the observers, in `seq` order, until it is empty.
    /// Only one thread drains at a time, so a slow observer delays reports, never the lock.
    private func drain(_ first: Work) {
        var batch: Work? = first
        while let b = batch {
            if !b.records.isEmpty || store.wantsRecords { store.append(b.records, upTo: b.ticket) }
            ticketCounter.store(b.ticket, ordering: .releasing)
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

    /// The newest change ticket handed to the store. Wait on it with `whenDurable`.
    public var currentTicket: UInt64 { state.withLock { $0.ticket } }

    /// Calls `done` once every change made so far is durable.
    public func whenDurable(_ done: @escaping @Sendable () -> Void) {
        let t = currentTicket
        // Records up to `t` may still sit in the outbox of a draining thread; the store
        // answers for a ticket only once it has appended and committed it.
        store.whenDurable(t, done)
    }

    // MARK: - queues

    /// Creates a queue. `maxConcurrentOperationCount` is positive or -1.
    @discardableResult
    public func createQueue(name: String, maxConcurrentOperationCount: Int = -1, isSuspended: Bool = false) throws(EngineError) -> QueueSnapshot {
        try Self.validateQueueName(name)
        try Self.validateMax(maxConcurrentOperationCount)
        return try mutate { core throws(EngineError) in
            guard core.queues[name] == nil else { throw .queueExists(name) }
            guard core.queues.count < configuration.maxQueues else { throw .limitReached("at most \(configuration.maxQueues) queues (--max-queues)", limit: "too-many-queues") }
            let q = QueueRecord(name: name, maxConcurrent: maxConcurrentOperationCount, isSuspended: isSuspended, createdAt: core.now)
            core.queues[name] = q
            core.record(q)
            core.settle()
            return q.snapshot(defaultMax: core.defaultMaxConcurrent)
        }
    }

    static func validateQueueName(_ name: String) throws(EngineError) {
        let ok = !name.isEmpty && name.utf8.count <= 64 && name.utf8.allSatisfy { c in
            (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c == 46 || c == 95 || c == 45
        }
        if !ok { throw .invalidArgument(field: "name", detail: "must match [A-Za-z0-9._-]{1,64}") }
    }

    static func validateMax(_ value: Int) throws(EngineError) {
        if value != -1 && value < 1 {
            throw .invalidArgument(field: "maxConcurrentOperationCount", detail: "must be a positive integer or -1 (the server's default); got \(value)")
        }
    }

    /// One queue's settings and counts.
    public func queue(named name: String) throws(EngineError) -> QueueSnapshot {
        try read { core throws(EngineError) in try core.queue(name).snapshot(defaultMax: core.defaultMaxConcurrent) }
    }

    /// A queue's revision (changes with its settings and its operations' states), for ETags.
    public func queueRevision(_ name: String) throws(EngineError) -> UInt64 {
        try read { core throws(EngineError) in try core.queue(name).revision }
    }

    /// Every queue, sorted by name.
    public func queues() -> [QueueSnapshot] {
        state.withLock { core in
            core.queues.values.map { $0.snapshot(defaultMax: core.defaultMaxConcurrent) }
        }.sorted { $0.name < $1.name }
    }

    /// Changes settings; takes effect at once (a resumed or widened queue starts work).
    @discardableResult
    public func updateQueue(_ name: String, maxConcurrentOperationCount: Int? = nil, isSuspended: Bool? = nil) throws(EngineError) -> QueueSnapshot {
        if let m = maxConcurrentOperationCount { try Self.validateMax(m) }
        return try mutate { core throws(EngineError) in
            let q = try core.queue(name)
            var changed = false
            if let m = maxConcurrentOperationCount, m != q.maxConcurrent { q.maxConcurrent = m; changed = true }
            if let s = isSuspended, s != q.isSuspended { q.isSuspended = s; changed = true }
            if changed {
                q.revision += 1
                core.record(q)
                core.dirty.append(q)
            }
            core.settle()
            return q.snapshot(defaultMax: core.defaultMaxConcurrent)
        }
    }

    /// `isSuspended = true`: executing operations run on, no new one starts.
    @discardableResult
    public func suspend(_ name: String) throws(EngineError) -> QueueSnapshot { try updateQueue(name, isSuspended: true) }

    /// `isSuspended = false`.
    @discardableResult
    public func resumeQueue(_ name: String) throws(EngineError) -> QueueSnapshot { try updateQueue(name, isSuspended: false) }

    /// `cancelAllOperations()`.
    @discardableResult
    public func cancelAll(_ name: String) throws(EngineError) -> QueueSnapshot {
        try mutate { core throws(EngineError) in
            let q = try core.queue(name)
            for op in q.ops where op.state != .finished { core.cancelOp(op) }
            core.settle()
            return q.snapshot(defaultMax: core.defaultMaxConcurrent)
        }
    }

    /// Deletes a queue. Refused while it has unfinished operations, unless `force`, which
    /// cancels them first (executing ones are asked to stop and finish on their own).
    public func deleteQueue(_ name: String, force: Bool = false) throws(EngineError) {
        try mutate { core throws(EngineError) in
            let q = try core.queue(name)
            if q.unfinished > 0 && !force { throw .queueNotIdle(name, unfinished: q.unfinished) }
            for op in q.ops where op.state != .finished { core.cancelOp(op) }
            q.deleted = true
            // Its operations go with it; executing ones leave the table when they finish.
            for op in q.ops where op.state == .finished { core.ops[op.id] = nil }
            core.queues[name] = nil
            core.ticket &+= 1
            if core.wantsRecords { core.outRecords.append(.queueDeleted(name)) }
            let waiters = q.idleWaiters
            q.idleWaiters = []
            let idle = q.unfinished == 0
            for (_, w) in waiters { core.effects.append(.call({ w(idle) })) }
        }
    }

    /// Calls `callback(true)` as soon as the queue has no unfinished operation (at once if it
    /// has none now). Returns a token for `cancelIdleWait`. Never blocks.
    public func onIdle(_ name: String, _ callback: @escaping @Sendable (Bool) -> Void) throws(EngineError) -> UInt64? {
        let immediate: Bool = try read { core throws(EngineError) in try core.queue(name).unfinished == 0 }
        if immediate { callback(true); return nil }
        return try mutate { core throws(EngineError) in
            let q = try core.queue(name)
            if q.unfinished == 0 {
                core.effects.append(.call({ callback(true) }))
                return nil
            }
            let id = core.nextWaiterID
            core.nextWaiterID += 1
            q.idleWaiters.append((id, callback))
            return id
        }
    }

    /// Forgets an idle waiter (its long poll timed out). Returns false when it already fired.
    @discardableResult
    public func cancelIdleWait(_ name: String, token: UInt64) -> Bool {
        state.withLock { core in
            guard let q = core.queues[name], let i = q.idleWaiters.firstIndex(where: { $0.0 == token }) else { return false }
            q.idleWaiters.remove(at: i)
            return true
        }
    }

    /// `waitUntilAllOperationsAreFinished()` without blocking a thread.
    public func waitUntilIdle(_ name: String) async throws(EngineError) {
        let token = OneShot()
        try await withCheckedContinuation { (c: CheckedContinuation<Result<Void, EngineError>, Never>) in
            do throws(EngineError) {
                _ = try onIdle(name) { _ in if token.fire() { c.resume(returning: .success(())) } }
            } catch {
                if token.fire() { c.resume(returning: .failure(error)) }
            }
        }.get()
    }

    // MARK: - operations

    /// Adds an operation (Foundation's `addOperation`).
    @discardableResult
    public func addOperation(to queueName: String, _ request: OperationRequest) throws(EngineError) -> OperationSnapshot {
        try add(to: queueName, request, barrier: false) { $0.snapshot() }
    }

    /// Adds an operation and returns only its id: the cheap form for bulk callers.
    @discardableResult
    public func addOperationID(to queueName: String, _ request: OperationRequest) throws(EngineError) -> OperationID {
        try add(to: queueName, request, barrier: false) { $0.operationID }
    }

    /// `addBarrierBlock`: starts after every operation added before it has finished, and every
    /// operation added after it waits for it.
    @discardableResult
    public func addBarrier(to queueName: String, name: String? = nil) throws(EngineError) -> OperationSnapshot {
        try add(to: queueName, OperationRequest(kind: "barrier", name: name), barrier: true) { $0.snapshot() }
    }

    private func add<T>(to queueName: String, _ request: OperationRequest, barrier: Bool, _ answer: (OpRecord) -> T) throws(EngineError) -> T {
        guard let kind = kinds[request.kind] else { throw .unknownKind(request.kind) }
        if barrier == false && request.kind == "barrier" { throw .unknownKind(request.kind) }
        try kind.validate(spec: request.spec)
        return try mutate { core throws(EngineError) in
            let q = try core.queue(queueName)
            guard core.unfinishedTotal < core.maxUnfinished else {
                throw .limitReached("at most \(core.maxUnfinished) unfinished operations in all queues (--max-unfinished)", limit: "too-many-operations")
            }
            guard q.unfinished < configuration.maxUnfinishedPerQueue else {
                throw .limitReached("at most \(configuration.maxUnfinishedPerQueue) unfinished operations in queue '\(q.name)' (--max-unfinished-per-queue)",
                                    limit: "too-many-operations")
            }
            guard request.dependencies.count <= configuration.maxDependencies else {
                throw .invalidArgument(field: "dependencies", detail: "at most \(configuration.maxDependencies) dependencies (--max-dependencies); got \(request.dependencies.count)")
            }
            if barrier && q.unfinished > configuration.maxDependencies {
                throw .limitReached("a barrier depends on every unfinished operation of its queue: '\(q.name)' has \(q.unfinished), more than the \(configuration.maxDependencies) dependencies one operation may have (--max-dependencies)",
                                    limit: "too-many-dependencies")
            }
            var deps: [OpRecord] = []
            deps.reserveCapacity(request.dependencies.count)
            for d in request.dependencies {
                guard let dep = core.ops[d.raw] else { throw .operationNotFound(d.description) }
                deps.append(dep)
            }
            var req = request
            if barrier {
                deps = q.ops.filter { $0.state != .finished }
                req.dependencies = deps.map(\.operationID)
            } else if let b = q.barrier, !deps.contains(where: { $0 === b }) {
                deps.append(b)
                req.dependencies.append(b.operationID)
            }
            let implicitBarrier = barrier ? nil : q.barrier?.id
            var unfinishedDeps: [OpRecord] = []
            var seen = Set<ObjectIdentifier>()
            for dep in deps where dep.state != .finished && seen.insert(ObjectIdentifier(dep)).inserted {
                unfinishedDeps.append(dep)
            }
            // Its first state, not a move: ready unless a dependency or `notBefore` holds it back.
            let readyNow = unfinishedDeps.isEmpty && (req.options.notBefore.map { $0 <= core.now } ?? true)
            let op = OpRecord(id: core.nextID, queue: q, request: req, kind: kind, createdAt: core.now, isBarrier: barrier,
                              state: readyNow ? .ready : .pending)
            core.nextID += 1
            op.implicitBarrier = implicitBarrier
            core.ops[op.id] = op
            q.ops.append(op)
            q.counts[op.state.index] += 1
            q.unfinished += 1
            q.revision += 1
            core.unfinishedTotal += 1
            if barrier { q.barrier = op }
            for dep in unfinishedDeps { dep.dependents.append(op) }
            op.unfinishedDependencies = unfinishedDeps.count
            if readyNow {
                q.push(op)
                core.dirty.append(q)
            }
            // Creation is reported as `isReady` changing from nothing to its first value.
            core.emit(op, .isReady, .none, .bool(readyNow))
            if !readyNow { core.makeReadyIfPossible(op) }
            core.record(op)
            core.settle()
            return answer(op)
        }
    }

    /// The operation's status.
    public func operation(_ id: OperationID) throws(EngineError) -> OperationSnapshot {
        try read { core throws(EngineError) in try core.op(id).snapshot() }
    }

    /// The operation's revision (for ETags), without building its status.
    public func revision(of id: OperationID) throws(EngineError) -> UInt64 {
        try read { core throws(EngineError) in try core.op(id).revision }
    }

    /// A page of a queue's operations, oldest first, after the cursor `after`.
    public func operations(in queueName: String, state filter: OperationState? = nil, after: OperationID? = nil,
                           limit: Int = 100) throws(EngineError) -> (operations: [OperationSnapshot], next: OperationID?) {
        try read { core throws(EngineError) in
            let q = try core.queue(queueName)
            var lo = 0, hi = q.ops.count
            if let after {
                while lo < hi {
                    let mid = (lo + hi) / 2
                    if q.ops[mid].id <= after.raw { lo = mid + 1 } else { hi = mid }
                }
            }
            var page: [OperationSnapshot] = []
            var i = lo
            while i < q.ops.count && page.count < limit {
                let op = q.ops[i]
                if filter == nil || op.state == filter { page.append(op.snapshot()) }
                i += 1
            }
            var more = false
            if page.count == limit {
                var j = i
                while j < q.ops.count { if filter == nil || q.ops[j].state == filter { more = true; break }; j += 1 }
            }
            return (page, more ? page.last?.id : nil)
        }
    }

    /// `cancel()`; with `cascade`, also every operation that transitively depends on it.
    @discardableResult
    public func cancel(_ id: OperationID, cascade: Bool = false) throws(EngineError) -> OperationSnapshot {
        try mutate { core throws(EngineError) in
            let op = try core.op(id)
            if op.state == .finished { throw .invalidTransition(from: .finished, action: .cancel) }
            let dependents = cascade ? core.transitiveDependents(of: op) : []
            core.cancelOp(op)
            for d in dependents { core.cancelOp(d) }
            core.settle()
            return op.snapshot()
        }
    }

    /// Pauses a pending, ready or executing operation. It frees its queue slot and holds back
    /// its dependents.
    @discardableResult
    public func pause(_ id: OperationID) throws(EngineError) -> OperationSnapshot {
        try mutate { core throws(EngineError) in
            let op = try core.op(id)
            try core.apply(.pause, to: op)
            core.record(op)
            core.settle()
            return op.snapshot()
        }
    }

    /// Resumes a paused operation: back to ready (or pending while dependencies are
    /// unfinished); given a slot again, its kind continues the work.
    @discardableResult
    public func resume(_ id: OperationID) throws(EngineError) -> OperationSnapshot {
        try mutate { core throws(EngineError) in
            let op = try core.op(id)
            // A `notBefore` still ahead holds back an operation that never started, as its
            // dependencies do; it goes back to pending and waits for the time to come.
            let timeHasCome = op.hasStarted || (op.options.notBefore.map { $0 <= core.now } ?? true)
            try core.apply(.resume, to: op, dependenciesMet: op.unfinishedDependencies == 0 && timeHasCome)
            if op.state == .pending { core.makeReadyIfPossible(op) }
            core.record(op)
            core.settle()
            return op.snapshot()
        }
    }

    /// Before it starts: changes its priority and/or replaces its dependencies. A dependency
    /// that would close a cycle is refused.
    @discardableResult
    public func update(_ id: OperationID, queuePriority: QueuePriority? = nil, dependencies: [OperationID]? = nil) throws(EngineError) -> OperationSnapshot {
        try mutate { core throws(EngineError) in
            let op = try core.op(id)
            if op.state == .finished || op.hasStarted || op.state == .executing {
                throw .alreadyStarted(id.description)
            }
            var newDeps: [OpRecord]? = nil
            var dependencies = dependencies
            // An operation added after a barrier keeps waiting for it, whatever else it names.
            if var list = dependencies, let b = op.implicitBarrier, let barrier = core.ops[b], barrier.state != .finished,
               !list.contains(OperationID(raw: b)) {
                list.append(OperationID(raw: b))
                dependencies = list
            }
            if let dependencies, dependencies.count > configuration.maxDependencies + 1 {
                throw .invalidArgument(field: "dependencies", detail: "at most \(configuration.maxDependencies) dependencies (--max-dependencies); got \(dependencies.count)")
            }
            if let dependencies {
                var list: [OpRecord] = []
                for d in dependencies {
                    guard let dep = core.ops[d.raw] else { throw .operationNotFound(d.description) }
                    list.append(dep)
                }
                if core.reaches(op.id, from: dependencies) {
                    throw .dependencyCycle("making \(id) depend on \(dependencies.map(\.description).joined(separator: ", ")) would close a cycle")
                }
                newDeps = list
            }
            if let p = queuePriority, p != op.priority {
                let old = op.priority
                op.priority = p
                op.revision += 1
                op.queue.revision += 1
                core.emit(op, .queuePriority, .priority(old), .priority(p))
                if op.state == .ready {
                    op.queue.push(op)  // the old heap entry goes stale
                    core.dirty.append(op.queue)
                }
            }
            if let newDeps, let dependencies {
                for depID in op.dependencyIDs {
                    if let dep = core.ops[depID.raw], let i = dep.dependents.firstIndex(where: { $0 === op }) {
                        dep.dependents.remove(at: i)
                    }
                }
                op.dependencyIDs = dependencies
                op.unfinishedDependencies = 0
                var seen = Set<ObjectIdentifier>()
                for dep in newDeps where dep.state != .finished && seen.insert(ObjectIdentifier(dep)).inserted {
                    dep.dependents.append(op)
                    op.unfinishedDependencies += 1
                }
                op.revision += 1
                if op.state == .ready && op.unfinishedDependencies > 0 {
                    core.applyChecked(.dependencyAdded, to: op)
                } else if op.state == .pending {
                    core.makeReadyIfPossible(op)
                }
            }
            core.record(op)
            core.settle()
            return op.snapshot()
        }
    }

    // MARK: - reports from kinds

    func complete(_ id: OperationID, token: UInt32, _ completion: Completion) {
        try? mutate { core throws(EngineError) in
            guard let op = core.ops[id.raw], op.runToken == token else { return }
            switch op.state {
            case .executing: core.runEnded(op, completion)
            case .paused where op.hasStarted: op.parkedCompletion = completion
            default: return
            }
        }
    }

    private func timeoutFired(_ id: OperationID, token: UInt32) {
        try? mutate { core throws(EngineError) in
            guard let op = core.ops[id.raw], op.runToken == token, op.state == .executing else { return }
            // Stop the work; its own report will carry a stale token and be ignored.
            core.effects.append(.cancel(op.kind, core.context(op, resume: false)))
            op.runToken &+= 1
            let limit = op.options.timeout ?? 0
            core.runEnded(op, .failed(type: "timeout", detail: "attempt \(op.attempt) ran longer than its timeout of \(limit) s"))
        }
    }

    private func retryFired(_ id: OperationID, token: UInt32) {
        try? mutate { core throws(EngineError) in
            guard let op = core.ops[id.raw], op.runToken == token, op.state == .executing, !op.isCancelled else { return }
            op.runStartedAt = core.now.nanoseconds
            core.beginRun(op, resume: false)
        }
    }

    func saveKindState(_ id: OperationID, token: UInt32, _ state: JSONValue?) {
        try? mutate { core throws(EngineError) in
            guard let op = core.ops[id.raw], op.runToken == token, op.state != .finished else { return }
            op.kindState = state
            core.record(op)
        }
    }

    func isCurrentRun(_ id: OperationID, token: UInt32) -> Bool {
        state.withLock { core in
            guard let op = core.ops[id.raw] else { return false }
            return op.runToken == token && op.state == .executing
        }
    }

    func reportProgress(_ id: OperationID, token: UInt32, _ progress: OperationProgress) {
        try? mutate { core throws(EngineError) in
            guard let op = core.ops[id.raw], op.runToken == token, op.state != .finished else { return }
            let old = op.progress
            guard old != progress else { return }
            op.progress = progress
            op.revision += 1
            core.emit(op, .progress, old.map { .progress($0) } ?? .none, .progress(progress))
            core.record(op)
        }
    }

    // MARK: - observers

    /// Registers an observer for every change, called with batches in `seq` order.
    public func observeAll(_ callback: @escaping @Sendable ([ChangeEvent]) -> Void) -> ObserverToken {
        observers.add(operation: nil, keys: nil, batch: callback)
    }

    /// Registers an observer for one operation (optionally some keys). It is dropped after the
    /// operation's `isFinished` change has been reported.
    public func observe(_ id: OperationID, keys: Set<ChangeKey>? = nil, _ callback: @escaping @Sendable (ChangeEvent) -> Void) -> ObserverToken {
        observers.add(operation: id, keys: keys, batch: { events in events.forEach(callback) })
    }

    /// Registers an observer for every change once it is durable: called with batches in `seq`
    /// order, only after the store has committed them (at once with a store that keeps nothing).
    /// This is what anything a client sees (feed, stream, webhooks) hangs off: a change shown
    /// can never be taken back by a crash. Register before changes are made.
    public func observeDurable(_ callback: @escaping @Sendable ([ChangeEvent]) -> Void) {
        _ = durable.add(callback)
    }

    /// Removes an observer.
    public func removeObserver(_ token: ObserverToken) { observers.remove(token) }

    /// Counts for metrics: operations by queue and state.
    public func stateCounts() -> [(queue: String, counts: [OperationState: Int])] {
        queues().map { ($0.name, $0.counts) }
    }

    /// The sequence number the next change will get.
    public var nextSequence: UInt64 { state.withLock { $0.nextSeq } }

    /// Forgets finished operations that finished before `cutoff` (at most `limit` per call),
    /// so a long-running server stays bounded. Returns how many were purged.
    @discardableResult
    public func purgeFinished(before cutoff: Timestamp, limit: Int = 10_000) -> Int {
        state.withLock { core in
            var purged = 0
            for q in Array(core.queues.values) {
                guard purged < limit else { break }
                var keep: [OpRecord] = []
                keep.reserveCapacity(q.ops.count)
                for op in q.ops {
                    if purged < limit, op.state == .finished, let f = op.finishedAt, f < cutoff {
                        core.ops[op.id] = nil
                        q.counts[OperationState.finished.index] -= 1
                        purged += 1
                    } else {
                        keep.append(op)
                    }
                }
                if keep.count != q.ops.count { q.ops = keep; q.revision += 1 }
            }
            if purged > 0 { core.ops.compact() }
            return purged
        }
    }
}

/// A one-time latch.
final class OneShot: Sendable {
    private let fired = Atomic<Bool>(false)
    func fire() -> Bool { !fired.exchange(true, ordering: .acquiringAndReleasing) }
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
