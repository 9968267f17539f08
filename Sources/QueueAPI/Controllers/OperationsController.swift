import Locking
import MicroHTTP
import QueueEngine
import StoreKit

/// Operations: create (in a queue), list, read, change, cancel, pause, resume, copy, wait
/// until finished, bulk cancel in a queue, and one operation's committed events.
package struct OperationsController: CreateBodyParsing, Sendable {
    package let engine: QueueEngine
    let durability: Durability
    let events: EventLog
    let store: any DurableStore
    package let limits: APILimits

    package func addRoutes(to r: inout Router) {
        r.add("POST", "/v1/queues/{name}/operations", scope: .queue(param: 0)) { req, p in try durability.idempotent(req) { try create(req, p[0]) } }
        r.add("GET", "/v1/queues/{name}/operations", scope: .queue(param: 0)) { req, p in try list(req, p[0]) }
        r.add("GET", "/v1/operations/{id}", scope: .operation(param: 0, reads: .fromStore)) { req, p in try get(req, p[0]) }
        r.add("PATCH", "/v1/operations/{id}", scope: .operation(param: 0)) { req, p in try patch(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/cancel", scope: .operation(param: 0)) { req, p in
            let q = try Query(req, allowed: ["cascade"])
            let cascade = try q.bool("cascade") ?? false
            return try action(req, p[0], query: ["cascade"]) { id throws(EngineError) in
                _ = try engine.cancel(id, cascade: cascade)
                // Kinds that stop at once (external, delay) have finished by now: answer that.
                return try engine.operation(id)
            }
        }
        r.add("POST", "/v1/operations/{id}/pause", scope: .operation(param: 0)) { req, p in
            try action(req, p[0]) { id throws(EngineError) in try engine.pause(id) }
        }
        r.add("POST", "/v1/operations/{id}/resume", scope: .operation(param: 0)) { req, p in
            try action(req, p[0]) { id throws(EngineError) in try engine.resume(id) }
        }
        r.add("GET", "/v1/operations/{id}/events", scope: .operation(param: 0, reads: .fromStore)) { req, p in try history(req, p[0]) }
        r.add("GET", "/v1/operations/{id}/wait", scope: .operation(param: 0)) { req, p in try wait(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/copy", scope: .operation(param: 0, into: "queue")) { req, p in
            try durability.idempotent(req) { try copy(req, p[0]) }
        }
        // A literal segment: `operations:cancel` is not `operations`, so the create above
        // still matches `POST /v1/queues/{name}/operations` alone.
        r.add("POST", "/v1/queues/{name}/operations:cancel", scope: .queue(param: 0)) { req, p in try bulkCancel(req, p[0]) }
        // The same kind of literal segment: `/v1/operations:batch` is not `/v1/operations/{id}`.
        r.add("POST", "/v1/operations:batch", scope: .queuesInBody(list: "operations", member: "queue", what: "the batch's queues")) { req, _ in
            try durability.idempotent(req) { try batch(req) }
        }
    }

    /// The longest `wait` a client may ask for, as the queue's wait.
    package static let maxWaitSeconds = 3600.0
    /// Operations one listing request looks at when it filters (`state`, `kind`, `namePrefix`):
    /// a filter that rarely matches ends the page early with a `next` instead of scanning the
    /// whole queue under the engine's lock.
    static let listScanLimit = 10_000

    func create(_ req: HTTPRequest, _ queue: String) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(
            req, allowed: ["kind", "name", "queuePriority", "dependencies", "spec", "timeout", "retry", "notBefore", "limits", "fairnessKey", "admission"])
        var request = try parseRequest(b)
        request.dependencies = try parseDependencies(b["dependencies"], limit: limits.dependencies) ?? []
        guard request.admission != nil else {
            let op = try engine.addOperation(to: queue, request)
            return json(201, op.json, [("Location", "/v1/operations/\(op.id)"), ("ETag", ETag.operation(op))])
        }
        // API.md "Admission": 201 for a new operation, 200 with the one that absorbed the create
        // or stands for it; `Location` names it either way.
        let made = try engine.admitOperation(to: queue, request)
        let op = made.operation
        var o = JSONOut(capacity: 768)
        op.write(to: &o, admission: made.outcome)
        return json(made.outcome == .created ? 201 : 200, o.bytes, [("Location", "/v1/operations/\(op.id)"), ("ETag", ETag.operation(op))])
    }

    func list(_ req: HTTPRequest, _ queue: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["state", "kind", "namePrefix", "limit", "after"])
        var filter = OperationFilter()
        if let s = q.values["state"] {
            guard let st = OperationState(rawValue: s) else {
                throw Problem.invalid("state", "must be one of \(OperationState.allCases.map(\.rawValue).joined(separator: ", ")); got '\(s)'")
            }
            filter.state = st
        }
        filter.kind = try parseKindFilter(q.values["kind"].map { .string($0) })
        filter.namePrefix = try parseNamePrefix(q.values["namePrefix"].map { .string($0) })
        let limit = try q.int("limit", in: 1...1000) ?? 100
        var after: OperationID? = nil
        if let a = q.values["after"] {
            guard let id = OperationID(a) else { throw Problem.invalid("after", "must be a cursor from a previous page's next; got '\(a)'") }
            after = id
        }
        let page = try engine.operations(in: queue, matching: filter, after: after, limit: limit, scanLimit: Self.listScanLimit)
        // From the page's revisions (every change to an operation moves its revision) and where
        // it ends, before anything is encoded; the request's own parameters are mixed in.
        let parameters = "\(queue)|\(filter.state?.rawValue ?? "")|\(filter.kind ?? "")|\(filter.namePrefix ?? "")|\(after?.raw ?? 0)|\(limit)"
        let etag = ETag.list(
            [(parameters, UInt64(page.next?.raw ?? 0), UInt64(0))]
                + page.operations.map {
                    ($0.id.description, UInt64(bitPattern: $0.createdAt.nanoseconds), $0.revision ^ ($0.waitingOn.map(ETag.waitingHash) ?? 0))
                })
        if ETag.matches(req, etag) { return ETag.notModified(etag) }
        var o = JSONOut(capacity: min(512 * page.operations.count + 64, limits.pageBytes))
        o.open(); o.key("operations"); o.openArray()
        // The byte budget (--max-page-bytes): an operation's result may be large, so a page
        // ends early and `next` carries on from the last operation it holds.
        var next = page.next
        let budget = pageBudget(limits)
        for (i, op) in page.operations.enumerated() {
            let before = o.bytes.count
            op.write(to: &o)
            if o.bytes.count > budget && i > 0 {
                o.truncate(to: before)
                next = page.operations[i - 1].id
                break
            }
        }
        o.closeArray()
        o.key("next")
        if let n = next { o.string(n.description) } else { o.null() }
        o.close()
        return .response(json(200, o.bytes, [("ETag", etag)]))
    }

    /// Status and history come from the engine here; a cluster follower answers the same two
    /// routes with the same code from PostgreSQL (`FollowerReads`).
    var reads: EngineOperationReads { EngineOperationReads(engine: engine, store: store, events: events) }

    func get(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult { try Self.status(req, idText, from: reads) }

    /// `GET /v1/operations/{id}`: the status with its `ETag`, or 304 for a matching `If-None-Match`.
    package static func status(_ req: HTTPRequest, _ idText: String, from reads: some OperationReads) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        // The status is read even for a conditional GET: an unfinished operation's tag names
        // what holds it back, which moves without its revision. Only the encoding is saved.
        let op = try reads.operation(id)
        let etag = ETag.operation(op)
        if ETag.matches(req, etag) { return ETag.notModified(etag) }
        return .response(json(200, op.json, [("ETag", etag)]))
    }

    func patch(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["queuePriority", "dependencies"])
        let priority = try parsePriority(b["queuePriority"])
        let deps = try parseDependencies(b["dependencies"], limit: limits.dependencies)
        let op = try engine.update(id, queuePriority: priority, dependencies: deps)
        return durability.ack(json(200, op.json, [("ETag", ETag.operation(op))]))
    }

    func action(_ req: HTTPRequest, _ idText: String, query: [String] = [], _ action: (OperationID) throws(EngineError) -> OperationSnapshot) throws
        -> HTTPHandlerResult
    {
        _ = try Query(req, allowed: query)
        let id = try parseOperationID(idText)
        try requireNoBody(req)
        let op = try action(id)
        return durability.ack(json(200, op.json, [("ETag", ETag.operation(op))]))
    }

    func history(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        try Self.history(req, idText, from: reads, limits: limits)
    }

    /// `GET /v1/operations/{id}/events`: the operation's committed events, oldest first, a page
    /// at a time (`after`, `limit`, the byte budget; `next` carries on).
    package static func history(_ req: HTTPRequest, _ idText: String, from reads: some OperationReads, limits: APILimits) throws
        -> HTTPHandlerResult
    {
        let q = try Query(req, allowed: ["after", "limit"])
        let id = try parseOperationID(idText)
        let after = UInt64(try q.int("after", in: 0...Int.max) ?? 0)
        let limit = try q.int("limit", in: 1...10_000) ?? 1000
        let list = try reads.history(of: id, after: after, limit: limit + 1)
        let budget = pageBudget(limits)
        var o = JSONOut(capacity: 4096)
        o.open(); o.key("events"); o.openArray()
        var last: UInt64? = nil
        var more = list.count > limit
        for (i, e) in list.prefix(limit).enumerated() {
            if i > 0 && o.bytes.count + e.json.count > budget { more = true; break }
            o.raw(e.json)
            last = e.seq
        }
        o.closeArray()
        o.key("next")
        if more, let last { o.int(last) } else { o.null() }
        o.close()
        return .response(json(200, o.bytes))
    }
}

