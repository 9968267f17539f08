import MicroHTTP
import QueueEngine
import QueueKinds

/// Workers of `external` operations: claim (long poll), heartbeat, progress, finish, and the
/// list of live workers.
struct WorkersController: Sendable {
    let engine: QueueEngine
    let external: ExternalKind
    let durability: Durability
    let limits: OpqdConfiguration.Limits

    func addRoutes(to r: inout Router) {
        r.add("POST", "/v1/queues/{name}/claim") { req, p in try claim(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/heartbeat") { req, p in try heartbeat(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/progress") { req, p in try progress(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/finish") { req, p in try finish(req, p[0]) }
        r.add("GET", "/v1/workers") { req, _ in try workers(req) }
    }

    static func write(_ lease: ExternalKind.Lease, to o: inout JSONOut) {
        o.open()
        o.key("token"); o.string(lease.token)
        o.key("expiresAt"); o.time(lease.expiresAt)
        o.key("worker"); o.string(lease.worker)
        o.close()
    }

    /// `{"operation": status, "lease": {...}}` plus, for heartbeats, the two flags a worker acts on.
    static func answer(_ lease: ExternalKind.Lease, engine: QueueEngine, flags: Bool) -> HTTPResponse {
        let op = try? engine.operation(lease.operation)
        var o = JSONOut()
        o.open()
        o.key("operation")
        if let op { op.write(to: &o) } else { o.null() }
        o.key("lease"); write(lease, to: &o)
        if flags {
            o.key("isCancelled"); o.bool(op?.isCancelled ?? false)
            o.key("isPaused"); o.bool(op?.isPaused ?? false)
        }
        o.close()
        return json(200, o.bytes)
    }

    func claim(_ req: HTTPRequest, _ queue: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["wait"])
        let wait = try q.seconds("wait", max: 300) ?? 0
        let b = try Body(req, allowed: ["worker"], emptyIsObject: true)
        let worker = try b.string("worker", maxLength: 128) ?? "worker-\(req.header("x-forwarded-for").map { String($0.prefix(64)) } ?? "anonymous")"
        _ = try engine.queue(named: queue)
        let (external, engine) = (self.external, self.engine)
        let (lease, _) = external.claim(queue: queue, worker: worker, wait: nil)
        if let lease { return durability.ack(Self.answer(lease, engine: engine, flags: false)) }
        if wait == 0 { return .response(HTTPResponse(status: 204)) }
        return .deferred { responder in
            // The lease is saved with the operation: answer once that is durable.
            let (lease, waiter) = external.claim(queue: queue, worker: worker) { lease in
                engine.whenDurable { responder.respond(Self.answer(lease, engine: engine, flags: false)) }
            }
            if let lease { engine.whenDurable { responder.respond(Self.answer(lease, engine: engine, flags: false)) }; return }
            guard let waiter else { return }
            engine.scheduler.after(seconds: wait) {
                if external.cancelClaim(queue: queue, waiter: waiter) { responder.respond(HTTPResponse(status: 204)) }
            }
        }
    }

    func token(_ b: Body) throws(Problem) -> String {
        guard let t = try b.string("leaseToken", maxLength: 128) else { throw Problem.invalid("leaseToken", "is required: the token from the claim") }
        return t
    }

    func heartbeat(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["leaseToken"])
        let t = try token(b)
        _ = try engine.revision(of: id)
        let lease = try external.heartbeat(id, token: t)
        return durability.ack(Self.answer(lease, engine: engine, flags: true))
    }

    func progress(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["leaseToken", "completed", "total"])
        let t = try token(b)
        guard let completed = try b.number("completed", in: 0...1e15, what: "a number from 0") else {
            throw Problem.invalid("completed", "is required: a number from 0")
        }
        let total = try b.number("total", in: 0...1e15, what: "a number from 0") ?? 0
        if total > 0 && completed > total { throw Problem.invalid("completed", "must not exceed total (\(total)); got \(completed)") }
        _ = try engine.revision(of: id)
        let lease = try external.lease(id, token: t)
        lease.context.progress(completed: completed, total: total)
        return durability.ack(json(200, try engine.operation(id).json))
    }

    func finish(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["leaseToken", "result", "error"])
        let t = try token(b)
        let maxResult = limits.resultBytes
        for field in ["result", "error"] {
            if let v = b[field] {
                let size = v.bytes.count
                if size > maxResult {
                    throw Problem(
                        422, "result-too-large", "Result too large",
                        "\(field): \(size) bytes of JSON; the limit (--max-result-bytes) is \(maxResult) bytes")
                }
            }
        }
        let completion: Completion
        switch (b["result"], b["error"]) {
        case (.some, .some): throw Problem.invalid("error", "give either result or error, not both")
        case let (.some(result), nil): completion = .succeeded(result)
        case let (nil, .some(error)):
            if case let .string(type)? = error["type"] {
                let detail: String
                if case let .string(d)? = error["detail"] { detail = d } else { detail = "" }
                completion = .failed(type: type, detail: detail, data: error["data"])
            } else {
                completion = .failed(type: "worker-error", detail: "the worker reported an error", data: error)
            }
        case (nil, nil): completion = .succeeded(.null)
        }
        let op = try engine.operation(id)
        if op.isFinished { throw Problem(409, "already-finished", "Already finished", "operation \(id) has already finished (\(op.outcome?.rawValue ?? "?"))") }
        try external.finish(id, token: t, completion)
        return durability.ack(json(200, try engine.operation(id).json))
    }

    func workers(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after"])
        let after = q.values["after"]
        var byWorker: [String: [ExternalKind.Lease]] = [:]
        for l in external.leases where after.map({ l.worker > $0 }) ?? true { byWorker[l.worker, default: []].append(l) }
        let budget = pageBudget(limits)
        var o = JSONOut()
        o.open(); o.key("workers"); o.openArray()
        var next: String? = nil, last: String? = nil
        for (worker, leases) in byWorker.sorted(by: { $0.key < $1.key }) {
            // A page ends at the byte budget; `next` (a worker name) carries on.
            if last != nil && o.bytes.count > budget { next = last; break }
            last = worker
            guard let since = leases.map(\.since).min() else { continue }
            o.open()
            o.key("worker"); o.string(worker)
            o.key("since"); o.time(since)
            o.key("leases"); o.openArray()
            for l in leases.sorted(by: { $0.since < $1.since }) {
                o.open()
                o.key("operation"); o.string(l.operation.description)
                o.key("queue"); o.string(l.queue)
                o.key("since"); o.time(l.since)
                o.key("expiresAt"); o.time(l.expiresAt)
                o.close()
            }
            o.closeArray()
            o.close()
        }
        o.closeArray()
        o.key("next")
        if let next { o.string(next) } else { o.null() }
        o.close()
        return .response(json(200, o.bytes))
    }
}
