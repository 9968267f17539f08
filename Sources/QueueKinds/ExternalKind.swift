import Locking
import QueueEngine

#if canImport(Glibc)
import Glibc
#endif

/// `external` `{"lease": S}`: work done by a worker outside the server, in any language.
///
/// When the engine starts such an operation it becomes claimable in its queue. A worker
/// claims it (long poll), gets a lease token, heartbeats to extend the lease, reports
/// progress and finishes it. A lease that runs out fails the attempt with `lease-expired`;
/// the engine's retry policy then puts it up for claiming again with `attempt + 1`.
public final class ExternalKind: OperationKind {
    /// A worker's hold on one operation.
    public struct Lease: Sendable {
        public let token: String
        public var expiresAt: Timestamp
        public let worker: String
        public let since: Timestamp
        public let queue: String
        public let operation: OperationID
        let seconds: Double
        /// The operation was cancelled: the lease only tells its worker so, until it expires.
        public var cancelled = false
        /// The run this lease belongs to.
        public let context: ExecutionContext
    }

    /// A worker that vanishes is the normal failure of external work: by default a lease that
    /// runs out is offered twice more before the operation fails.
    public var defaultRetry: RetryPolicy? { RetryPolicy(maxAttempts: 3, backoff: 0, multiplier: 1) }

    /// Why a lease call was refused (the operation has no lease with that token).
    public enum LeaseError: Error, Sendable {
        case notLeased(String)
    }

    struct Waiter: Sendable {
        let id: UInt64
        let worker: String
        /// False once the waiting client has gone: it is then skipped, not handed anything.
        let isAlive: @Sendable () -> Bool
        let deliver: @Sendable (Lease) -> Void
        /// Ends a skipped long poll (answers it, so its connection is not held).
        let drop: @Sendable () -> Void
    }

    /// Started, unclaimed operations of one queue in the order they started: taken from the
    /// front in O(1) (a head index rather than `removeFirst`), and put back at the front when
    /// a claim could not be delivered.
    struct ClaimList: Sendable {
        private var items: [ExecutionContext] = []
        private var head = 0
        var isEmpty: Bool { head == items.count }
        var count: Int { items.count - head }
        mutating func append(_ c: ExecutionContext) { items.append(c) }
        mutating func popFirst() -> ExecutionContext? {
            guard head < items.count else { return nil }
            let c = items[head]
            head += 1
            if head == items.count {
                items.removeAll(keepingCapacity: true); head = 0
            } else if head >= 1024 && head * 2 >= items.count {
                items.removeFirst(head); head = 0
            }
            return c
        }
        /// Puts `c` back in front, keeping the relative order of what is put back together.
        mutating func pushFront(_ list: [ExecutionContext]) {
            guard !list.isEmpty else { return }
            if head >= list.count {
                head -= list.count
                for (i, c) in list.enumerated() { items[head + i] = c }
            } else {
                items.replaceSubrange(0..<head, with: list)
                head = 0
            }
        }
        func contains(_ id: OperationID) -> Bool { items[head...].contains { $0.operation == id } }
        mutating func remove(_ id: OperationID) {
            guard contains(id) else { return }
            items = items[head...].filter { $0.operation != id }
            head = 0
        }
    }

    struct State: Sendable {
        /// Started, unclaimed operations per queue, in the order they started.
        var claimable: [String: ClaimList] = [:]
        var leases: [OperationID: Lease] = [:]
        var waiters: [String: [Waiter]] = [:]
        var nextWaiter: UInt64 = 1
    }

    public static let defaultLease = 30.0
    private let state = Lock(State())
    private let clock: any EngineClock

    public init(clock: any EngineClock = SystemClock()) { self.clock = clock }

    public func validate(spec: JSONValue?) throws(EngineError) {
        guard let spec else { return }
        guard case let .object(members) = spec else {
            throw .invalidArgument(field: "spec", detail: "must be an object {\"lease\": seconds}; got \(spec.typeName)")
        }
        for (k, v) in members {
            guard k == "lease" else { throw .invalidArgument(field: "spec.\(k)", detail: "unknown field; kind external allows only lease") }
            guard case let .number(n) = v, n >= 1, n <= 86400 else {
                throw .invalidArgument(field: "spec.lease", detail: "must be a number of seconds from 1 to 86400; got \(v.text)")
            }
        }
    }

    /// The spec's lease, pinned to what `validate` allows (a spec read back from a store was
    /// not validated again).
    static func leaseSeconds(_ spec: JSONValue?) -> Double {
        if case let .number(n)? = spec?["lease"], n >= 1 { return min(n, 86400) }
        return defaultLease
    }

