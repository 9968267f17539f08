import Locking
import MicroHTTP
import PostgresStore
import QueueEngine

/// Where a request goes in a partitioned cluster (CLUSTER.md "Any instance answers any
/// request"): answered here when it concerns a queue this instance serves, or nothing
/// queue-scoped (the feed, the cluster, metrics, the page); otherwise forwarded to the
/// instance that holds the queue's partition, its answer relayed unchanged, or 503 with
/// Retry-After while nobody holds it (a takeover under way).
///
/// A request is never forwarded twice: one that was forwarded here for a queue this instance
/// does not serve (it moved in between) gets 503, and the client retries.
package struct ClusterFront: Sendable {
    let owner: PartitionOwner
    let engine: QueueEngine
    let forwarder: Forwarder
    let access: Access
    let queues: OperationQueues
    /// Statuses read from PostgreSQL (`FollowerReads`): every queue's, and those of queues and
    /// operations this instance does not hold, which keep answering while their partition moves.
    let reads: APIDispatcher
    /// For checking a request before it is split (`finishAcross`).
    let limits: APILimits

    /// nil: answer here.
    package func route(_ request: HTTPRequest) -> HTTPHandlerResult? {
        let path = request.path
        let reading = request.method == "GET" || request.method == "HEAD"
        if path == "/v1/queues" && reading { return reads.handle(request) }
        if path.hasPrefix("/v1/queues/") {
            let rest = path.dropFirst("/v1/queues/".count)
            let name = rest.prefix { $0 != "/" }
            if reading && name.count == rest.count && !owner.serves(queue: String(name)) { return reads.handle(request) }
            return to(queue: String(name), request)
        }
        if path == "/v1/queues" && request.method == "POST" {
            guard case let .string(name)? = (try? JSONValue.parse(request.body))?["name"] else { return nil }
            return to(queue: name, request)
        }
        if path.hasPrefix("/v1/operations/") {
            let rest = path.dropFirst("/v1/operations/".count)
            guard let id = OperationID(rest.prefix { $0 != "/" }) else { return nil }
            var source: String?
            if let local = try? engine.operation(id) {
                source = local.queue
            } else {
                // No PostgreSQL read for a caller without the token.
                if let refused = access.refusal(request, match: .notFound) { return .routed(Router.unmatched, .response(refused.response)) }
                switch queues.queue(of: id) {
                case let .found(queue): source = queue
                case .none: return nil
                case let .unavailable(detail): return refuse(request, StoreReadUnavailable(detail: detail).problem)
                }
            }
            guard let source else { return nil }
            if reading && !owner.serves(queue: source) && (rest.count == rest.prefix { $0 != "/" }.count || rest.hasSuffix("/events")),
                rest.split(separator: "/").count <= 2
            {
                return reads.handle(request)
            }
            // A copy into a queue another instance owns is made there: the copy's owner reads
            // the source's committed row (`RemoteOperations.operation`).
            if request.method == "POST" && rest.hasSuffix("/copy"), case let .string(target)? = (try? JSONValue.parse(request.body))?["queue"],
                target != source, QueuePartitions.of(queue: target) != QueuePartitions.of(queue: source),
                owner.holder(ofQueue: target)?.instance != owner.holder(ofQueue: source)?.instance
            {
                return to(queue: target, request)
            }
            return to(queue: source, request)
        }
        if path == "/v1/operations:batch" && request.method == "POST" {
            guard case let .array(elements)? = (try? JSONValue.parse(request.body))?["operations"] else { return nil }
            var names = Set<String>()
            for e in elements { if case let .string(q)? = e["queue"] { names.insert(q) } }
            return together(names, request, what: "the batch's queues")
        }
        if path == "/v1/operations:finish" && request.method == "POST" {
            if let refused = access.refusal(request, match: .notFound) { return .routed(Router.unmatched, .response(refused.response)) }
            guard case let .array(elements)? = (try? JSONValue.parse(request.body))?["finishes"] else { return nil }
            // A malformed request (too many elements, a bad one) is refused here, whole, as
            // anywhere, before anything is read or sent: nothing changes (`finishAcross`).
            guard (try? WorkersController.parseFinishes(request, limits: limits)) != nil else { return nil }
            var queueOf: [Int: String] = [:]
            var missing: [(index: Int, id: OperationID)] = []
            for (i, e) in elements.enumerated() {
                guard case let .string(text)? = e["id"], let id = OperationID(text) else { continue }
                if let local = try? engine.operation(id) { queueOf[i] = local.queue } else { missing.append((i, id)) }
            }
            // The others' queues in one read (ids of nothing are answered 404 by whoever answers).
            switch queues.queues(of: missing.map(\.id)) {
            case let .found(found): for m in missing { if let q = found[m.id] { queueOf[m.index] = q } }
            case let .unavailable(detail): return refuse(request, StoreReadUnavailable(detail: detail).problem)
            }
            return finishes(request, elements: elements, queueOf: queueOf)
        }
        return nil
    }

    /// A finish request: here when this instance serves every queue named, to the holder when
    /// one other instance holds them all, split among the holders otherwise (`finishAcross`).
    private func finishes(_ request: HTTPRequest, elements: [JSONValue], queueOf: [Int: String]) -> HTTPHandlerResult? {
        let names = Set(queueOf.values)
        let elsewhere = names.filter { !owner.serves(queue: $0) }
        guard let first = elsewhere.min() else { return nil }
        if let moving = elsewhere.first(where: { owner.holder(ofQueue: $0) == nil }) { return to(queue: moving, request) }
        func instance(_ queue: String) -> String { owner.serves(queue: queue) ? owner.selfID : owner.holder(ofQueue: queue)?.instance ?? "" }
        let instances = Set(names.map(instance))
        // One other instance holds them all; or this request was split by another instance
        // already and a queue moved since (never forwarded twice: 503, the client retries).
        if instances.count == 1 || Forwarder.wasForwarded(request) { return to(queue: first, request) }
        // Elements of no known operation go with this instance's share (404 there), or the first.
        let fallback = instances.contains(owner.selfID) ? owner.selfID : instance(first)
        var order: [String] = []
        var shares: [String: [Int]] = [:]
        for i in elements.indices {
            let who = queueOf[i].map(instance) ?? fallback
            if shares[who] == nil { order.append(who) }
            shares[who, default: []].append(i)
        }
        var urls: [String: String] = [owner.selfID: owner.selfURL]
        for q in elsewhere { if let h = owner.holder(ofQueue: q) { urls[h.instance] = h.url } }
        var parts: [FinishPart] = []
        for who in order {
            guard let url = urls[who], !url.isEmpty else { return to(queue: first, request) }
            parts.append(FinishPart(url: url, indices: shares[who] ?? []))
        }
        return finishAcross(request, elements: elements, parts: parts)
    }

    /// Requests for several queues at once: here when this instance serves them all, to their
    /// holder when one instance holds them all; otherwise refused (an atomic change across
    /// instances would need a commit across their writers).
    private func together(_ names: Set<String>, _ request: HTTPRequest, what: String) -> HTTPHandlerResult? {
        let elsewhere = names.filter { !owner.serves(queue: $0) }
        guard !elsewhere.isEmpty else { return nil }
        // A queue nobody holds right now (moving): 503, not a refusal of the request's shape.
        if let moving = elsewhere.first(where: { owner.holder(ofQueue: $0) == nil }) { return to(queue: moving, request) }
        if elsewhere.count == names.count {
            let holders = Set(names.map { owner.holder(ofQueue: $0)?.instance ?? "" })
            if holders.count == 1, let one = names.first { return to(queue: one, request) }
        }
        return refuse(
            request,
            Problem(
                409, "spans-instances", "Queues on several instances",
                "\(what) (\(names.sorted().joined(separator: ", "))) are owned by different instances of the cluster; one request can change the queues of one instance only: split it by queue"
            ))
    }

    private func to(queue name: String, _ request: HTTPRequest) -> HTTPHandlerResult? {
        if owner.serves(queue: name) { return nil }
        // The token rules of the route's method, before a body is relayed for a caller without one.
        if let refused = access.refusal(request, match: .notFound) { return .routed(Router.unmatched, .response(refused.response)) }
        guard !Forwarder.wasForwarded(request), let holder = owner.holder(ofQueue: name), holder.instance != owner.selfID, !holder.url.isEmpty
        else {
            // A queue nobody serves: one that does not exist yet in a partition being taken
            // over, or one moving right now.
            return refuse(
                request,
                Problem.noOwner(
                    "no instance serves queue '\(name)' right now (its partition is moving); retry shortly, with an Idempotency-Key for changes"))
        }
        return .routed("forwarded", forwarder.forward(request, to: holder.url))
    }

    func refuse(_ request: HTTPRequest, _ problem: Problem) -> HTTPHandlerResult {
        if let refused = access.refusal(request, match: .notFound) { return .routed(Router.unmatched, .response(refused.response)) }
        return .routed(Router.unmatched, .response(problem.response))
    }
}

