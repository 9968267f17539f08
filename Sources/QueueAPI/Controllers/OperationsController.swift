import MicroHTTP
import QueueEngine

/// Operations: create (in a queue), list, read, change, cancel, pause, resume, and one
/// operation's committed events.
struct OperationsController: Sendable {
    let engine: QueueEngine
    let durability: Durability
    let events: EventLog
    let store: any ServiceStore
    let limits: OpqdConfiguration.Limits

    func addRoutes(to r: inout Router) {
        r.add("POST", "/v1/queues/{name}/operations") { req, p in try durability.idempotent(req) { try create(req, p[0]) } }
        r.add("GET", "/v1/queues/{name}/operations") { req, p in try list(req, p[0]) }
        r.add("GET", "/v1/operations/{id}") { req, p in try get(req, p[0]) }
        r.add("PATCH", "/v1/operations/{id}") { req, p in try patch(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/cancel") { req, p in
            let q = try Query(req, allowed: ["cascade"])
            let cascade = try q.bool("cascade") ?? false
            return try action(req, p[0], query: ["cascade"]) { id throws(EngineError) in
                _ = try engine.cancel(id, cascade: cascade)
                // Kinds that stop at once (external, delay) have finished by now: answer that.
                return try engine.operation(id)
            }
        }
        r.add("POST", "/v1/operations/{id}/pause") { req, p in try action(req, p[0]) { id throws(EngineError) in try engine.pause(id) } }
        r.add("POST", "/v1/operations/{id}/resume") { req, p in try action(req, p[0]) { id throws(EngineError) in try engine.resume(id) } }
        r.add("GET", "/v1/operations/{id}/events") { req, p in try history(req, p[0]) }
    }

    func create(_ req: HTTPRequest, _ queue: String) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["kind", "name", "queuePriority", "dependencies", "spec", "timeout", "retry", "notBefore"])
        // Which kinds exist, what their specs allow, their default retry and their refusals are
        // the kinds' own business (`OperationKind`); the engine asks them.
        guard let kind = try b.string("kind", maxLength: 64) else {
            throw Problem.invalid("kind", "is required: one of \(engine.kindNames.joined(separator: ", "))")
        }
        // An unknown kind, or a spec the kind will not run here (403), before the other fields.
        try engine.checkPermitted(kind: kind, spec: b["spec"])
        var request = OperationRequest(kind: kind)
        request.name = try b.string("name", maxLength: 256)
        request.queuePriority = try parsePriority(b["queuePriority"]) ?? .normal
        request.dependencies = try parseDependencies(b["dependencies"], limit: limits.dependencies) ?? []
        request.spec = b["spec"]
        request.options.timeout = try b.number("timeout", in: 0.001...31_536_000, what: "a number of seconds from 0.001 to 31536000")
        if let r = b["retry"] { request.options.retry = try parseRetry(r) }
        if let nb = b["notBefore"] {
            guard case let .string(s) = nb, let t = Timestamp(rfc3339: s) else {
                throw Problem.invalid("notBefore", "must be an RFC 3339 time like 2026-11-22T10:00:00Z; got \(nb.text)")
            }
            request.options.notBefore = t
        }
        let op = try engine.addOperation(to: queue, request)
        return json(201, op.json, [("Location", "/v1/operations/\(op.id)"), ("ETag", ETag.operation(op.revision))])
    }

    func parseRetry(_ v: JSONValue) throws(Problem) -> RetryPolicy {
        guard case let .object(members) = v else { throw Problem.invalid("retry", "must be an object {maxAttempts, backoff, multiplier}; got \(v.typeName)") }
        var p = RetryPolicy()
        for (k, value) in members {
            switch (k, value) {
            case let ("maxAttempts", .number(n)) where n == n.rounded() && n >= 1 && n <= 100: p.maxAttempts = Int(n)
            case ("maxAttempts", _): throw Problem.invalid("retry.maxAttempts", "must be an integer from 1 to 100; got \(value.text)")
            case let ("backoff", .number(n)) where n >= 0 && n <= 86400: p.backoff = n
            case ("backoff", _): throw Problem.invalid("retry.backoff", "must be a number of seconds from 0 to 86400; got \(value.text)")
            case let ("multiplier", .number(n)) where n >= 1 && n <= 10: p.multiplier = n
            case ("multiplier", _): throw Problem.invalid("retry.multiplier", "must be a number from 1 to 10; got \(value.text)")
            default: throw Problem.invalid("retry.\(k)", "unknown field; allowed: maxAttempts, backoff, multiplier")
            }
        }
        return p
    }

    func list(_ req: HTTPRequest, _ queue: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["state", "limit", "after"])
        var state: OperationState? = nil
        if let s = q.values["state"] {
            guard let st = OperationState(rawValue: s) else {
                throw Problem.invalid("state", "must be one of \(OperationState.allCases.map(\.rawValue).joined(separator: ", ")); got '\(s)'")
            }
            state = st
        }
        let limit = try q.int("limit", in: 1...1000) ?? 100
        var after: OperationID? = nil
        if let a = q.values["after"] {
            guard let id = OperationID(a) else { throw Problem.invalid("after", "must be a cursor from a previous page's next; got '\(a)'") }
            after = id
        }
        let page = try engine.operations(in: queue, state: state, after: after, limit: limit)
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
        return .response(json(200, o.bytes))
    }

    func get(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        if req.header("if-none-match") != nil {
            let etag = ETag.operation(try engine.revision(of: id))
            if ETag.matches(req, etag) { return ETag.notModified(etag) }
        }
        let op = try engine.operation(id)
        return .response(json(200, op.json, [("ETag", ETag.operation(op.revision))]))
    }

    func patch(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["queuePriority", "dependencies"])
        let priority = try parsePriority(b["queuePriority"])
        let deps = try parseDependencies(b["dependencies"], limit: limits.dependencies)
        let op = try engine.update(id, queuePriority: priority, dependencies: deps)
        return durability.ack(json(200, op.json, [("ETag", ETag.operation(op.revision))]))
    }

    func action(_ req: HTTPRequest, _ idText: String, query: [String] = [], _ action: (OperationID) throws(EngineError) -> OperationSnapshot) throws
        -> HTTPHandlerResult
    {
        _ = try Query(req, allowed: query)
        let id = try parseOperationID(idText)
        try requireNoBody(req)
        let op = try action(id)
        return durability.ack(json(200, op.json, [("ETag", ETag.operation(op.revision))]))
    }

    func history(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after", "limit"])
        let id = try parseOperationID(idText)
        let after = UInt64(try q.int("after", in: 0...Int.max) ?? 0)
        let limit = try q.int("limit", in: 1...10_000) ?? 1000
        _ = try engine.revision(of: id)
        // Committed events only, like the feed: from the store (which keeps every event of the
        // operation until retention), else from the in-memory ring.
        let list: [(seq: UInt64, json: [UInt8])] =
            store.history(of: id, after: after, limit: limit + 1)?.map { ($0.seq, $0.json) }
            ?? Array(events.events(of: id).lazy.filter { $0.seq > after }.prefix(limit + 1))
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