    // MARK: - driven by the engine

    public func start(_ context: ExecutionContext) {
        if context.isResume {
            // Resumed after a pause: the worker still holds it, as it is now (its saved copy in
            // `context` may be older than its last heartbeat). A finish removed it: then none.
            let held = state.withLock { s in
                s.leases[context.operation].map { !$0.cancelled && $0.context.attempt == context.attempt } ?? false
            }
            if held || takeUpSaved(context) { return }
        }
        offer(context)
    }

    /// After a restart or a handover: what this attempt saved, taken up. Its worker's end
    /// reported while it was paused applies (parked again if it still is); else its lease, while
    /// it lasts, is its worker's again. False when nothing was saved for it.
    private func takeUpSaved(_ context: ExecutionContext) -> Bool {
        if let done = Self.savedFinish(context) {
            context.finish(done)
            return true
        }
        guard let saved = Self.savedLease(context), let lease = adopt(saved, context) else { return false }
        arm([lease], save: false)
        return true
    }

    public func cancel(_ context: ExecutionContext) {
        // A claimed operation keeps its lease as a tombstone until it would have expired, so
        // the worker's next heartbeat is answered (with isCancelled) instead of refused.
        let leased = state.withLock { s -> Bool in
            guard var l = s.leases[context.operation] else { return false }
            l.cancelled = true
            s.leases[context.operation] = l
            return true
        }
        if !leased { remove(context.operation) }
        context.finish(.failed(type: "cancelled", detail: "cancelled"))
    }

    /// The worker sees `isPaused` on its next heartbeat; the lease stays.
    public func pause(_ context: ExecutionContext) {
        state.withLock { s in
            s.claimable[context.queue]?.remove(context.operation)
            if s.claimable[context.queue]?.isEmpty == true { s.claimable[context.queue] = nil }
        }
    }

    /// After a restart the lease is kept until it expires.
    public func recover(_ operation: OperationSnapshot) -> Recovery { .keep }

    /// A paused operation's lease is kept too: its worker's heartbeats see `isPaused` (not 409),
    /// and it expires as it would have (the engine parks that end until the resume).
    /// One its worker finished while paused gets that end back (parked until the resume).
    public func takeUpPaused(_ context: ExecutionContext) { _ = takeUpSaved(context) }

    // MARK: - driven by workers

    /// Hands one started, unclaimed operation of `queue` to `worker`, or registers `deliver`
    /// to be called when one comes. Returns nil and a waiter id when nothing is claimable now.
    public func claim(queue: String, worker: String, wait deliver: (@Sendable (Lease) -> Void)?) -> (Lease?, UInt64?) {
        let (leases, waiter) = claim(queue: queue, worker: worker, max: 1, isAlive: { true }, drop: {}, wait: deliver)
        return (leases.first, waiter)
    }

    /// Hands up to `max` started, unclaimed operations of `queue` to `worker`, oldest first.
    /// When none is claimable and `deliver` is given, registers it as a waiter: the next
    /// operation offered goes to the oldest waiter whose `isAlive` still holds (a long poll
    /// whose client left is skipped and ended with `drop`, so nothing is leased to nobody and
    /// its connection is not held). Returns the waiter id when one was registered. An
    /// operation whose run ended meanwhile (cancelled, timed out) is not handed out.
    public func claim(
        queue: String, worker: String, max: Int, isAlive: @escaping @Sendable () -> Bool,
        drop: @escaping @Sendable () -> Void = {}, wait deliver: (@Sendable (Lease) -> Void)?
    ) -> ([Lease], UInt64?) {
        let now = clock.now()
        let limit = Swift.max(1, max)
        let (leases, waiterID): ([Lease], UInt64?) = state.withLock { s in
            var leases: [Lease] = []
            if var list = s.claimable[queue] {
                while leases.count < limit, let ctx = list.popFirst() {
                    let lease = Self.newLease(ctx, worker: worker, now: now)
                    s.leases[ctx.operation] = lease
                    leases.append(lease)
                }
                s.claimable[queue] = list.isEmpty ? nil : list
            }
            guard leases.isEmpty, let deliver else { return (leases, nil) }
            let id = s.nextWaiter
            s.nextWaiter += 1
            s.waiters[queue, default: []].append(Waiter(id: id, worker: worker, isAlive: isAlive, deliver: deliver, drop: drop))
            return ([], id)
        }
        // A run can end between being offered and being claimed (a cancel or timeout that
        // found it unleased): such a lease is taken back, not handed out.
        var live: [Lease] = [], stale: [Lease] = []
        live.reserveCapacity(leases.count)
        for l in leases {
            if l.context.isCurrent { live.append(l) } else { stale.append(l) }
        }
        if !stale.isEmpty {
            state.withLock { s in for l in stale where s.leases[l.operation]?.token == l.token { s.leases[l.operation] = nil } }
        }
        arm(live)
        return (live, waiterID)
    }

