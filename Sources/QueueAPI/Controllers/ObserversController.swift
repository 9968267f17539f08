import MicroHTTP
import OutboundHTTP
import QueueEngine

/// Webhook observers of one operation: register, list, read, delete.
struct ObserversController: Sendable {
    let engine: QueueEngine
    let webhooks: Webhooks

    func addRoutes(to r: inout Router) {
        r.add("POST", "/v1/operations/{id}/observers") { req, p in try add(req, p[0]) }
        r.add("GET", "/v1/operations/{id}/observers") { req, p in try list(req, p[0]) }
        r.add("GET", "/v1/operations/{id}/observers/{observer}") { req, p in try get(req, p[0], p[1]) }
        r.add("DELETE", "/v1/operations/{id}/observers/{observer}") { req, p in try delete(req, p[0], p[1]) }
    }

    func add(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
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
        let hook = try webhooks.register(operation: id, queue: op.queue, url: url, keys: keys)
        var o = JSONOut()
        Self.write(hook, to: &o)
        let response = json(201, o.bytes, [("Location", "/v1/operations/\(id)/observers/\(hook.id)")])
        let (webhooks, hookID) = (self.webhooks, hook.id)
        // Answered once the registration is committed, like every other 2xx change.
        return .deferred { responder in
            responder.answerBeforeShutdown()
            // Registered already (so no event falls between); durable once this runs.
            webhooks.whenCommitted(hookID) { responder.respond(response) }
        }
    }

    func list(_ req: HTTPRequest, _ idText: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        _ = try engine.revision(of: id)
        var o = JSONOut()
        o.open(); o.key("observers"); o.openArray()
        for h in webhooks.hooks(of: id) { Self.write(h, to: &o) }
        o.closeArray(); o.close()
        return .response(json(200, o.bytes))
    }

    func get(_ req: HTTPRequest, _ idText: String, _ observer: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        guard let h = webhooks.hook(observer, of: id) else { throw Problem.notFound("no observer '\(observer)' on operation \(idText)") }
        var o = JSONOut()
        Self.write(h, to: &o)
        return .response(json(200, o.bytes))
    }

    func delete(_ req: HTTPRequest, _ idText: String, _ observer: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let id = try parseOperationID(idText)
        guard webhooks.hook(observer, of: id) != nil else { throw Problem.notFound("no observer '\(observer)' on operation \(idText)") }
        let webhooks = self.webhooks
        return .deferred { responder in
            responder.answerBeforeShutdown()
            webhooks.remove(observer) { responder.respond(HTTPResponse(status: 204)) }
        }
    }

    static func write(_ h: Webhooks.Hook, to o: inout JSONOut) {
        o.open()
        o.key("id"); o.string(h.id)
        o.key("operation"); o.string(h.operation.description)
        o.key("url"); o.string(h.url)
        o.key("keys"); o.openArray()
        for k in (h.keys.map { Array($0) } ?? ChangeKey.allCases).map(\.rawValue).sorted() { o.string(k) }
        o.closeArray()
        o.close()
    }
}