/// Where an operation's status and history are read from: the engine on an owner (or a single
/// opqd), PostgreSQL on a cluster follower (`FollowerReads`). One route code for both, so both
/// validate and answer alike.
package protocol OperationReads: Sendable {
    /// Throws `EngineError.operationNotFound` for an operation that does not exist.
    func revision(of id: OperationID) throws -> UInt64
    func operation(_ id: OperationID) throws -> OperationSnapshot
    /// Committed events with seq > `after`, oldest first, at most `limit`, encoded; throws
    /// `EngineError.operationNotFound` for an operation that does not exist.
    func history(of id: OperationID, after: UInt64, limit: Int) throws -> [(seq: UInt64, json: [UInt8])]
}

/// The engine's operations, and their committed events from the store.
struct EngineOperationReads: OperationReads {
    let engine: QueueEngine
    let store: any DurableStore
    let events: EventLog

    func revision(of id: OperationID) throws -> UInt64 { try engine.revision(of: id) }
    func operation(_ id: OperationID) throws -> OperationSnapshot { try engine.operation(id) }
    func history(of id: OperationID, after: UInt64, limit: Int) throws -> [(seq: UInt64, json: [UInt8])] {
        _ = try engine.revision(of: id)
        // Committed events only, like the feed: from the store (which keeps every event of the
        // operation until retention), else (a store that keeps none) from the in-memory ring.
        if let kept = store.history(of: id, after: after, limit: limit) { return kept.map { ($0.seq, $0.json) } }
        // A durable store that could not be read: the ring may lack the older events.
        if store.isDurable { throw StoreReadUnavailable(detail: store.unavailable ?? "the read failed") }
        return Array(events.events(of: id).lazy.filter { $0.seq > after }.prefix(limit))
    }
}

