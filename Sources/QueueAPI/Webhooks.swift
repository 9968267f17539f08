import Dispatch
import Locking
import Logging
import MicroHTTP
import QueueEngine
import StoreKit
import Synchronization

/// Webhook observers: `POST /v1/operations/{id}/observers` (the changes of one operation) and
/// `POST /v1/queues/{name}/observers` (of every operation of the queue, present and future).
/// Each matching change is POSTed to the observer's URL as the event JSON by its `Delivery`: in
/// `seq` order, at least once, retried with backoff.
///
/// Registrations are durable (the store's `meta` table, answered only once committed) and
/// bounded per operation, per queue and in all; so is each delivery's cursor (written about
/// once a second and at a clean stop), so a restart sends what was not acknowledged. An
/// operation's observers go when it is purged, a queue's when the queue is deleted.
package final class Webhooks: Sendable {
    struct Hook: Sendable {
        let id: String
        let scope: ObserverScope
        let url: String
        let keys: Set<ChangeKey>?
        let createdAt: Timestamp

        var queue: String { scope.queue }
        var operation: OperationID? {
            if case let .operation(id, _) = scope { return id }
            return nil
        }

        func matches(_ e: ChangeEvent) -> Bool {
            switch scope {
            case let .operation(id, _): if e.operation != id { return false }
            case let .queue(q): if e.queue != q { return false }
            }
            return keys?.contains(e.key) ?? true
        }
    }
    package struct Limits: Sendable {
        var perOperation: Int
        var perQueue: Int
        var total: Int
        package init(perOperation: Int, perQueue: Int, total: Int) {
            self.perOperation = perOperation; self.perQueue = perQueue; self.total = total
        }
    }
    struct State: Sendable {
        var hooks: [String: Hook] = [:]
        var byOperation: [UInt64: [String]] = [:]
        /// Queue-wide observers by queue.
        var byQueue: [String: [String]] = [:]
        /// Observers (of both scopes) counted against each queue's limit.
        var perQueue: [String: Int] = [:]
        var deliveries: [String: Delivery] = [:]
        /// Registrations not committed yet, with who waits for them.
        var uncommitted: [String: [@Sendable () -> Void]] = [:]
        /// Moves on every registration and removal: the listings' ETag.
        var revision: UInt64 = 0
        /// Counters of observers that were removed, so `/metrics` counters never go back.
        var retired = WebhookMetrics()
    }
    private let logger: Logger
    private let transport: any WebhookTransport
    private let scheduler: any EngineScheduler
    private let secret: [UInt8]?
    private let store: any DurableStore
    private let policy: DeliveryPolicy
    /// The newest durable seq (the feed's): where a new observer starts.
    private let newestSeq: @Sendable () -> UInt64
    let limits: Limits
    private let state = Lock(State())
    /// The newest seq whose batch has been pushed to every observer it matched: an observer that
    /// is live with nothing owed has acknowledged every match up to it.
    private let pushedThrough: Atomic<UInt64>
    static let metaPrefix = "observer:"
    static let cursorPrefix = "observer-cursor:"
    /// In a partitioned cluster, the queues whose observers this instance runs (those it
    /// serves): others' are loaded by their owner, and their cursors are its to write.
    private let serves: (@Sendable (String) -> Bool)?

    package init(
        logger: Logger, transport: any WebhookTransport, scheduler: any EngineScheduler, secret: String? = nil, store: any DurableStore,
        limits: Limits, policy: DeliveryPolicy = DeliveryPolicy(), newestSeq: @escaping @Sendable () -> UInt64,
        serves: (@Sendable (String) -> Bool)? = nil
    ) {
        self.serves = serves
        self.logger = logger; self.transport = transport; self.scheduler = scheduler; self.store = store; self.limits = limits
        self.policy = policy; self.newestSeq = newestSeq
        pushedThrough = Atomic(newestSeq())
        self.secret = secret.map { Array($0.utf8) }
        let cursors = load()
        // Cursors whose observer is gone (a cursor written while its removal was committed).
        // (Not in a partitioned cluster: the observers of queues held elsewhere are not loaded.)
        if serves == nil {
            let orphans = state.withLock { s in cursors.keys.filter { s.hooks[$0] == nil } }
            if !orphans.isEmpty { store.setMeta(orphans.map { (Self.cursorPrefix + $0, nil) }, then: nil) }
        }
    }

    /// Adds the stored observers not known here, each from its stored cursor; answers the
    /// stored cursors. At start; and in a partitioned cluster when queues were adopted (their
    /// observers may have been registered on their previous owner since this one started).
    @discardableResult
    package func load() -> [String: UInt64] {
        var cursors: [String: UInt64] = [:]
        for (key, value) in store.meta(prefix: Self.cursorPrefix) {
            cursors[String(key.dropFirst(Self.cursorPrefix.count))] = UInt64(value) ?? 0
        }
        let newest = newestSeq()
        for (key, value) in store.meta(prefix: Self.metaPrefix) {
            let id = String(key.dropFirst(Self.metaPrefix.count))
            if state.withLock({ $0.hooks[id] != nil }) { continue }
            guard let hook = Self.decode(id: id, value) else {
                logger.warning("skipping a stored webhook observer that does not decode", metadata: ["key": "\(key)"])
                continue
            }
            if let serves, !serves(hook.hook.queue) { continue }
            // An observer stored without a cursor (an older version) starts at its creation.
            let cursor = min(cursors[id] ?? (hook.startSeq ?? newest), newest)
            state.withLock { s in add(hook.hook, cursor: cursor, to: &s) }
        }
        return cursors
    }

    private func add(_ hook: Hook, cursor: UInt64, to s: inout State) {
        s.hooks[hook.id] = hook
        switch hook.scope {
        case let .operation(op, _): s.byOperation[op.raw, default: []].append(hook.id)
        case let .queue(q): s.byQueue[q, default: []].append(hook.id)
        }
        s.perQueue[hook.queue, default: 0] += 1
        s.revision += 1
        let (store, scope, keys) = (self.store, hook.scope, hook.keys)
        s.deliveries[hook.id] = Delivery(
            id: hook.id, scope: hook.scope, target: hook.url, cursor: cursor, newestSeq: newestSeq, transport: transport, logger: logger,
            scheduler: scheduler, secret: secret, policy: policy, keepsHistory: store.isDurable,
            history: { after, through, limit in
                let window: EventWindow?
                switch scope {
                case let .operation(op, _): window = store.eventWindow(queue: nil, operation: op, after: after, through: through, limit: limit)
                case let .queue(q): window = store.eventWindow(queue: q, operation: nil, after: after, through: through, limit: limit)
                }
                guard let window else { return nil }
                // A full read stops at its last row; the rest of the window comes next time.
                let scanned = window.rows >= limit ? window.lastSeq : through
                return (window.events.filter { keys?.contains($0.key) ?? true }, scanned)
            })
    }

    package var count: Int { state.withLock { $0.hooks.count } }

    /// Starts the deliveries that have something owed from before a restart.
    package func start() {
        let all = state.withLock { Array($0.deliveries.values) }
        for d in all { d.pump() }
    }

    /// Registers an observer (see `whenCommitted` for when it is durable); it is sent the
    /// changes committed after this call. Throws a 429 problem when a limit is reached (nothing
    /// changes then).
    func register(_ scope: ObserverScope, url: String, keys: Set<ChangeKey>?) throws(Problem) -> Hook {
        let id = "wh-" + String(UInt64.random(in: 1...UInt64.max), radix: 16)
        let hook = Hook(id: id, scope: scope, url: url, keys: keys, createdAt: SystemClock().now())
        let start: UInt64 = try state.withLock { (s: inout State) throws(Problem) in
            if case let .operation(operation, _) = scope {
                let onOperation = s.byOperation[operation.raw]?.count ?? 0
                if onOperation >= limits.perOperation {
                    throw Self.tooMany(
                        "operation \(operation) has \(onOperation) observers; the limit is \(limits.perOperation) (--max-observers-per-operation)")
                }
            }
            let onQueue = s.perQueue[scope.queue] ?? 0
            if onQueue >= limits.perQueue {
                throw Self.tooMany("queue '\(scope.queue)' has \(onQueue) observers; the limit is \(limits.perQueue) (--max-observers-per-queue)")
            }
            if s.hooks.count >= limits.total {
                throw Self.tooMany("the server has \(s.hooks.count) observers; the limit is \(limits.total) (--max-observers)")
            }
            // Read under the lock `deliver` takes: a batch is either in the feed already (and
            // so before `start`) or is pushed to the new delivery.
            let start = newestSeq()
            add(hook, cursor: start, to: &s)
            s.uncommitted[id] = []
            return start
        }
        let committed: @Sendable () -> Void = { [self] in
            let waiters = state.withLock { $0.uncommitted.removeValue(forKey: id) } ?? []
            for w in waiters { w() }
        }
        let writes: [(key: String, value: String?)] = [(Self.metaPrefix + id, Self.encode(hook, start: start)), (Self.cursorPrefix + id, "\(start)")]
        if !store.setMeta(writes, then: committed) {
            // The store is closing: never answer 201 for a registration that was not kept.
            remove(id)
            throw Problem.shuttingDown
        }
        return hook
    }

    /// Calls `done` once the registration `id` is committed (at once if it is, or if it was
    /// removed meanwhile).
    func whenCommitted(_ id: String, _ done: @escaping @Sendable () -> Void) {
        let now: Bool = state.withLock { s in
            guard s.uncommitted[id] != nil else { return true }
            s.uncommitted[id]?.append(done)
            return false
        }
        if now { done() }
    }

    static func tooMany(_ detail: String) -> Problem {
        Problem(429, "too-many-observers", "Too Many Requests", detail, headers: [("Retry-After", "60")])
    }

    /// The observer `id` if it has this scope.
    func hook(_ id: String, in scope: ObserverScopeQuery) -> Hook? {
        state.withLock { s in
            guard let h = s.hooks[id] else { return nil }
            switch (scope, h.scope) {
            case let (.operation(want), .operation(have, _)): return want == have ? h : nil
            case let (.queue(want), .queue(have)): return want == have ? h : nil
            default: return nil
            }
        }
    }

    /// The observers of one scope, by id, and the revision of the whole registry (for ETags).
    func hooks(in scope: ObserverScopeQuery) -> (hooks: [Hook], revision: UInt64) {
        state.withLock { s in
            let ids: [String]
            switch scope {
            case let .operation(op): ids = s.byOperation[op.raw] ?? []
            case let .queue(q): ids = s.byQueue[q] ?? []
            }
            return (ids.compactMap { s.hooks[$0] }.sorted { $0.id < $1.id }, s.revision)
        }
    }

    func delivery(_ id: String) -> Delivery.Snapshot? {
        state.withLock { $0.deliveries[id] }?.snapshot(pushedThrough: pushedThrough.load(ordering: .acquiring))
    }

    /// Removes an observer; `durable` runs once the removal is committed.
    func remove(_ id: String, durable: (@Sendable () -> Void)? = nil) {
        remove([id], durable: durable)
    }

    /// Removes observers in one commit; `durable` runs once it is committed. The deletion is
    /// written even for ids already gone: a repeated DELETE is answered only once the first
    /// one's deletion is committed (the writer is first in, first out).
    func remove(_ ids: [String], durable: (@Sendable () -> Void)? = nil) {
        var waiting: [@Sendable () -> Void] = []
        var stopped: [Delivery] = []
        state.withLock { s in
            for id in ids {
                guard let h = s.hooks.removeValue(forKey: id) else { continue }
                // Whoever waits for the registration's commit is answered with the removal's.
                waiting += s.uncommitted.removeValue(forKey: id) ?? []
                if let d = s.deliveries.removeValue(forKey: id) { stopped.append(d) }
                Self.unindex(id, h, in: &s)
            }
        }
        // Outside the registry's lock: stopping cancels a POST in flight.
        var retired = WebhookMetrics()
        for d in stopped {
            let snap = d.stop()
            retired.delivered += snap.delivered; retired.failed += snap.failures; retired.dropped += snap.dropped
        }
        if !stopped.isEmpty {
            state.withLock { s in
                s.retired.delivered += retired.delivered; s.retired.failed += retired.failed; s.retired.dropped += retired.dropped
            }
        }
        let done: @Sendable () -> Void = { [waiting] in
            for w in waiting { w() }
            durable?()
        }
        // A store that is closing never calls `done`: the answers then become shutdown's 503.
        store.setMeta(ids.flatMap { [(Self.metaPrefix + $0, nil), (Self.cursorPrefix + $0, nil)] }, then: done)
    }

    /// Takes a removed observer out of the indexes and counts.
    private static func unindex(_ id: String, _ h: Hook, in s: inout State) {
        switch h.scope {
        case let .operation(op, _):
            if var list = s.byOperation[op.raw] {
                list.removeAll { $0 == id }
                s.byOperation[op.raw] = list.isEmpty ? nil : list
            }
        case let .queue(q):
            if var list = s.byQueue[q] {
                list.removeAll { $0 == id }
                s.byQueue[q] = list.isEmpty ? nil : list
            }
        }
        if let n = s.perQueue[h.queue] { s.perQueue[h.queue] = n > 1 ? n - 1 : nil }
        s.revision += 1
    }

    /// Committed changes, in `seq` order: each observer gets the ones it matches.
    package func deliver(_ events: [ChangeEvent]) {
        guard let last = events.last?.seq else { return }
        let work: [(Delivery, [ChangeEvent])] = state.withLock { s in
            if s.hooks.isEmpty { return [] }
            var matched: [String: [ChangeEvent]] = [:]
            for e in events {
                for id in s.byOperation[e.operation.raw] ?? [] where s.hooks[id]?.matches(e) ?? false { matched[id, default: []].append(e) }
                for id in s.byQueue[e.queue] ?? [] where s.hooks[id]?.matches(e) ?? false { matched[id, default: []].append(e) }
            }
            return matched.compactMap { id, list in s.deliveries[id].map { ($0, list) } }
        }
        for (d, list) in work { d.push(list, last: last) }
        // Only after the pushes: a cursor taken from it is never ahead of a buffered event.
        pushedThrough.store(last, ordering: .releasing)
    }

    /// Writes the cursors that moved (about once a second, and at a clean stop).
    package func persistCursors() {
        let all = state.withLock { Array($0.deliveries.values) }
        var writes: [(key: String, value: String?)] = []
        let through = pushedThrough.load(ordering: .acquiring)
        for d in all {
            if let c = d.cursorToPersist(pushedThrough: through) { writes.append((Self.cursorPrefix + d.id, "\(c)")) }
        }
        if !writes.isEmpty { store.setMeta(writes, then: nil) }
    }

    /// Lets go of the observers of queues this instance no longer serves (a partitioned cluster
    /// gave them up): their cursors are written, their deliveries stopped; they stay stored,
    /// for the queues' next owner to load.
    package func forget(queues leaving: (String) -> Bool) {
        persistCursors()
        let stopped: [Delivery] = state.withLock { s in
            var out: [Delivery] = []
            for (id, h) in s.hooks where leaving(h.queue) {
                s.hooks[id] = nil
                if let d = s.deliveries.removeValue(forKey: id) { out.append(d) }
                Self.unindex(id, h, in: &s)
            }
            return out
        }
        for d in stopped { _ = d.stop() }
    }

    /// Stops every delivery (server stop) after writing the cursors.
    package func stop() {
        persistCursors()
        let all = state.withLock { Array($0.deliveries.values) }
        for d in all { d.stop() }
    }

    /// Removes every observer of a deleted queue: queue-wide ones and those of its operations.
    /// Events not yet delivered to them are not sent (the queue's events leave the store with
    /// it). `durable` runs once the removal is committed.
    func removeAll(inQueue queue: String, durable: @escaping @Sendable () -> Void) {
        let ids = state.withLock { s in s.hooks.values.filter { $0.queue == queue }.map(\.id) }
        remove(ids, durable: durable)
    }

    /// Drops the observers of operations that no longer exist (purged, or their queue
    /// deleted) and of deleted queues.
    package func removeOrphans(operationExists: (OperationID) -> Bool, queueExists: (String) -> Bool) {
        let all = state.withLock { s in s.hooks.values.map { ($0.id, $0.scope) } }
        var gone: [String] = []
        for (id, scope) in all {
            switch scope {
            case let .operation(op, _): if !operationExists(op) { gone.append(id) }
            case let .queue(q): if !queueExists(q) { gone.append(id) }
            }
        }
        if !gone.isEmpty { remove(gone) }
    }

    /// Counters for `/metrics`.
    func metrics() -> WebhookMetrics {
        let (deliveries, retired) = state.withLock { s in (Array(s.deliveries.values), s.retired) }
        var m = retired
        m.observers = deliveries.count
        let through = pushedThrough.load(ordering: .acquiring)
        for d in deliveries {
            let snap = d.snapshot(pushedThrough: through)
            m.delivered += snap.delivered; m.failed += snap.failures; m.dropped += snap.dropped
            m.pending += UInt64(snap.pending)
        }
        return m
    }

    static func encode(_ h: Hook, start: UInt64) -> String {
        var members: [(String, JSONValue)] = []
        switch h.scope {
        case let .operation(op, _): members.append(("operation", .string(op.description)))
        case .queue: members.append(("scope", .string("queue")))
        }
        members += [
            ("queue", .string(h.queue)), ("url", .string(h.url)), ("createdAt", .number(Double(h.createdAt.nanoseconds))),
            ("start", .number(Double(min(start, 1 << 52)))),
        ]
        if let keys = h.keys { members.append(("keys", .array(keys.map(\.rawValue).sorted().map { .string($0) }))) }
        return JSONValue.object(members).text
    }

    static func decode(id: String, _ text: String) -> (hook: Hook, startSeq: UInt64?)? {
        guard let v = try? JSONValue.parse(text), case let .string(queue)? = v["queue"], case let .string(url)? = v["url"] else { return nil }
        let scope: ObserverScope
        if case let .string(op)? = v["operation"], let operation = OperationID(op) {
            scope = .operation(operation, queue: queue)
        } else if case .string("queue")? = v["scope"] {
            scope = .queue(queue)
        } else {
            return nil
        }
        var keys: Set<ChangeKey>? = nil
        if case let .array(items)? = v["keys"] {
            keys = Set(
                items.compactMap { item -> ChangeKey? in
                    if case let .string(s) = item { return ChangeKey(rawValue: s) } else { return nil }
                })
        }
        var created = Timestamp(nanoseconds: 0)
        if case let .number(n)? = v["createdAt"], n.isFinite, abs(n) < 9e18 { created = Timestamp(nanoseconds: Int64(n)) }
        var start: UInt64? = nil
        if case let .number(n)? = v["start"], n.isFinite, n >= 0, n < 9e18 { start = UInt64(n) }
        return (Hook(id: id, scope: scope, url: url, keys: keys, createdAt: created), start)
    }
}

/// Which observers a request names: an operation's or a queue's.
enum ObserverScopeQuery: Sendable {
    case operation(OperationID)
    case queue(String)
}