/// Which queue an operation is in, read from PostgreSQL once and kept (an operation never
/// changes queue); bounded, oldest entries dropped first.
package final class OperationQueues: Sendable {
    enum Answer: Equatable {
        case found(String)
        case none
        case unavailable(String)
    }

    enum Answers: Equatable {
        case found([OperationID: String])
        case unavailable(String)
    }

    private let read: @Sendable (OperationID) throws -> String?
    private let readMany: @Sendable ([OperationID]) throws -> [OperationID: String]
    private let cache = Locking.Lock<(map: [UInt64: String], order: [UInt64], head: Int)>(([:], [], 0))
    static let capacity = 100_000

    package init(read: @escaping @Sendable (OperationID) throws -> String?, readMany: @escaping @Sendable ([OperationID]) throws -> [OperationID: String]) {
        self.read = read
        self.readMany = readMany
    }

    func queue(of id: OperationID) -> Answer {
        if let q = cache.withLock({ $0.map[id.raw] }) { return .found(q) }
        let found: String?
        do { found = try read(id) } catch { return .unavailable("\(error)") }
        guard let found else { return .none }
        keep([id: found])
        return .found(found)
    }

    /// `queue(of:)` of many: those not kept yet in one read. Ids of nothing are left out.
    func queues(of ids: [OperationID]) -> Answers {
        var out: [OperationID: String] = [:]
        let misses: [OperationID] = cache.withLock { c in
            ids.filter { id in
                guard let q = c.map[id.raw] else { return true }
                out[id] = q
                return false
            }
        }
        guard !misses.isEmpty else { return .found(out) }
        let found: [OperationID: String]
        do { found = try readMany(misses) } catch { return .unavailable("\(error)") }
        keep(found)
        out.merge(found) { a, _ in a }
        return .found(out)
    }

    private func keep(_ found: [OperationID: String]) {
        cache.withLock { c in
            for (id, queue) in found where c.map.updateValue(queue, forKey: id.raw) == nil {
                if c.order.count < Self.capacity {
                    c.order.append(id.raw)
                } else {
                    c.map[c.order[c.head]] = nil
                    c.order[c.head] = id.raw
                    c.head = (c.head + 1) % Self.capacity
                }
            }
        }
    }
}
