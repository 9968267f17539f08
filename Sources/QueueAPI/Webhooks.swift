import Digest
import Dispatch
import Locking
import Logging
import MicroHTTP
import QueueEngine
import QueueStore
import Synchronization

/// Sends a webhook's POST. Failure modes are results, never traps: the implementation is the
/// outbound client that the `http` kind uses too (up to 5 redirects, as `OutboundWebhookTransport` says).
protocol WebhookTransport: Sendable {
    /// POSTs `body` to `url`; `done(true)` for a 2xx answer, `done(false)` for anything else.
    func post(url: String, body: [UInt8], headers: [(String, String)], timeout: Double, _ done: @escaping @Sendable (Bool) -> Void)
}

/// Sends one webhook's events in order, one request at a time, without blocking a thread:
/// the next POST starts from the completion of the previous one. Its backlog is bounded: a
/// receiver that hangs delays only its own observer and costs bounded memory.
final class Delivery: Sendable {
    struct State: Sendable {
        var pending: [ChangeEvent] = []
        var head = 0
        var sending = false
        var stopped = false
        var dropped = 0
    }
    /// Events one webhook may have waiting (its receiver slow or down); past it the newest are
    /// dropped and counted (`dropped`, logged): bounded memory over a lossless promise until
    /// deliveries read from the durable feed by cursor (issue 11).
    static let maxPending = 1_000
    let transport: any WebhookTransport
    let target: String
    let logger: Logger
    let id: String
    let scheduler: any EngineScheduler
    /// The `--webhook-secret` bytes; nil sends deliveries unsigned.
    let secret: [UInt8]?
    private let state = Lock(State())

    /// The headers of one delivery: the event's seq and, with a secret, the body's HMAC-SHA256
    /// (API.md: `X-Opqd-Signature: sha256=<hex HMAC of the body>`), over the exact bytes sent.
    static func headers(for event: ChangeEvent, secret: [UInt8]?) -> [(String, String)] {
        var headers = [("Content-Type", "application/json"), ("X-Opqd-Event-Seq", "\(event.seq)")]
        if let secret { headers.append(("X-Opqd-Signature", "sha256=" + SHA256.hex(SHA256.hmac(key: secret, message: event.json)))) }
        return headers
    }

    init(transport: any WebhookTransport, target: String, logger: Logger, id: String, scheduler: any EngineScheduler, secret: [UInt8]?) {
        self.transport = transport; self.target = target; self.logger = logger; self.id = id; self.scheduler = scheduler
        self.secret = secret
    }

    func enqueue(_ event: ChangeEvent) {
        let start: ChangeEvent? = state.withLock { s in
            if s.stopped { return nil }
            if s.sending {
                if s.pending.count - s.head >= Self.maxPending {
                    s.dropped += 1
                    if s.dropped == 1 || s.dropped % 1000 == 0 {
                        logger.warning("webhook backlog full: dropping events", metadata: ["webhook": "\(id)", "dropped": "\(s.dropped)"])
                    }
                    return nil
                }
                s.pending.append(event)
                return nil
            }
            s.sending = true
            return event
        }
        if let start { send(start, attempt: 1) }
    }

    func stop() {
        state.withLock {
            $0.stopped = true; $0.pending = []; $0.head = 0
        }
    }

    private func send(_ event: ChangeEvent, attempt: Int) {
        transport.post(
            url: target, body: event.json, headers: Self.headers(for: event, secret: secret),
            timeout: 5
        ) { [self] ok in
            if !ok && attempt < 3 && !state.withLock({ $0.stopped }) {
                scheduler.after(seconds: Double(attempt)) { self.send(event, attempt: attempt + 1) }
                return
            }
            if !ok {
                logger.warning("webhook delivery failed", metadata: ["webhook": "\(id)", "seq": "\(event.seq)"])
            }
            let next: ChangeEvent? = state.withLock { s in
                if s.stopped || s.head >= s.pending.count { s.sending = false; s.pending = []; s.head = 0; return nil }
                let e = s.pending[s.head]
                s.head += 1
                if s.head > 1024 { s.pending.removeFirst(s.head); s.head = 0 }
                return e
            }
            if let next { send(next, attempt: 1) }
        }
    }
}

