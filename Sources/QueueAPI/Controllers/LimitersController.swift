import MicroHTTP
import QueueEngine

/// `/v1/limiters`: limiters shared by any number of queues, with budgets per key (API.md
/// "Flow control"). Changes are acknowledged once durable, like queue settings.
package struct LimitersController: Sendable {
    let engine: QueueEngine
    let durability: Durability
    let limits: APILimits

    static let fields = ["name", "concurrency", "rate", "overrides"]

    package func addRoutes(to r: inout Router) {
        r.add("POST", "/v1/limiters", scope: .instance) { req, _ in try durability.idempotent(req) { try create(req) } }
        r.add("GET", "/v1/limiters", scope: .instance) { req, _ in try list(req) }
        r.add("GET", "/v1/limiters/{name}", scope: .instance) { req, p in try get(req, p[0]) }
        r.add("PATCH", "/v1/limiters/{name}", scope: .instance) { req, p in try patch(req, p[0]) }
        r.add("DELETE", "/v1/limiters/{name}", scope: .instance) { req, p in try delete(req, p[0]) }
        r.add("GET", "/v1/limiters/{name}/keys", scope: .instance) { req, p in try keys(req, p[0]) }
    }

    static func etag(_ l: LimiterSnapshot) -> String {
        "\"m\(l.createdAt.nanoseconds)-\(l.revision)-\(l.running)-\(l.waiting)-\(l.keys)\""
    }

    func create(_ req: HTTPRequest) throws -> HTTPResponse {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: Self.fields)
        guard let name = try b.string("name", maxLength: 1000) else {
            throw Problem.invalid("name", "is required: [A-Za-z0-9._-]{1,64}")
        }
        var settings = LimiterSettings()
        if let c = b["concurrency"], c != .null { settings.concurrency = try FlowParsing.concurrency(c, field: "concurrency") }
        if let r = b["rate"], r != .null { settings.rate = try FlowParsing.rate(r, field: "rate") }
        if let o = b["overrides"] { settings.overrides = try FlowParsing.overrides(o) }
        guard settings.concurrency != nil || settings.rate != nil else {
            throw Problem.invalid(
                "concurrency", "a limiter needs at least one of concurrency (\(FlowParsing.concurrencyRule)) and rate (\(FlowParsing.rateRule))")
        }
        let l = try engine.createLimiter(name: name, settings: settings)
        return json(201, l.json, [("Location", "/v1/limiters/\(name)"), ("ETag", Self.etag(l))])
    }

    func list(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let all = try engine.limiters()
        var o = JSONOut(capacity: 256 * all.count + 32)
        o.open(); o.key("limiters"); o.openArray()
        for l in all { l.write(to: &o) }
        o.closeArray(); o.close()
        return .response(json(200, o.bytes))
    }

    func get(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let l = try engine.limiter(named: name)
        let etag = Self.etag(l)
        if ETag.matches(req, etag) { return ETag.notModified(etag) }
        return .response(json(200, l.json, [("ETag", etag)]))
    }

    /// Replaces the fields the body names; `null` removes `concurrency` or `rate` (one of them
    /// must stay).
    func patch(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let b = try Body(req, allowed: ["concurrency", "rate", "overrides"])
        var concurrency: Int?? = nil
        var rate: RateLimit?? = nil
        if let c = b["concurrency"] { concurrency = c == .null ? .some(nil) : .some(try FlowParsing.concurrency(c, field: "concurrency")) }
        if let r = b["rate"] { rate = r == .null ? .some(nil) : .some(try FlowParsing.rate(r, field: "rate")) }
        let overrides = try b["overrides"].map { v throws(Problem) in try FlowParsing.overrides(v) }
        let l = try engine.updateLimiter(name, concurrency: concurrency, rate: rate, overrides: overrides)
        return durability.ack(json(200, l.json, [("ETag", Self.etag(l))]))
    }

    func delete(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        try engine.deleteLimiter(name)
        return durability.ack(HTTPResponse(status: 204))
    }

    func keys(_ req: HTTPRequest, _ name: String) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after", "limit"])
        let limit = try q.int("limit", in: 1...1000) ?? 100
        if let a = q.values["after"], a.unicodeScalars.count > LimitRef.maxKeyLength {
            throw Problem.invalid("after", "must be a key from a previous page's next (at most \(LimitRef.maxKeyLength) characters)")
        }
        let page = try engine.limiterKeys(name, after: q.values["after"], limit: limit)
        var o = JSONOut(capacity: 128 * page.keys.count + 64)
        o.open(); o.key("keys"); o.openArray()
        for k in page.keys { k.write(to: &o) }
        o.closeArray()
        o.key("next")
        if let n = page.next { o.string(n) } else { o.null() }
        o.close()
        return .response(json(200, o.bytes))
    }
}