extension OperationsController {
    /// `waitUntilFinished()` as a long poll: the status once the operation is finished, or at
    /// the timeout (200 either way; `isFinished` says which). The connection is suspended, not
    /// a thread; the waiter is an observer of the operation, removed when it fires or at the
    /// deadline, whichever comes first, so a client that goes away costs at most its timeout.
    /// The status is shown only once it is durable, like every change a client sees.
    func wait(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["timeout"])
        let id = try parseOperationID(idText)
        let timeout = try q.seconds("timeout", max: Self.maxWaitSeconds) ?? LongPoll.defaultWaitSeconds
        let first = try engine.operation(id)
        // Shown once durable (`ack` waits for every change made so far, this finish included).
        if first.state == .finished || timeout == 0 { return durability.ack(Self.status(first)) }
        // Only the request's id is kept (never the request, its headers or a body): a wait and its
        // timer may live up to an hour.
        let (engine, durable, requestID) = (self.engine, store.isDurable, req.id)
        return .deferred { responder in
            // The finish and the deadline may both come: the first takes the answer out of the box,
            // so the timer that outlives it holds an empty box, not the responder.
            let pending = Lock<(@Sendable () -> Void)?>(nil)
            @Sendable func fire() {
                pending.withLock { f in
                    defer { f = nil }; return f
                }?()
            }
            pending.withLock {
                $0 = {
                    // Read before waiting for the commit: what is sent is then durable.
                    let response: HTTPResponse
                    do { response = Self.status(try engine.operation(id)) } catch { response = Self.problem(error, id, engine, requestID) }
                    if durable { engine.whenDurable { responder.respond(response) } } else { responder.respond(response) }
                }
            }
            let token: ObserverToken?
            do {
                token = try engine.onFinished(id) { fire() }
            } catch {
                // Gone between the check above and now (its queue deleted, or moved).
                pending.withLock { $0 = nil }
                responder.respond(Self.problem(error, id, engine, requestID))
                return
            }
            guard let token else { return }
            // At the timeout, or at shutdown (not 503): the status now (200, `isFinished` false).
            LongPoll.ends(responder, after: timeout, on: engine.scheduler) {
                engine.cancelFinishWait(token, of: id)
                fire()
            }
        }
    }

    /// The answer of a wait whose operation left meanwhile: `LongPoll.moved` (the cluster front
    /// asks the new holder for the rest of the wait) when its queue went to another cluster
    /// instance, else the error's problem (404 once it was deleted).
    static func problem(_ error: any Error, _ id: OperationID, _ engine: QueueEngine, _ requestID: UInt64) -> HTTPResponse {
        if case .operationNotFound? = error as? EngineError, engine.wasReleased(id) {
            return LongPoll.moved("operation \(id)'s queue moved to another instance of the cluster while this request waited; retry it")
        }
        return Problem.from(error, requestID: requestID).response
    }

    static func status(_ op: OperationSnapshot) -> HTTPResponse {
        json(200, op.json, [("ETag", ETag.operation(op))])
    }

    /// `NSCopying`: a new operation from this one (any state), with the body's fields instead
    /// of the source's; validated and acknowledged like a create (201 once durable, the
    /// `Idempotency-Key` honoured by the route).
    func copy(_ req: HTTPRequest, _ idText: String) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["queue", "queuePriority", "dependencies", "notBefore", "limits", "fairnessKey"], emptyIsObject: true)
        var overrides = CopyOverrides()
        if let v = b["queue"] {
            guard case let .string(name) = v else { throw Problem.invalid("queue", "must be a queue name string; got \(v.typeName)") }
            // A name no queue can have names no queue: 404 like any unknown queue, after the
            // other fields are checked.
            overrides.queue = name
        }
        overrides.queuePriority = try parsePriority(b["queuePriority"])
        overrides.dependencies = try parseDependencies(b["dependencies"], limit: limits.dependencies)
        if let nb = b["notBefore"] {
            switch nb {
            case .null: overrides.notBefore = .some(nil)
            default: overrides.notBefore = .some(try parseTime(nb, field: "notBefore", nullAllowed: true))
            }
        }
        if let l = b["limits"] { overrides.limits = try FlowParsing.limits(l) }
        if let f = b["fairnessKey"] {
            if case .null = f { overrides.fairnessKey = .some(nil) } else { overrides.fairnessKey = .some(try FlowParsing.fairnessKey(f)) }
        }
        let op = try engine.copyOperation(id, overrides)
        return json(201, op.json, [("Location", "/v1/operations/\(op.id)"), ("ETag", ETag.operation(op))])
    }

    /// Bulk cancel of a queue's unfinished operations that match, in one engine call (one
    /// commit): `{"cancelled": n}` once durable.
    func bulkCancel(_ req: HTTPRequest, _ queue: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["state", "kind", "namePrefix"], emptyIsObject: true)
        var filter = OperationFilter()
        if let v = b["state"] {
            let unfinished: [OperationState] = [.pending, .ready, .executing, .paused]
            guard case let .string(s) = v, let st = OperationState(rawValue: s), unfinished.contains(st) else {
                throw Problem.invalid(
                    "state", "must be an unfinished state, one of \(unfinished.map(\.rawValue).joined(separator: ", ")); got \(v.text)")
            }
            filter.state = st
        }
        filter.kind = try parseKindFilter(b["kind"])
        filter.namePrefix = try parseNamePrefix(b["namePrefix"])
        let n = try engine.cancelOperations(in: queue, matching: filter)
        var o = JSONOut()
        o.open(); o.key("cancelled"); o.int(n); o.close()
        return durability.ack(json(200, o.bytes))
    }

    /// A `kind` filter: one of the kinds a client may name, or `barrier`. An unknown one is
    /// refused rather than matching nothing, so a typo cannot pass for "none found".
    func parseKindFilter(_ v: JSONValue?) throws(Problem) -> String? {
        guard let v else { return nil }
        let allowed = engine.kindNames + ["barrier"]
        guard case let .string(s) = v, allowed.contains(s) else {
            throw Problem.invalid("kind", "must be one of \(allowed.joined(separator: ", ")); got \(v.text)")
        }
        return s
    }

    /// A `namePrefix` filter: 1 to 64 characters (Unicode scalars, as JSON Schema counts
    /// them; so at most 256 UTF-8 bytes), matched byte for byte against `name`.
    func parseNamePrefix(_ v: JSONValue?) throws(Problem) -> String? {
        guard let v else { return nil }
        guard case let .string(s) = v, !s.isEmpty, s.unicodeScalars.count <= 64 else {
            throw Problem.invalid("namePrefix", "must be a string of 1 to 64 characters (leave it out to match every name); got \(v.text)")
        }
        return s
    }
}