/// `POST /v1/operations/{id}/observers`: each matching change is POSTed to a URL as the
/// event JSON, in order, one delivery at a time per webhook, with retries.
///
/// Registrations are durable (kept in the store's `meta` table, answered only once committed)
/// and bounded per operation, per queue and in all. Deliveries are fed only with committed
/// events. A registration goes when it is deleted or when its operation is purged.
final class Webhooks: Sendable {
    struct Hook: Sendable {
        let id: String
        let operation: OperationID
        let queue: String
        let url: String
        let keys: Set<ChangeKey>?
        let createdAt: Timestamp
    }
    struct Limits: Sendable {
        var perOperation: Int
        var perQueue: Int
        var total: Int
    }
    struct State: Sendable {
        var hooks: [String: Hook] = [:]
        var byOperation: [UInt64: [String]] = [:]
        var perQueue: [String: Int] = [:]
        var deliveries: [String: Delivery] = [:]
        /// Registrations not committed yet, with who waits for them.
        var uncommitted: [String: [@Sendable () -> Void]] = [:]
    }
    private let logger: Logger
    private let transport: any WebhookTransport
    private let scheduler: any EngineScheduler
    private let secret: [UInt8]?
    private let store: any ServiceStore
    let limits: Limits
    private let state = Lock(State())
    static let metaPrefix = "observer:"

    init(
        logger: Logger, transport: any WebhookTransport, scheduler: any EngineScheduler, secret: String? = nil, store: any ServiceStore,
        limits: Limits
    ) {
        self.logger = logger; self.transport = transport; self.scheduler = scheduler; self.store = store; self.limits = limits
        self.secret = secret.map { Array($0.utf8) }
        for (key, value) in store.meta(prefix: Self.metaPrefix) {
            guard let hook = Self.decode(id: String(key.dropFirst(Self.metaPrefix.count)), value) else {
                logger.warning("skipping a stored webhook observer that does not decode", metadata: ["key": "\(key)"])
                continue
            }
            state.withLock { s in add(hook, to: &s) }
        }
    }

    private func add(_ hook: Hook, to s: inout State) {
        s.hooks[hook.id] = hook
        s.byOperation[hook.operation.raw, default: []].append(hook.id)
        s.perQueue[hook.queue, default: 0] += 1
        s.deliveries[hook.id] = Delivery(transport: transport, target: hook.url, logger: logger, id: hook.id, scheduler: scheduler, secret: secret)
    }

    var count: Int { state.withLock { $0.hooks.count } }