    /// Takes back leases whose claim could not be delivered (the client left before the
    /// answer): they are offered again at once, ahead of everything else, with the same
    /// attempt. A lease that is no longer current (finished, expired, re-leased) is left alone.
    public func release(_ released: [Lease]) {
        var reoffer: [ExecutionContext] = []
        state.withLock { s in
            for l in released where s.leases[l.operation]?.token == l.token && s.leases[l.operation]?.cancelled == false {
                s.leases[l.operation] = nil
                reoffer.append(l.context)
            }
        }
        // The saved lease is cleared in any case (a paused one would otherwise be adopted
        // again on resume, held by nobody); only a run still current is offered again.
        ExecutionContext.save(reoffer.map { ($0, nil) })
        for ctx in reoffer where ctx.isCurrent {
            offer(ctx, front: true)
        }
    }

    /// Ends the claim long polls waiting on the queues `leaving` (their partition went to another
    /// instance): each is answered now (204), and its worker claims again where the queue is,
    /// instead of waiting out its `wait` here for operations that will not come.
    public func dropWaiters(where leaving: (String) -> Bool) {
        let dropped: [Waiter] = state.withLock { s in
            var out: [Waiter] = []
            for name in s.waiters.keys.filter(leaving) { out += s.waiters.removeValue(forKey: name) ?? [] }
            return out
        }
        for w in dropped { w.drop() }
    }

    /// Forgets a claim long poll (it timed out). False when it was already handed an operation.
    public func cancelClaim(queue: String, waiter: UInt64) -> Bool {
        state.withLock { s in
            guard let i = s.waiters[queue]?.firstIndex(where: { $0.id == waiter }) else { return false }
            s.waiters[queue]?.remove(at: i)
            return true
        }
    }

    /// Extends the lease. Refused for a stale or foreign token.
    public func heartbeat(_ id: OperationID, token: String) throws(LeaseError) -> Lease {
        let now = clock.now()
        let lease: Lease = try state.withLock { s throws(LeaseError) in
            guard var l = s.leases[id] else { throw .notLeased("operation \(id) is not leased (the lease expired, or it finished)") }
            guard l.token == token else { throw .notLeased("the lease of operation \(id) belongs to another claim") }
            if l.cancelled { return l }
            l.expiresAt = now.adding(seconds: l.seconds)
            s.leases[id] = l
            return l
        }
        if lease.cancelled { return lease }
        // Saved, but no new timer: the lease's one timer, when it fires, follows the moved
        // expiry (a worker heartbeating in a loop must not pile up timers).
        ExecutionContext.save([(lease.context, Self.state(of: lease))])
        return lease
    }

    /// Checks the token and returns the lease without changing it.
    public func lease(_ id: OperationID, token: String) throws(LeaseError) -> Lease {
        try state.withLock { s throws(LeaseError) in try Self.held(s, id, token).get() }
    }

    /// The lease of `id` when `token` holds it and it was not cancelled; else why not.
    private static func held(_ s: State, _ id: OperationID, _ token: String) -> Result<Lease, LeaseError> {
        guard let l = s.leases[id] else { return .failure(.notLeased("operation \(id) is not leased (the lease expired, or it finished)")) }
        guard l.token == token else { return .failure(.notLeased("the lease of operation \(id) belongs to another claim")) }
        if l.cancelled { return .failure(.notLeased("operation \(id) was cancelled")) }
        return .success(l)
    }

    /// Ends the work of many operations with their workers' answers, in one engine step:
    /// each element is checked as `finish` checks it (in order, so the same operation twice
    /// is refused the second time); the answer holds nil for each finished one, or its error.
    public func finish(_ items: [(id: OperationID, token: String, completion: Completion)]) -> [LeaseError?] {
        var errors: [LeaseError?] = []
        errors.reserveCapacity(items.count)
        let done: [(context: ExecutionContext, completion: Completion)] = state.withLock { s in
            var done: [(context: ExecutionContext, completion: Completion)] = []
            for (id, token, completion) in items {
                switch Self.held(s, id, token) {
                case let .failure(e):
                    errors.append(e)
                case let .success(l):
                    s.leases[id] = nil
                    done.append((l.context, completion))
                    errors.append(nil)
                }
            }
            return done
        }
        // A paused operation's end waits for its resume: saved with the operation in the same
        // engine step (in place of the lease), so the finish answered 200 survives a restart or
        // a handover (`start`, `takeUpPaused`).
        ExecutionContext.finish(done, savingParked: Self.finishedState)
        return errors
    }

