import MicroHTTP
import QueueEngine

/// `/v1/queues`: create, list, read, change and delete queues; suspend, resume, cancel-all,
/// barriers and the idle long poll.
package struct QueuesController: Sendable {
    let engine: QueueEngine
    let durability: Durability
    let webhooks: Webhooks
    let limits: APILimits

    package func addRoutes(to r: inout Router) {
        r.add("POST", "/v1/queues", scope: .queueInBody(member: "name")) { req, _ in try durability.idempotent(req) { try create(req) } }
        let (reads, limits) = (EngineQueueReads(engine: engine), self.limits)
        r.add("GET", "/v1/queues", scope: .everyQueue) { req, _ in try Self.list(req, from: reads, limits: limits) }
        r.add("GET", "/v1/queues/{name}", scope: .queue(param: 0, reads: .fromStore)) { req, p in try Self.get(req, p[0], from: reads) }
        r.add("PATCH", "/v1/queues/{name}", scope: .queue(param: 0)) { req, p in try patch(req, p[0]) }
        r.add("DELETE", "/v1/queues/{name}", scope: .queue(param: 0)) { req, p in try delete(req, p[0]) }
        r.add("POST", "/v1/queues/{name}/suspend", scope: .queue(param: 0)) { req, p in try action(req) { () throws(EngineError) in try engine.suspend(p[0]) } }
        r.add("POST", "/v1/queues/{name}/resume", scope: .queue(param: 0)) { req, p in
            try action(req) { () throws(EngineError) in try engine.resumeQueue(p[0]) }
        }
        r.add("POST", "/v1/queues/{name}/cancel-all", scope: .queue(param: 0)) { req, p in
            try action(req) { () throws(EngineError) in try engine.cancelAll(p[0]) }
        }
        r.add("GET", "/v1/queues/{name}/wait", scope: .queue(param: 0)) { req, p in try wait(req, p[0]) }
        r.add("POST", "/v1/queues/{name}/barrier", scope: .queue(param: 0)) { req, p in try durability.idempotent(req) { try barrier(req, p[0]) } }
    }

    static let maxConcurrentRule = "a positive integer up to 1000000, or -1 for the server's default"

    func maxConcurrent(_ b: Body) throws(Problem) -> Int? {
        let max = try b.int("maxConcurrentOperationCount", in: -1...1_000_000, what: Self.maxConcurrentRule)
        if max == 0 { throw Problem.invalid("maxConcurrentOperationCount", "must be a positive integer or -1 for the server's default; got 0") }
        return max
    }

    func create(_ req: HTTPRequest) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["name", "maxConcurrentOperationCount", "isSuspended", "rateLimit", "fairnessWeights"])
        guard let name = try b.string("name", maxLength: 1000) else {
            throw Problem.invalid("name", "is required: [A-Za-z0-9._-]{1,64}")
        }
        let max = try maxConcurrent(b)
        let suspended = try b.bool("isSuspended") ?? false
        let rate = try b["rateLimit"].flatMap { v throws(Problem) in try FlowParsing.queueRate(v) }
        let weights = try b["fairnessWeights"].map { v throws(Problem) in try FlowParsing.weights(v) } ?? [:]
        let q = try engine.createQueue(
            name: name, maxConcurrentOperationCount: max ?? -1, isSuspended: suspended, rateLimit: rate, fairnessWeights: weights)
        return json(201, q.json, [("Location", "/v1/queues/\(name)"), ("ETag", ETag.queue(q))])
    }

    /// `GET /v1/queues`: every queue (a page of them, by name), with an `ETag` over all of them.
    /// The owner reads its engine, a cluster follower the queues' rows (`FollowerReads`): one
    /// code, so the same bytes.
    package static func list(_ req: HTTPRequest, from reads: some QueueReads, limits: APILimits) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after", "limit"])
        let after = q.values["after"]
        let limit = try q.int("limit", in: 1...100_000) ?? 100_000
        let budget = pageBudget(limits)
        let queues = try reads.queues()
        // Every queue's revision moves with each change to it or its operations' states, so
        // the list's ETag comes from the revisions alone, before anything is encoded.
        let etag = ETag.queues(queues)
        if ETag.matches(req, etag) { return ETag.notModified(etag) }
        var o = JSONOut(capacity: 4096)
        o.open(); o.key("queues"); o.openArray()
        // Sorted by name; a page ends at `limit` or the byte budget, and `next` carries on.
        var count = 0
        var next: String? = nil
        var lastName: String? = nil
        for queue in queues where after.map({ queue.name > $0 }) ?? true {
            if count == limit { next = lastName; break }
            let before = o.bytes.count
            queue.write(to: &o)
            if count > 0 && o.bytes.count > budget { o.truncate(to: before); next = lastName; break }
            lastName = queue.name
            count += 1
        }
        o.closeArray()
        o.key("next")
        if let next { o.string(next) } else { o.null() }
        o.close()
        return .response(json(200, o.bytes, [("ETag", etag)]))
    }

    /// `GET /v1/queues/{name}`: the status with its `ETag`, or 304 for a matching `If-None-Match`.
    package static func get(_ req: HTTPRequest, _ name: String, from reads: some QueueReads) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let q = try reads.queue(named: name)
        let etag = ETag.queue(q)
        if ETag.matches(req, etag) { return ETag.notModified(etag) }
        return .response(json(200, q.json, [("ETag", etag)]))
    }

    func patch(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["maxConcurrentOperationCount", "isSuspended", "rateLimit", "fairnessWeights"])
        let max = try maxConcurrent(b)
        let suspended = try b.bool("isSuspended")
        let rate: RateLimit?? = try b["rateLimit"].map { v throws(Problem) in try FlowParsing.queueRate(v) }
        let weights = try b["fairnessWeights"].map { v throws(Problem) in try FlowParsing.weights(v) }
        let q = try engine.updateQueue(name, maxConcurrentOperationCount: max, isSuspended: suspended, rateLimit: rate, fairnessWeights: weights)
        return durability.ack(json(200, q.json, [("ETag", ETag.queue(q))]))
    }

    func delete(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["force"])
        try engine.deleteQueue(name, force: try q.bool("force") ?? false)
        // Its observers go with it, at once and durably before the answer: a queue created again
        // under this name starts with none, also after a crash.
        let webhooks = self.webhooks
        return durability.ack(HTTPResponse(status: 204)) { done in webhooks.removeAll(inQueue: name, durable: done) }
    }

    func action(_ req: HTTPRequest, _ action: () throws(EngineError) -> QueueSnapshot) throws -> HTTPHandlerResult {
        try requireNoBody(req)
        _ = try Query(req, allowed: [])
        let q = try action()
        return durability.ack(json(200, q.json, [("ETag", ETag.queue(q))]))
    }

    func wait(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["timeout"])
        let timeout = try q.seconds("timeout", max: 3600) ?? LongPoll.defaultWaitSeconds
        _ = try engine.queue(named: name)
        let engine = self.engine
        @Sendable func answer(_ idle: Bool) -> HTTPResponse {
            // Its queue went to another cluster instance (a handover) while this waited: the
            // cluster front asks the new holder for the rest of the wait.
            if !idle, engine.wasReleased(queue: name) {
                return LongPoll.moved("queue '\(name)' moved to another instance of the cluster while this request waited; retry it")
            }
            let count = (try? engine.queue(named: name).operationCount) ?? 0
            var o = JSONOut()
            o.open()
            o.key("queue"); o.string(name)
            o.key("idle"); o.bool(idle)
            o.key("timedOut"); o.bool(!idle)
            o.key("operationCount"); o.int(count)
            o.close()
            return json(200, o.bytes)
        }
        if try engine.queue(named: name).operationCount == 0 { return .response(answer(true)) }
        if timeout == 0 { return .response(answer(false)) }
        return .deferred { responder in
            let token: UInt64?
            do {
                token = try engine.onIdle(name) { idle in responder.respond(answer(idle)) }
            } catch {
                // Deleted, or moved to another cluster instance, between the check above and now.
                responder.respond(engine.wasReleased(queue: name) ? answer(false) : Problem.from(error, requestID: req.id).response)
                return
            }
            guard let token else { return }
            // At the timeout, or at shutdown (not 503).
            LongPoll.ends(responder, after: timeout, on: engine.scheduler) {
                if engine.cancelIdleWait(name, token: token) { responder.respond(answer(false)) }
            }
        }
    }

    func barrier(_ req: HTTPRequest, _ queue: String) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["name"], emptyIsObject: true)
        let op = try engine.addBarrier(to: queue, name: try b.string("name"))
        return json(201, op.json, [("Location", "/v1/operations/\(op.id)"), ("ETag", ETag.operation(op))])
    }
}

/// Where queue statuses are read from: the engine on the owner (and a single opqd), the queues'
/// rows in PostgreSQL on a cluster follower (`FollowerReads`). One route code for both, so both
/// answer the same bytes, ETags and problems.
package protocol QueueReads: Sendable {
    /// Throws `EngineError.queueNotFound` for a queue that does not exist.
    func queue(named name: String) throws -> QueueSnapshot
    /// Every queue, sorted by name.
    func queues() throws -> [QueueSnapshot]
}

/// The engine's queues.
struct EngineQueueReads: QueueReads {
    let engine: QueueEngine
    func queue(named name: String) throws -> QueueSnapshot { try engine.queue(named: name) }
    func queues() throws -> [QueueSnapshot] { engine.queues() }
}