    /// Registers a webhook (see `whenCommitted` for when it is durable). Throws a 429 problem
    /// when a limit is reached (nothing changes then).
    func register(operation: OperationID, queue: String, url: String, keys: Set<ChangeKey>?) throws(Problem) -> Hook {
        let id = "wh-" + String(UInt64.random(in: 1...UInt64.max), radix: 16)
        let hook = Hook(id: id, operation: operation, queue: queue, url: url, keys: keys, createdAt: SystemClock().now())
        try state.withLock { (s: inout State) throws(Problem) in
            let onOperation = s.byOperation[operation.raw]?.count ?? 0
            if onOperation >= limits.perOperation {
                throw Self.tooMany("operation \(operation) has \(onOperation) observers; the limit is \(limits.perOperation) (--max-observers-per-operation)")
            }
            let onQueue = s.perQueue[queue] ?? 0
            if onQueue >= limits.perQueue {
                throw Self.tooMany("queue '\(queue)' has \(onQueue) observers; the limit is \(limits.perQueue) (--max-observers-per-queue)")
            }
            if s.hooks.count >= limits.total {
                throw Self.tooMany("the server has \(s.hooks.count) observers; the limit is \(limits.total) (--max-observers)")
            }
            add(hook, to: &s)
            s.uncommitted[id] = []
        }
        let committed: @Sendable () -> Void = { [self] in
            let waiters = state.withLock { $0.uncommitted.removeValue(forKey: id) } ?? []
            for w in waiters { w() }
        }
        if !store.setMeta([(Self.metaPrefix + id, Self.encode(hook))], then: committed) {
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

    func hook(_ id: String, of operation: OperationID) -> Hook? {
        state.withLock { s in s.hooks[id].flatMap { $0.operation == operation ? $0 : nil } }
    }

    func hooks(of operation: OperationID) -> [Hook] {
        state.withLock { s in (s.byOperation[operation.raw] ?? []).compactMap { s.hooks[$0] } }.sorted { $0.id < $1.id }
    }

    /// Removes a webhook; `durable` runs once the removal is committed.
    func remove(_ id: String, durable: (@Sendable () -> Void)? = nil) {
        var waiting: [@Sendable () -> Void] = []
        let removed: Hook? = state.withLock { s in
            guard let h = s.hooks.removeValue(forKey: id) else { return nil }
            // Whoever waits for the registration's commit is answered with the removal's.
            waiting = s.uncommitted.removeValue(forKey: id) ?? []
            s.deliveries.removeValue(forKey: id)?.stop()
            if var list = s.byOperation[h.operation.raw] {
                list.removeAll { $0 == id }
                s.byOperation[h.operation.raw] = list.isEmpty ? nil : list
            }
            if let n = s.perQueue[h.queue] { s.perQueue[h.queue] = n > 1 ? n - 1 : nil }
            return h
        }
        let done: @Sendable () -> Void = { [waiting] in
            for w in waiting { w() }
            durable?()
        }
        if removed != nil {
            // A store that is closing never calls `done`: the answers then become shutdown's 503.
            store.setMeta([(Self.metaPrefix + id, nil)], then: done)
        } else {
            done()
        }
    }

    /// Committed changes, in `seq` order: each goes to the webhooks of its operation.
    func deliver(_ events: [ChangeEvent]) {
        for e in events {
            let targets: [Delivery] = state.withLock { s in
                guard let ids = s.byOperation[e.operation.raw] else { return [] }
                return ids.compactMap { id in
                    guard let h = s.hooks[id], h.keys?.contains(e.key) ?? true else { return nil }
                    return s.deliveries[id]
                }
            }
            for d in targets { d.enqueue(e) }
        }
    }

    /// Drops the webhooks of operations that no longer exist (purged, or their queue deleted).
    func removeOrphans(exists: (OperationID) -> Bool) {
        let all = state.withLock { s in s.hooks.values.map { ($0.id, $0.operation) } }
        for (id, op) in all where !exists(op) { remove(id) }
    }

    static func encode(_ h: Hook) -> String {
        var members: [(String, JSONValue)] = [
            ("operation", .string(h.operation.description)), ("queue", .string(h.queue)), ("url", .string(h.url)),
            ("createdAt", .number(Double(h.createdAt.nanoseconds))),
        ]
        if let keys = h.keys { members.append(("keys", .array(keys.map(\.rawValue).sorted().map { .string($0) }))) }
        return JSONValue.object(members).text
    }

    static func decode(id: String, _ text: String) -> Hook? {
        guard let v = try? JSONValue.parse(text), case let .string(op)? = v["operation"], let operation = OperationID(op),
            case let .string(queue)? = v["queue"], case let .string(url)? = v["url"]
        else { return nil }
        var keys: Set<ChangeKey>? = nil
        if case let .array(items)? = v["keys"] {
            keys = Set(
                items.compactMap { item -> ChangeKey? in
                    if case let .string(s) = item { return ChangeKey(rawValue: s) } else { return nil }
                })
        }
        var created = Timestamp(nanoseconds: 0)
        if case let .number(n)? = v["createdAt"], n.isFinite, abs(n) < 9e18 { created = Timestamp(nanoseconds: Int64(n)) }
        return Hook(id: id, operation: operation, queue: queue, url: url, keys: keys, createdAt: created)
    }
}

extension Webhooks {
    /// Counters for `/metrics`.
    func metrics() -> WebhookMetrics {
        WebhookMetrics(observers: count)
    }
}