    /// Ends the work with the worker's answer.
    public func finish(_ id: OperationID, token: String, _ completion: Completion) throws(LeaseError) {
        if let refused = finish([(id, token, completion)]).first ?? nil { throw refused }
    }

    /// Every live lease, for `GET /v1/workers`.
    public var leases: [Lease] { state.withLock { $0.leases.values.filter { !$0.cancelled } } }

    // MARK: - internals

    /// `front`: a released claim offered again; it steps aside if the operation has been
    /// leased since (by a newer run), and never clears that lease.
    private func offer(_ context: ExecutionContext, front: Bool = false) {
        let now = clock.now()
        let (handed, dropped): ((Lease, Waiter)?, [Waiter]) = state.withLock { s in
            if front {
                if s.leases[context.operation] != nil || s.claimable[context.queue]?.contains(context.operation) == true { return (nil, []) }
            } else {
                s.leases[context.operation] = nil
            }
            var dropped: [Waiter] = []
            var handed: (Lease, Waiter)? = nil
            if var ws = s.waiters.removeValue(forKey: context.queue) {
                // Waiters whose client has gone are skipped (and answered outside the lock).
                var k = 0
                while k < ws.count && handed == nil {
                    let w = ws[k]
                    k += 1
                    guard w.isAlive() else { dropped.append(w); continue }
                    let lease = Self.newLease(context, worker: w.worker, now: now)
                    s.leases[context.operation] = lease
                    handed = (lease, w)
                }
                ws.removeFirst(k)
                if !ws.isEmpty { s.waiters[context.queue] = ws }
            }
            if handed == nil {
                if front {
                    s.claimable[context.queue, default: ClaimList()].pushFront([context])
                } else {
                    s.claimable[context.queue, default: ClaimList()].append(context)
                }
            }
            return (handed, dropped)
        }
        for w in dropped { w.drop() }
        if let (lease, w) = handed {
            arm(lease)
            w.deliver(lease)
        }
    }

    private func remove(_ id: OperationID) {
        state.withLock { s in
            if let l = s.leases.removeValue(forKey: id) {
                s.claimable[l.queue]?.remove(id)
            }
            for (q, list) in s.claimable where list.contains(id) {
                var list = list
                list.remove(id)
                s.claimable[q] = list.isEmpty ? nil : list
            }
        }
    }

    static func newLease(_ ctx: ExecutionContext, worker: String, now: Timestamp) -> Lease {
        let seconds = leaseSeconds(ctx.spec)
        return Lease(
            token: randomToken(), expiresAt: now.adding(seconds: seconds), worker: worker, since: now,
            queue: ctx.queue, operation: ctx.operation, seconds: seconds, context: ctx)
    }

    /// Saves the lease with the operation and arms its expiry.
    private func arm(_ lease: Lease) { arm([lease]) }

    /// Saves the leases in one engine step (unless `save` is false: they are saved already) and
    /// arms one expiry timer per distinct expiry (a batch claimed together expires together).
    private func arm(_ leases: [Lease], save: Bool = true) {
        guard let first = leases.first else { return }
        if save { ExecutionContext.save(leases.map { ($0.context, Self.state(of: $0)) }) }
        var byExpiry: [Timestamp: [(OperationID, String)]] = [:]
        for l in leases { byExpiry[l.expiresAt, default: []].append((l.operation, l.token)) }
        for (expiresAt, group) in byExpiry {
            let delay = Double(expiresAt.nanoseconds.saturatingSubtract(clock.now().nanoseconds)) / 1e9 + 0.005
            first.context.scheduler.after(seconds: delay) { [self] in
                for (id, token) in group { expire(id, token: token) }
            }
        }
    }

    /// A lease as saved with its operation, with the attempt it belongs to (an attempt that
    /// ended does not clear it: the next one's start must not take it up).
    static func state(of lease: Lease) -> JSONValue {
        .object([
            ("token", .string(lease.token)), ("expiresAt", .number(Double(lease.expiresAt.nanoseconds))),
            ("worker", .string(lease.worker)), ("since", .number(Double(lease.since.nanoseconds))),
            ("attempt", .number(Double(lease.context.attempt))),
        ])
    }

