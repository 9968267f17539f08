import Dispatch
import MicroHTTP
import OutboundHTTP
import QueueEngine
import QueueKinds
import QueueStore

let jsonType = ("Content-Type", "application/json; charset=utf-8")

func json(_ status: Int, _ body: [UInt8], _ headers: [(String, String)] = []) -> HTTPResponse {
    HTTPResponse(status: status, headers: [jsonType] + headers, body: body)
}

/// The v1 API: each handler decodes, calls the engine, encodes. No business logic here.
struct Routes {
    let app: OpqdApplication
    var engine: QueueEngine { app.engine }

    func register(in r: inout Router) {
        r.add("GET", "/healthz", access: .open) { _, _ in .response(json(200, Array(#"{"status":"ok"}"#.utf8))) }
        r.add("GET", "/readyz", access: .open) { _, _ in readyz() }
        r.add("GET", "/metrics") { _, _ in
            .response(HTTPResponse(status: 200, headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")],
                                   body: app.metrics.render(engine: engine, lastSeq: app.events.lastSeq, store: app.sqlite?.stats)))
        }
        r.add("GET", "/openapi.yaml") { _, _ in
            .response(HTTPResponse(status: 200, headers: [("Content-Type", "application/yaml")], body: Array(openAPIDocument.utf8)))
        }
        r.add("POST", "/v1/queues") { req, _ in try idempotent(req) { try createQueue(req) } }
        r.add("GET", "/v1/queues") { req, _ in try listQueues(req) }
        r.add("GET", "/v1/queues/{name}") { req, p in try getQueue(req, p[0]) }
        r.add("PATCH", "/v1/queues/{name}") { req, p in try patchQueue(req, p[0]) }
        r.add("DELETE", "/v1/queues/{name}") { req, p in try deleteQueue(req, p[0]) }
        r.add("POST", "/v1/queues/{name}/suspend") { req, p in try queueAction(req) { () throws(EngineError) in try engine.suspend(p[0]) } }
        r.add("POST", "/v1/queues/{name}/resume") { req, p in try queueAction(req) { () throws(EngineError) in try engine.resumeQueue(p[0]) } }
        r.add("POST", "/v1/queues/{name}/cancel-all") { req, p in try queueAction(req) { () throws(EngineError) in try engine.cancelAll(p[0]) } }
        r.add("GET", "/v1/queues/{name}/wait") { req, p in try wait(req, p[0]) }
        r.add("POST", "/v1/queues/{name}/barrier") { req, p in try idempotent(req) { try barrier(req, p[0]) } }
        r.add("POST", "/v1/queues/{name}/operations") { req, p in try idempotent(req) { try createOperation(req, p[0]) } }
        r.add("GET", "/v1/queues/{name}/operations") { req, p in try listOperations(req, p[0]) }
        r.add("GET", "/v1/operations/{id}") { req, p in try getOperation(req, p[0]) }
        r.add("PATCH", "/v1/operations/{id}") { req, p in try patchOperation(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/cancel") { req, p in
            let q = try Query(req, allowed: ["cascade"])
            let cascade = try q.bool("cascade") ?? false
            return try opAction(req, p[0], query: ["cascade"]) { id throws(EngineError) in
                _ = try engine.cancel(id, cascade: cascade)
                // Kinds that stop at once (external, delay) have finished by now: answer that.
                return try engine.operation(id)
            }
        }
        r.add("POST", "/v1/operations/{id}/pause") { req, p in try opAction(req, p[0]) { id throws(EngineError) in try engine.pause(id) } }
        r.add("POST", "/v1/operations/{id}/resume") { req, p in try opAction(req, p[0]) { id throws(EngineError) in try engine.resume(id) } }
        r.add("GET", "/v1/operations/{id}/events") { req, p in try operationEvents(req, p[0]) }
        r.add("POST", "/v1/operations/{id}/observers") { req, p in try addWebhook(req, p[0]) }
        r.add("GET", "/v1/operations/{id}/observers") { req, p in
            _ = try Query(req, allowed: [])
            let id = try parseOperationID(p[0])
            _ = try engine.revision(of: id)
            var o = JSONOut()
            o.open(); o.key("observers"); o.openArray()
            for h in app.webhooks.hooks(of: id) { webhookJSON(h, to: &o) }
            o.closeArray(); o.close()
            return .response(json(200, o.bytes))
        }
        r.add("GET", "/v1/operations/{id}/observers/{observer}") { req, p in
            _ = try Query(req, allowed: [])
            let id = try parseOperationID(p[0])
            guard let h = app.webhooks.hook(p[1], of: id) else { throw Problem.notFound("no observer '\(p[1])' on operation \(p[0])") }
            var o = JSONOut()
            webhookJSON(h, to: &o)
            return .response(json(200, o.bytes))
        }
        r.add("DELETE", "/v1/operations/{id}/observers/{observer}") { req, p in
            _ = try Query(req, allowed: [])
            let id = try parseOperationID(p[0])
            guard app.webhooks.hook(p[1], of: id) != nil else { throw Problem.notFound("no observer '\(p[1])' on operation \(p[0])") }
            let webhooks = app.webhooks
            return .deferred { responder in
                responder.answerBeforeShutdown()
                webhooks.remove(p[1]) { responder.respond(HTTPResponse(status: 204)) }
            }
        }
        r.add("GET", "/v1/events") { req, _ in try eventFeed(req) }
        r.add("GET", "/v1/events/stream") { req, _ in try eventStream(req) }
    }

    // MARK: - helpers

    func readyz() -> HTTPHandlerResult {
        if app.stopping.load(ordering: .relaxed) {
            return .response(Problem(503, "not-ready", "Not ready", "the server is shutting down").response)
        }
        return .response(json(200, Array("{\"status\":\"ready\",\"store\":\"\(app.sqlite == nil ? "memory" : "sqlite")\"}".utf8)))
    }

    /// Answers a change only once it is durable.
    func ack(_ response: HTTPResponse) -> HTTPHandlerResult {
        guard engine.store.wantsRecords else { return .response(response) }
        return .deferred { responder in
            // The change is made: at shutdown this answer is waited for, never replaced by a 503.
            responder.answerBeforeShutdown()
            engine.whenDurable { responder.respond(response) }
        }
    }

    func noBody(_ req: HTTPRequest) throws(Problem) {
        // Actions take no body; an empty object is tolerated for clients that always send one.
        if req.body.isEmpty { return }
        _ = try Body(req, allowed: [], emptyIsObject: true)
    }


    func etagMatches(_ req: HTTPRequest, _ etag: String) -> Bool {
        guard let inm = req.header("if-none-match") else { return false }
        if inm == etag || inm == "*" { return true }
        return inm.split(separator: ",").contains { $0.trimmingCharactersInSpace() == etag || $0.trimmingCharactersInSpace() == "W/" + etag }
    }

    func notModified(_ etag: String) -> HTTPHandlerResult {
        .response(HTTPResponse(status: 304, headers: [("ETag", etag)]))
    }

    static func operationETag(_ rev: UInt64) -> String { "\"r\(rev)\"" }
    /// A queue's revision is not persisted with every operation change, so its ETag also
    /// names this process's start: no ETag handed out before a restart can match after it.
    static func queueETag(_ q: QueueSnapshot) -> String { "\"q\(q.createdAt.nanoseconds)-\(bootNonce)-\(q.revision)\"" }
    static let bootNonce = String(UInt32.random(in: 0...UInt32.max), radix: 36)

    /// A create: answered once durable; with an `Idempotency-Key`, a repeat gets the first
    /// answer instead of creating a second resource (the answer is kept durably too).
    func idempotent(_ req: HTTPRequest, _ body: () throws -> HTTPResponse) throws -> HTTPHandlerResult {
        guard let key = req.header("idempotency-key") else { return ack(try body()) }
        guard !key.isEmpty, key.utf8.count <= 255 else {
            throw Problem.invalid("Idempotency-Key", "must be 1 to 255 characters")
        }
        let scope = req.path + "\u{0}" + key
        let bodyHash = IdempotencyCache.hash(req.body)
        switch app.idempotency.begin(scope, hash: bodyHash, now: SystemClock().now(), retain: app.configuration.retain) {
        case let .full(problem):
            throw problem
        case let .replay(response):
            var r = response
            r.headers.append(("Idempotent-Replayed", "true"))
            return .response(r)
        case .inProgress:
            throw Problem(409, "idempotency-in-progress", "Request in progress", "a request with this Idempotency-Key is still being processed; retry shortly")
        case .mismatch:
            throw Problem.invalid("Idempotency-Key", "was already used with a different request body")
        case .new:
            let response: HTTPResponse
            do {
                response = try body()
            } catch let p as Problem {
                response = p.response
            } catch let e as EngineError {
                response = e.problem.response
            } catch {
                app.idempotency.abandon(scope)
                throw error
            }
            // A refusal that may pass (429, 5xx) is not kept: a retry with the same key gets a new try.
            if response.status == 429 || response.status >= 500 {
                app.idempotency.abandon(scope)
                return .response(response)
            }
            let cache = app.idempotency
            guard let store = app.sqlite else {
                cache.finish(scope, response: response)
                return .response(response)
            }
            let record = IdempotencyRecord(scope: scope, bodyHash: bodyHash, status: response.status,
                                           headers: response.headers, body: response.body, createdAt: SystemClock().now())
            // Until the change and the kept answer are committed, a retry gets 409 in-progress,
            // never a replay of an answer a crash could still take back.
            return .deferred { responder in
                responder.answerBeforeShutdown()
                engine.whenDurable {
                    store.saveIdempotency(record) {
                        cache.finish(scope, response: response)
                        responder.respond(response)
                    }
                }
            }
        }
    }

    // MARK: - queues

    func createQueue(_ req: HTTPRequest) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["name", "maxConcurrentOperationCount", "isSuspended"])
        guard let name = try b.string("name", maxLength: 1000) else {
            throw Problem.invalid("name", "is required: [A-Za-z0-9._-]{1,64}")
        }
        let max = try b.int("maxConcurrentOperationCount", in: -1...1_000_000, what: "a positive integer up to 1000000, or -1 for the server's default")
        if max == 0 { throw Problem.invalid("maxConcurrentOperationCount", "must be a positive integer or -1 for the server's default; got 0") }
        let suspended = try b.bool("isSuspended") ?? false
        let q = try engine.createQueue(name: name, maxConcurrentOperationCount: max ?? -1, isSuspended: suspended)
        return json(201, q.json, [("Location", "/v1/queues/\(name)"), ("ETag", Self.queueETag(q))])
    }

    func listQueues(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after", "limit"])
        let after = q.values["after"]
        let limit = try q.int("limit", in: 1...100_000) ?? 100_000
        let budget = app.configuration.limits.pageBytes - 160
        var o = JSONOut(capacity: 4096)
        o.open(); o.key("queues"); o.openArray()
        // Sorted by name; a page ends at `limit` or the byte budget, and `next` carries on.
        var count = 0
        var next: String? = nil
        var lastName: String? = nil
        for queue in engine.queues() where after.map({ queue.name > $0 }) ?? true {
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
        return .response(json(200, o.bytes))
    }

    func getQueue(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let q = try engine.queue(named: name)
        let etag = Self.queueETag(q)
        if etagMatches(req, etag) { return notModified(etag) }
        return .response(json(200, q.json, [("ETag", etag)]))
    }

    func patchQueue(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["maxConcurrentOperationCount", "isSuspended"])
        let max = try b.int("maxConcurrentOperationCount", in: -1...1_000_000, what: "a positive integer up to 1000000, or -1 for the server's default")
        if max == 0 { throw Problem.invalid("maxConcurrentOperationCount", "must be a positive integer or -1 for the server's default; got 0") }
        let suspended = try b.bool("isSuspended")
        let q = try engine.updateQueue(name, maxConcurrentOperationCount: max, isSuspended: suspended)
        return ack(json(200, q.json, [("ETag", Self.queueETag(q))]))
    }

    func deleteQueue(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["force"])
        try engine.deleteQueue(name, force: try q.bool("force") ?? false)
        return ack(HTTPResponse(status: 204))
    }

    func queueAction(_ req: HTTPRequest, _ action: () throws(EngineError) -> QueueSnapshot) throws -> HTTPHandlerResult {
        try noBody(req)
        _ = try Query(req, allowed: [])
        let q = try action()
        return ack(json(200, q.json, [("ETag", Self.queueETag(q))]))
    }

    func wait(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["timeout"])
        let timeout = try q.seconds("timeout", max: 3600) ?? 30
        _ = try engine.queue(named: name)
        let engine = self.engine
        @Sendable func answer(_ idle: Bool) -> HTTPResponse {
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
                responder.respond((error as? EngineError)?.problem.response ?? Problem.notFound("no queue named '\(name)'").response)
                return
            }
            guard let token else { return }
            EngineTimers.queue.asyncAfter(deadline: .now() + timeout) {
                if engine.cancelIdleWait(name, token: token) { responder.respond(answer(false)) }
            }
        }
    }

