import MicroHTTP
import QueueEngine

/// `/v1/hosts`: the target hosts of `http` operations with their circuit breakers (API.md
/// "Hosts"). An operator holds a host by hand (`open`), releases it (`closed`) or hands it
/// back to the automatic rules (`auto`); changes are acknowledged once durable.
package struct HostsController: Sendable {
    let engine: QueueEngine
    let durability: Durability
    let limits: APILimits

    package func addRoutes(to r: inout Router) {
        r.add("GET", "/v1/hosts", scope: .instance) { req, _ in try list(req) }
        r.add("GET", "/v1/hosts/{host}", scope: .instance) { req, p in try get(req, p[0]) }
        r.add("PATCH", "/v1/hosts/{host}", scope: .instance) { req, p in try patch(req, p[0]) }
    }

    static func etag(_ h: HostSnapshot) -> String {
        let state = BreakerState.allCases.firstIndex(of: h.state) ?? 0
        return "\"h\(ETag.bootNonce)-\(h.revision)-\(h.held)-\(h.consecutiveFailures)-\(state)-\(h.throttledUntil?.nanoseconds ?? 0)\""
    }

    /// Sorted by name, a page at a time: `limit` (default and most 1,000) hosts after `after`,
    /// within `--max-page-bytes`; `next` (a host, for `after`) is null on the last page.
    func list(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after", "limit"])
        let limit = try q.int("limit", in: 1...1000) ?? 1000
        let after = q.values["after"]
        if let a = after, a.utf8.count > 600 { throw Problem.invalid("after", "must be a host from a previous page's next") }
        let all = engine.hosts()
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        var o = JSONOut(capacity: 4096)
        o.open(); o.key("hosts"); o.openArray()
        var count = 0
        var next: String?
        var last: String?
        for s in all where after.map({ s.host > $0 }) ?? true {
            if count == limit { next = last; break }
            let before = o.bytes.count
            s.write(to: &o)
            if count > 0 && o.bytes.count > limits.pageBytes - 64 { o.truncate(to: before); next = last; break }
            for b in Self.etag(s).utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
            last = s.host
            count += 1
        }
        o.closeArray()
        o.key("next")
        if let next { o.string(next) } else { o.null() }
        o.close()
        for b in (next ?? "").utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        let etag = "\"hs\(ETag.bootNonce)-\(count)-\(String(h, radix: 36))\""
        if ETag.matches(req, etag) { return ETag.notModified(etag) }
        return .response(json(200, o.bytes, [("ETag", etag)]))
    }

    func get(_ req: HTTPRequest, _ raw: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let h = try engine.host(named: try HostName.parse(raw))
        let etag = Self.etag(h)
        if ETag.matches(req, etag) { return ETag.notModified(etag) }
        return .response(json(200, h.json, [("ETag", etag)]))
    }

    /// `{"breaker": "open" | "closed" | "auto", "until"?, "reason"?}`.
    func patch(_ req: HTTPRequest, _ raw: String) throws -> HTTPHandlerResult {
        _ = try Query(req, allowed: [])
        let name = try HostName.parse(raw)
        let b = try Body(req, allowed: ["breaker", "until", "reason"])
        let breaker: BreakerState?
        switch b["breaker"] {
        case .string("open")?: breaker = .open
        case .string("closed")?: breaker = .closed
        case .string("auto")?: breaker = nil
        case nil: throw Problem.invalid("breaker", "is required: one of open, closed, auto")
        case let v?: throw Problem.invalid("breaker", "must be one of open, closed, auto; got \(shown(v.text))")
        }
        var until: Timestamp?
        if let u = b["until"], u != .null {
            guard breaker != nil else { throw Problem.invalid("until", "applies to open or closed; auto has no end") }
            let t = try parseTime(u, field: "until")
            guard t > SystemClock().now() else { throw Problem.invalid("until", "must be in the future") }
            until = t
        }
        let reason = try b.string("reason", maxLength: HostManual.maxReasonLength)
        if reason != nil && breaker == nil { throw Problem.invalid("reason", "applies to open or closed") }
        let h = try engine.setHost(name, breaker: breaker, until: until, reason: reason)
        return durability.ack(json(200, h.json, [("ETag", Self.etag(h))]))
    }
}

/// A host as the API names it: `host:port`, lowercase, the port always written; an IPv6
/// address in brackets. A path may carry it percent-encoded.
package enum HostName {
    static let rule = "host:port (e.g. api.example.com:443 or [::1]:8080; the port from 1 to 65535)"

    package static func parse(_ raw: String) throws(Problem) -> String {
        guard raw.utf8.count <= 600, let decoded = percentDecoded(raw) else {
            throw Problem.invalid("host", "must be \(rule)")
        }
        let s = decoded.lowercased()
        guard let colon = s.lastIndex(of: ":") else { throw Problem.invalid("host", "must be \(rule); the port is missing") }
        let host = s[..<colon]
        let port = s[s.index(after: colon)...]
        guard !port.isEmpty, port.count <= 5, port.allSatisfy({ $0.isASCII && $0.isNumber }), let p = Int(port), (1...65535).contains(p) else {
            throw Problem.invalid("host", "must be \(rule); the port is not a number from 1 to 65535")
        }
        if host.hasPrefix("[") {
            guard host.hasSuffix("]"), host.count > 2, host.count <= 64,
                host.dropFirst().dropLast().allSatisfy({ $0.isASCII && ($0.isHexDigit || $0 == ":" || $0 == ".") })
            else { throw Problem.invalid("host", "must be \(rule); an IPv6 address goes in brackets") }
        } else {
            guard !host.isEmpty, host.utf8.count <= 253,
                host.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "-" || $0 == "_") })
            else { throw Problem.invalid("host", "must be \(rule)") }
        }
        return "\(host):\(p)"
    }

    /// `%XX` decoded; nil for a broken escape or bytes that are not UTF-8.
    static func percentDecoded(_ s: String) -> String? {
        guard s.utf8.contains(UInt8(ascii: "%")) else { return s }
        var out: [UInt8] = []
        var it = Array(s.utf8)[...]
        while let c = it.popFirst() {
            guard c == UInt8(ascii: "%") else { out.append(c); continue }
            guard let h = it.popFirst(), let l = it.popFirst(), let hi = hex(h), let lo = hex(l) else { return nil }
            out.append(hi << 4 | lo)
        }
        return String(validating: out, as: UTF8.self)
    }

    private static func hex(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

extension HostSnapshot {
    /// `{"host", "state", "held", "consecutiveFailures", "trips", "openedAt"?, "until"?,
    /// "throttledUntil"?, "lastError"?, "manual"?}`: optional fields are left out without a value.
    func write(to o: inout JSONOut) {
        o.open()
        o.key("host"); o.string(host)
        o.key("state"); o.string(state.rawValue)
        o.key("held"); o.int(held)
        o.key("consecutiveFailures"); o.int(consecutiveFailures)
        o.key("trips"); o.int(trips)
        if let t = openedAt { o.key("openedAt"); o.time(t) }
        if let t = until { o.key("until"); o.time(t) }
        if let t = throttledUntil { o.key("throttledUntil"); o.time(t) }
        if let e = lastError { o.key("lastError"); o.value(e) }
        if let m = manual {
            o.key("manual")
            o.open()
            o.key("breaker"); o.string(m.breaker.rawValue)
            if let t = m.until { o.key("until"); o.time(t) }
            if let r = m.reason { o.key("reason"); o.string(r) }
            o.close()
        }
        o.close()
    }

    var json: [UInt8] {
        var o = JSONOut(capacity: 384)
        write(to: &o)
        return o.bytes
    }
}
