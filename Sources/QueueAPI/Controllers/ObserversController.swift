import MicroHTTP
import OutboundHTTP
import QueueEngine

/// Webhook observers of one operation or of a whole queue: register, list, read (with the
/// delivery's state), delete.
package struct ObserversController: Sendable {
    let engine: QueueEngine
    let webhooks: Webhooks

    package func addRoutes(to r: inout Router) {
        r.add("POST", "/v1/operations/{id}/observers", scope: .operation(param: 0)) { req, p in try add(req, try operationScope(p[0])) }
        r.add("GET", "/v1/operations/{id}/observers", scope: .operation(param: 0)) { req, p in try list(req, try operationScope(p[0])) }
        r.add("GET", "/v1/operations/{id}/observers/{observer}", scope: .operation(param: 0)) { req, p in try get(req, try operationScope(p[0]), p[1]) }
        r.add("DELETE", "/v1/operations/{id}/observers/{observer}", scope: .operation(param: 0)) { req, p in try delete(req, try operationScope(p[0]), p[1]) }
        r.add("POST", "/v1/queues/{name}/observers", scope: .queue(param: 0)) { req, p in try add(req, try queueScope(p[0])) }
        r.add("GET", "/v1/queues/{name}/observers", scope: .queue(param: 0)) { req, p in try list(req, try queueScope(p[0])) }
        r.add("GET", "/v1/queues/{name}/observers/{observer}", scope: .queue(param: 0)) { req, p in try get(req, try queueScope(p[0]), p[1]) }
        r.add("DELETE", "/v1/queues/{name}/observers/{observer}", scope: .queue(param: 0)) { req, p in try delete(req, try queueScope(p[0]), p[1]) }
    }

    /// A request's scope, and what a new observer there watches. An operation must exist (404),
    /// a finished one reports no more changes (409 when adding).
    struct Scope {
        let query: ObserverScopeQuery
        let path: String
        let name: String
        let resolve: () throws -> ObserverScope
    }

    func operationScope(_ text: String) throws -> Scope {
        let id = try parseOperationID(text)
        let engine = self.engine
        return Scope(query: .operation(id), path: "/v1/operations/\(id)", name: "operation \(id)") {
            let op = try engine.operation(id)
            if op.isFinished { throw Problem.conflict("operation \(id) has finished; it will report no more changes") }
            return .operation(id, queue: op.queue)
        }
    }

    func queueScope(_ name: String) throws -> Scope {
        let engine = self.engine
        return Scope(query: .queue(name), path: "/v1/queues/\(name)", name: "queue '\(name)'") {
            _ = try engine.queue(named: name)
            return .queue(name)
        }
    }

    func add(_ req: HTTPRequest, _ scope: Scope) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["url", "keys"])
        guard let url = try b.string("url", maxLength: 2048) else { throw Problem.invalid("url", "is required: an http or https URL") }
        guard url.hasPrefix("http://") || url.hasPrefix("https://"), case .success = OutboundURL.check(url) else {
            throw Problem.invalid("url", "must be an http or https URL with a host; got '\(url)'")
        }
        var keys: Set<ChangeKey>? = nil
        if let k = b["keys"] {
            guard case let .array(items) = k, !items.isEmpty else {
                let got = if case .array = k { "an empty array" } else { k.typeName }
                throw Problem.invalid("keys", "must be a non-empty array of keys (leave it out for every key); got \(got)")
            }
            var set = Set<ChangeKey>()
            for item in items {
                // `breaker` is a host's key: an operation or a queue never has it.
                guard case let .string(s) = item, let key = ChangeKey(rawValue: s), key != .breaker else {
                    let allowed = ChangeKey.allCases.filter { $0 != .breaker }.map(\.rawValue)
                    throw Problem.invalid("keys", "each must be one of \(allowed.joined(separator: ", ")); got \(item.text)")
                }
                set.insert(key)
            }
            keys = set
        }
        let hook = try webhooks.register(try scope.resolve(), url: url, keys: keys)
        do {
            // Again after registering: a queue deleted (or an operation finished) in between
            // would otherwise keep an observer that outlives it.
            _ = try scope.resolve()
        } catch {
            webhooks.remove(hook.id)
            throw error
        }
        var o = JSONOut()
        Self.write(hook, delivery: webhooks.delivery(hook.id), to: &o)
        let response = json(201, o.bytes, [("Location", "\(scope.path)/observers/\(hook.id)")])
        let (webhooks, hookID) = (self.webhooks, hook.id)
        // Answered once the registration is committed, like every other 2xx change.
        return .deferred { responder in
            responder.answerBeforeShutdown()
            // Registered already (so no event falls between); durable once this runs.
            webhooks.whenCommitted(hookID) { responder.respond(response) }
        }
    }

    /// Registrations only (no delivery state), so the ETag is the registry's revision and a
    /// poll that finds nothing new gets a 304.
    func list(_ req: HTTPRequest, _ scope: Scope) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        switch scope.query {
        case let .operation(id): _ = try engine.revision(of: id)
        case let .queue(name): _ = try engine.queue(named: name)
        }
        let (hooks, revision) = webhooks.hooks(in: scope.query)
        let etag = "\"o\(ETag.bootNonce)-\(revision)\""
        if ETag.matches(req, etag) { return ETag.notModified(etag) }
        var o = JSONOut()
        o.open(); o.key("observers"); o.openArray()
        for h in hooks { Self.write(h, delivery: nil, to: &o) }
        o.closeArray(); o.close()
        return .response(json(200, o.bytes, [("ETag", etag)]))
    }

    func get(_ req: HTTPRequest, _ scope: Scope, _ observer: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        guard let h = webhooks.hook(observer, in: scope.query) else { throw Problem.notFound("no observer '\(observer)' on \(scope.name)") }
        var o = JSONOut()
        Self.write(h, delivery: webhooks.delivery(h.id), to: &o)
        return .response(json(200, o.bytes))
    }

    func delete(_ req: HTTPRequest, _ scope: Scope, _ observer: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        guard webhooks.hook(observer, in: scope.query) != nil else { throw Problem.notFound("no observer '\(observer)' on \(scope.name)") }
        let webhooks = self.webhooks
        return .deferred { responder in
            responder.answerBeforeShutdown()
            webhooks.remove(observer) { responder.respond(HTTPResponse(status: 204)) }
        }
    }

    static func write(_ h: Webhooks.Hook, delivery: Delivery.Snapshot?, to o: inout JSONOut) {
        o.open()
        o.key("id"); o.string(h.id)
        o.key("queue"); o.string(h.queue)
        if let op = h.operation {
            o.key("operation"); o.string(op.description)
        }
        o.key("url"); o.string(h.url)
        o.key("keys"); o.openArray()
        for k in (h.keys.map { Array($0) } ?? ChangeKey.allCases.filter { $0 != .breaker }).map(\.rawValue).sorted() { o.string(k) }
        o.closeArray()
        o.key("createdAt"); o.time(h.createdAt)
        if let d = delivery {
            o.key("delivery"); o.open()
            o.key("state"); o.string(d.state)
            o.key("cursor"); o.int(d.cursor)
            o.key("lastDeliveredSeq")
            if let s = d.lastDelivered { o.int(s) } else { o.null() }
            o.key("pending"); o.int(UInt64(d.pending))
            o.key("behind"); o.int(d.behind)
            o.key("delivered"); o.int(d.delivered)
            o.key("failures"); o.int(d.failures)
            o.key("consecutiveFailures"); o.int(UInt64(d.consecutiveFailures))
            o.key("dropped"); o.int(d.dropped)
            o.key("lastError")
            if let e = d.lastError { o.string(e) } else { o.null() }
            for (key, time): (StaticString, Timestamp?) in [
                ("lastAttemptAt", d.lastAttemptAt), ("lastSuccessAt", d.lastSuccessAt), ("nextAttemptAt", d.nextAttemptAt),
            ] {
                o.key(key)
                if let t = time { o.time(t) } else { o.null() }
            }
            o.close()
        }
        o.close()
    }
}
