import OutboundHTTP
import QueueEngine

// MARK: - spec parsing

/// A status (`404`) or a class (`"4xx"`) accepted by `expectStatus`.
enum StatusMatch: Sendable, Equatable {
    case code(Int)
    case hundreds(Int)

    func matches(_ status: Int) -> Bool {
        switch self {
        case let .code(c): return status == c
        case let .hundreds(h): return status / 100 == h
        }
    }

    /// Reads one `expectStatus` entry: an integral number 100-599, or `"Nxx"` with N 1-5,
    /// judged on Unicode scalars (`"1\u{301}xx"` is 4 scalars, not a class). Nil otherwise.
    init?(_ item: JSONValue) {
        switch item {
        case let .number(n):
            guard n.isFinite, n == n.rounded(), n >= 100, n <= 599, let code = Int(exactly: n) else { return nil }
            self = .code(code)
        case let .string(s):
            let scalars = Array(s.unicodeScalars)
            guard scalars.count == 3, scalars[1] == "x", scalars[2] == "x",
                ("1"..."5").contains(scalars[0])
            else { return nil }
            self = .hundreds(Int(scalars[0].value) - 0x30)
        default:
            return nil
        }
    }

    var json: JSONValue {
        switch self {
        case let .code(c): return .number(Double(c))
        case let .hundreds(h): return .string("\(h)xx")
        }
    }
}

/// A checked `http` spec.
struct HTTPSpec: Sendable {
    var method: String
    var url: String
    /// The breaker's name for the URL's target (``HTTPKind/hostKey(_:)``); nil: untracked.
    var host: String?
    var headers: [(String, String)]
    /// The body as given: a string is sent as its UTF-8, any other value as JSON text. Encoded
    /// when the request is built, not at every check (`host(spec:)` checks under the engine's lock).
    var body: JSONValue?
    var expect: [StatusMatch]
    var timeout: Double

    static let fields = ["method", "url", "headers", "body", "expectStatus", "timeout"]

    init(_ spec: JSONValue?) throws(EngineError) {
        let shape = "{\"method\", \"url\", \"headers\"?, \"body\"?, \"expectStatus\"?, \"timeout\"?}"
        let spec = try specObject(spec, kind: "http", shape: shape, fields: Self.fields)

        // The list is joined only for a message: this check runs on every insert (`host(spec:)`).
        guard let m = spec["method"] else {
            throw .invalidArgument(field: "spec.method", detail: "is required: one of \(HTTPKind.methods.joined(separator: " "))")
        }
        guard case let .string(method) = m, HTTPKind.methods.contains(method) else {
            throw .invalidArgument(field: "spec.method", detail: "must be one of \(HTTPKind.methods.joined(separator: " ")) (upper case); got \(m.text)")
        }
        self.method = method

        let urlRule = "an absolute http:// or https:// URL with a host"
        guard let u = spec["url"] else { throw .invalidArgument(field: "spec.url", detail: "is required: \(urlRule)") }
        guard case let .string(text) = u else { throw .invalidArgument(field: "spec.url", detail: "must be \(urlRule); got \(u.typeName)") }
        switch OutboundURL.check(text) {
        case let .success(parts):
            url = parts.url
            host = HTTPKind.hostKey(parts)
        case let .failure(e): throw .invalidArgument(field: "spec.url", detail: "must be \(urlRule); got \(u.text) (\(e.detail))")
        }

        headers = []
        if let h = spec["headers"] {
            guard case let .object(pairs) = h else {
                throw .invalidArgument(field: "spec.headers", detail: "must be an object of strings {\"Name\": \"value\"}; got \(h.typeName)")
            }
            for (name, value) in pairs {
                guard !name.isEmpty, name.utf8.allSatisfy(Self.isTokenByte) else {
                    throw .invalidArgument(field: "spec.headers", detail: "header name \(JSONValue.string(name).text) is not a valid HTTP token")
                }
                guard case let .string(v) = value else {
                    throw .invalidArgument(field: "spec.headers.\(name)", detail: "must be a string; got \(value.typeName)")
                }
                guard !v.utf8.contains(where: { $0 == 0x0A || $0 == 0x0D || $0 == 0 }) else {
                    throw .invalidArgument(field: "spec.headers.\(name)", detail: "must not contain CR, LF or NUL")
                }
                headers.append((name, v))
            }
        }

        body = spec["body"]
        if body != nil {
            guard method != "GET" && method != "HEAD" else {
                throw .invalidArgument(field: "spec.body", detail: "a body is not sent with \(method); use POST, PUT, PATCH, DELETE or OPTIONS")
            }
        }

        let expectRule = "an array of status codes (100-599) and/or classes like \"2xx\""
        if let e = spec["expectStatus"] {
            guard case let .array(items) = e, !items.isEmpty else {
                throw .invalidArgument(field: "spec.expectStatus", detail: "must be a non-empty \(expectRule); got \(e.text)")
            }
            var expect: [StatusMatch] = []
            for (i, item) in items.enumerated() {
                guard let match = StatusMatch(item) else {
                    throw .invalidArgument(
                        field: "spec.expectStatus[\(i)]", detail: "must be an integer from 100 to 599 or one of \"1xx\" to \"5xx\"; got \(item.text)")
                }
                expect.append(match)
            }
            self.expect = expect
        } else {
            expect = [.hundreds(2)]
        }

        timeout = HTTPKind.defaultTimeout
        if let t = spec["timeout"] {
            timeout = try Self.timeout(t, field: "spec.timeout")
        }
    }

    /// Checks a `timeout` member: seconds within ``HTTPKind/timeoutRange``.
    static func timeout(_ t: JSONValue, field: String) throws(EngineError) -> Double {
        let r = HTTPKind.timeoutRange
        guard case let .number(s) = t, r.contains(s) else {
            throw .invalidArgument(field: field, detail: "must be a number of seconds from \(format(r.lowerBound)) to \(format(r.upperBound)); got \(t.text)")
        }
        return s
    }

    /// The request for the client, with `Content-Type: application/json` for a JSON body
    /// unless the spec names a Content-Type.
    var request: OutboundRequest {
        var headers = self.headers
        var bytes: [UInt8]?
        switch body {
        case nil:
            bytes = nil
        case let .string(s)?:
            bytes = Array(s.utf8)
        case let json?:
            bytes = Array(json.bytes)
            if !headers.contains(where: { $0.0.lowercased() == "content-type" }) { headers.append(("Content-Type", "application/json")) }
        }
        return OutboundRequest(
            method: method, url: url, headers: headers, body: bytes, timeout: timeout,
            maxResponseBytes: HTTPKind.bodyCap, maxHeaderBytes: HTTPKind.maxHeaderBytes)
    }

    static func format(_ d: Double) -> String { JSONValue.number(d).text }

    /// RFC 9110 `tchar`.
    static func isTokenByte(_ b: UInt8) -> Bool { HTTPSyntax.isTokenByte(b) }
}