    func barrier(_ req: HTTPRequest, _ queue: String) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["name"], emptyIsObject: true)
        let op = try engine.addBarrier(to: queue, name: try b.string("name"))
        return json(201, op.json, [("Location", "/v1/operations/\(op.id)"), ("ETag", Self.operationETag(op.revision))])
    }

    // MARK: - operations

    func createOperation(_ req: HTTPRequest, _ queue: String) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["kind", "name", "queuePriority", "dependencies", "spec", "timeout", "retry", "notBefore"])
        guard let kindValue = b["kind"] else { throw Problem.invalid("kind", "is required: one of delay, http, command, external") }
        guard case let .string(kind) = kindValue, ["delay", "http", "command", "external"].contains(kind) else {
            throw Problem.invalid("kind", "must be one of delay, http, command, external; got \(kindValue.text)")
        }
        if kind == "command", case let .string(exe)? = b["spec"]?["argv"].flatMap({ v -> JSONValue? in
            if case let .array(items) = v { return items.first } else { return nil }
        }), !CommandKind.isAllowed(exe, in: app.kindsConfiguration) {
            let allowed = app.configuration.allowCommands
            throw Problem(403, "command-not-allowed", "Forbidden",
                          "spec.argv[0]: executable '\(exe)' is not allowed on this server; allowed: \(allowed.isEmpty ? "none (start opqd with --allow-command PATH)" : allowed.joined(separator: ", "))")
        }
        var request = OperationRequest(kind: kind)
        request.name = try b.string("name", maxLength: 256)
        request.queuePriority = try parsePriority(b["queuePriority"]) ?? .normal
        request.dependencies = try parseDependencies(b["dependencies"], limit: app.configuration.limits.dependencies) ?? []
        request.spec = b["spec"]
        request.options.timeout = try b.number("timeout", in: 0.001...31_536_000, what: "a number of seconds from 0.001 to 31536000")
        if let r = b["retry"] {
            request.options.retry = try parseRetry(r)
        } else if kind == "external" {
            // A worker that vanishes is the normal failure of external work: by default a
            // lease that runs out is offered twice more before the operation fails.
            request.options.retry = RetryPolicy(maxAttempts: 3, backoff: 0, multiplier: 1)
        }
        if let nb = b["notBefore"] {
            guard case let .string(s) = nb, let t = Timestamp(rfc3339: s) else {
                throw Problem.invalid("notBefore", "must be an RFC 3339 time like 2026-11-22T10:00:00Z; got \(nb.text)")
            }
            request.options.notBefore = t
        }
        let op = try engine.addOperation(to: queue, request)
        return json(201, op.json, [("Location", "/v1/operations/\(op.id)"), ("ETag", Self.operationETag(op.revision))])
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

    func listOperations(_ req: HTTPRequest, _ queue: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["state", "limit", "after"])
        var state: OperationState? = nil
        if let s = q.values["state"] {
            guard let st = OperationState(rawValue: s) else {
                throw Problem.invalid("state", "must be one of pending, ready, executing, paused, finished; got '\(s)'")
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
        var o = JSONOut(capacity: min(512 * page.operations.count + 64, app.configuration.limits.pageBytes))
        o.open(); o.key("operations"); o.openArray()
        // The byte budget (--max-page-bytes): an operation's result may be large, so a page
        // ends early and `next` carries on from the last operation it holds.
        var next = page.next
        // Room kept for the closing brackets and `next`.
        let budget = app.configuration.limits.pageBytes - 160
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

    func getOperation(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        if req.header("if-none-match") != nil {
            let etag = Self.operationETag(try engine.revision(of: id))
            if etagMatches(req, etag) { return notModified(etag) }
        }
        let op = try engine.operation(id)
        return .response(json(200, op.json, [("ETag", Self.operationETag(op.revision))]))
    }

    func patchOperation(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["queuePriority", "dependencies"])
        let priority = try parsePriority(b["queuePriority"])
        let deps = try parseDependencies(b["dependencies"], limit: app.configuration.limits.dependencies)
        let op = try engine.update(id, queuePriority: priority, dependencies: deps)
        return ack(json(200, op.json, [("ETag", Self.operationETag(op.revision))]))
    }

    func opAction(_ req: HTTPRequest, _ idText: String, query: [String] = [], _ action: (OperationID) throws(EngineError) -> OperationSnapshot) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: query)
        let id = try parseOperationID(idText)
        try noBody(req)
        let op = try action(id)
        return ack(json(200, op.json, [("ETag", Self.operationETag(op.revision))]))
    }

    func operationEvents(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after", "limit"])
        let id = try parseOperationID(idText)
        let after = UInt64(try q.int("after", in: 0...Int.max) ?? 0)
        let limit = try q.int("limit", in: 1...10_000) ?? 1000
        _ = try engine.revision(of: id)
        // Committed events only, like the feed: from the store (which keeps every event of the
        // operation until retention), else from the in-memory ring.
        let list: [(seq: UInt64, json: [UInt8])]
        if let store = app.sqlite {
            list = store.events(of: id, after: after, limit: limit + 1).map { ($0.seq, $0.json) }
        } else {
            list = Array(app.events.events(of: id).lazy.filter { $0.seq > after }.prefix(limit + 1))
        }
        let budget = app.configuration.limits.pageBytes - 160
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

    func addWebhook(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        let b = try Body(req, allowed: ["url", "keys"])
        guard let url = try b.string("url", maxLength: 2048) else { throw Problem.invalid("url", "is required: an http or https URL") }
        guard url.hasPrefix("http://") || url.hasPrefix("https://"), case .success = OutboundURL.check(url) else {
            throw Problem.invalid("url", "must be an http or https URL with a host; got '\(url)'")
        }
        var keys: Set<ChangeKey>? = nil
        if let k = b["keys"] {
            guard case let .array(items) = k else { throw Problem.invalid("keys", "must be an array of keys; got \(k.typeName)") }
            var set = Set<ChangeKey>()
            for item in items {
                guard case let .string(s) = item, let key = ChangeKey(rawValue: s) else {
                    throw Problem.invalid("keys", "each must be one of \(ChangeKey.allCases.map(\.rawValue).joined(separator: ", ")); got \(item.text)")
                }
                set.insert(key)
            }
            keys = set
        }
        let op = try engine.operation(id)
        if op.isFinished { throw Problem.conflict("operation \(id) has finished; it will report no more changes") }
        let hook = try app.webhooks.register(operation: id, queue: op.queue, url: url, keys: keys)
        var o = JSONOut()
        webhookJSON(hook, to: &o)
        let response = json(201, o.bytes, [("Location", "/v1/operations/\(id)/observers/\(hook.id)")])
        // Answered once the registration is committed, like every other 2xx change.
        guard app.sqlite != nil else { return .response(response) }
        let webhooks = app.webhooks, hookID = hook.id
        return .deferred { responder in
            responder.answerBeforeShutdown()
            // Registered already (so no event falls between); durable once this runs.
            webhooks.whenCommitted(hookID) { responder.respond(response) }
        }
    }

    func webhookJSON(_ h: Webhooks.Hook, to o: inout JSONOut) {
        o.open()
        o.key("id"); o.string(h.id)
        o.key("operation"); o.string(h.operation.description)
        o.key("url"); o.string(h.url)
        o.key("keys"); o.openArray()
        for k in (h.keys.map { Array($0) } ?? ChangeKey.allCases).map(\.rawValue).sorted() { o.string(k) }
        o.closeArray()
        o.close()
    }

    // MARK: - events

    func eventFeed(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after", "limit", "wait"])
        let after = UInt64(try q.int("after", in: 0...Int.max) ?? 0)
        let limit = try q.int("limit", in: 1...10_000) ?? 1000
        let wait = try q.seconds("wait", max: 300) ?? 0
        let log = app.events
        let maxBytes = app.configuration.limits.pageBytes - 160
        @Sendable func answer() -> HTTPResponse {
            switch log.page(after: after, limit: limit, maxBytes: maxBytes) {
            case let .gone(oldest):
                return Problem(410, "cursor-expired", "Gone",
                               "events after \(after) are no longer kept; the oldest kept event is \(oldest); restart from after=\(oldest - 1)").response
            case let .events(list, last):
                var o = JSONOut(capacity: 200 * list.count + 64)
                o.open(); o.key("events"); o.openArray()
                for e in list { o.raw(e) }
                o.closeArray()
                o.key("next"); o.int(last)
                o.close()
                return json(200, o.bytes)
            }
        }
        if wait == 0 || log.lastSeq > after { return .response(answer()) }
        return .deferred { responder in
            guard let token = log.wait(after: after, { responder.respond(answer()) }) else { return }
            EngineTimers.queue.asyncAfter(deadline: .now() + wait) {
                log.cancelWait(token)
                responder.respond(answer())
            }
        }
    }

    func eventStream(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after"])
        var start = UInt64(try q.int("after", in: 0...Int.max) ?? 0)
        if q.values["after"] == nil, let last = req.header("last-event-id"), let n = UInt64(last) { start = n }
        let after = start
        let log = app.events
        // `oldestKept` is at least 1; `after + 1` would overflow for a client-given UInt64.max.
        if after < log.oldestKept - 1 && log.lastSeq > 0 {
            throw Problem(410, "cursor-expired", "Gone", "events after \(after) are no longer kept; the oldest kept event is \(log.oldestKept)")
        }
        return .stream(status: 200, headers: [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("Connection", "close")]) { stream in
            if !log.subscribe(stream, after: after) { stream.close() }
        }
    }
}

extension Substring {
    func trimmingCharactersInSpace() -> Substring {
        var s = self
        while s.first == " " { s = s.dropFirst() }
        while s.last == " " { s = s.dropLast() }
        return s
    }
}