    /// The end a worker reported for a paused operation, as saved with it. The worker's values
    /// (a result, an error's data) are kept as JSON text, each as deep as a request may carry
    /// and no deeper in the saved state: a store reads nothing deeper than 64 levels back, and a
    /// row it cannot read fails the whole load.
    @Sendable static func finishedState(_ completion: Completion, attempt: Int) -> JSONValue {
        var members: [(String, JSONValue)]
        switch completion {
        case let .succeeded(result): members = [("finished", .string("succeeded")), ("result", .string(result.text))]
        case let .failed(type, detail, data):
            members = [("finished", .string("failed")), ("type", .string(type)), ("detail", .string(detail))]
            if let data { members.append(("data", .string(data.text))) }
        }
        members.append(("attempt", .number(Double(attempt))))
        return .object(members)
    }

    /// Whether what was saved belongs to this attempt. A lease saved before attempts were
    /// saved with it names none, and is taken as this attempt's.
    static func sameAttempt(_ saved: JSONValue?, _ ctx: ExecutionContext) -> Bool {
        guard let a = saved?["attempt"] else { return true }
        guard case let .number(n) = a else { return false }
        return n == Double(ctx.attempt)
    }

    /// The end saved by `finish` for this paused attempt (read back from a store: any shape
    /// may come back; one that is not an end is none).
    static func savedFinish(_ ctx: ExecutionContext) -> Completion? {
        let saved = ctx.kindState
        guard case let .string(outcome)? = saved?["finished"], saved?["attempt"] != nil, sameAttempt(saved, ctx) else { return nil }
        func value(_ key: String) -> JSONValue? {
            guard case let .string(text)? = saved?[key] else { return nil }
            return try? JSONValue.parse(text)
        }
        switch outcome {
        case "succeeded":
            guard let result = value("result") else { return nil }
            return .succeeded(result)
        case "failed":
            guard case let .string(type)? = saved?["type"] else { return nil }
            let detail: String
            if case let .string(d)? = saved?["detail"] { detail = d } else { detail = "" }
            return .failed(type: type, detail: detail, data: value("data"))
        default: return nil
        }
    }

    private func expire(_ id: OperationID, token: String) {
        let now = clock.now()
        let (expired, extended): (Lease?, Lease?) = state.withLock { s in
            guard let l = s.leases[id], l.token == token else { return (nil, nil) }
            guard l.expiresAt <= now else { return (nil, l) }
            s.leases[id] = nil
            return (l, nil)
        }
        if let extended {
            // Heartbeats moved the expiry: wait for the new one.
            let delay = Double(extended.expiresAt.nanoseconds.saturatingSubtract(now.nanoseconds)) / 1e9 + 0.005
            extended.context.scheduler.after(seconds: delay) { [self] in expire(id, token: token) }
            return
        }
        guard let expired else { return }
        expired.context.finish(
            .failed(type: "lease-expired", detail: "worker \(expired.worker) did not heartbeat or finish within the \(expired.seconds) s lease"))
    }

    static func savedLease(_ ctx: ExecutionContext) -> (token: String, expiresAt: Timestamp, worker: String, since: Timestamp)? {
        guard sameAttempt(ctx.kindState, ctx) else { return nil }
        guard case let .string(token)? = ctx.kindState?["token"], case let .number(exp)? = ctx.kindState?["expiresAt"],
            case let .string(worker)? = ctx.kindState?["worker"], case let .number(since)? = ctx.kindState?["since"]
        else { return nil }
        // Read back from the store: any number may come back (NaN, 1e300, negative).
        return (token, Timestamp(nanoseconds: Int64(saturating: exp)), worker, Timestamp(nanoseconds: Int64(saturating: since)))
    }

    /// After a restart: takes back a saved lease that has not expired yet.
    private func adopt(_ saved: (token: String, expiresAt: Timestamp, worker: String, since: Timestamp), _ ctx: ExecutionContext) -> Lease? {
        guard saved.expiresAt > clock.now() else { return nil }
        let lease = Lease(
            token: saved.token, expiresAt: saved.expiresAt, worker: saved.worker, since: saved.since,
            queue: ctx.queue, operation: ctx.operation, seconds: Self.leaseSeconds(ctx.spec), context: ctx)
        state.withLock { $0.leases[ctx.operation] = lease }
        return lease
    }

    static func randomToken() -> String {
        var g = SystemRandomNumberGenerator()
        let hex = Array("0123456789abcdef".utf8)
        var out = [UInt8](repeating: 0, count: 32)
        for i in stride(from: 0, to: 32, by: 16) {
            var v = g.next()
            for j in 0..<16 { out[i + j] = hex[Int(v & 15)]; v >>= 4 }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
