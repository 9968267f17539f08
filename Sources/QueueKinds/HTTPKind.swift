import Foundation
import OutboundHTTP
import QueueEngine
import Locking
import Synchronization

/// `http` `{"method", "url", "headers"?, "body"?, "expectStatus"?, "timeout"?}`: one HTTP(S)
/// request.
///
/// The request is made with ``OutboundHTTPClient`` (libcurl's multi interface on one thread,
/// see the OutboundHTTP target) rather than FoundationNetworking's `URLSession`, which traps
/// on some redirects (`fatalError("Invalid URL")` for `Location: //[::1]/`), or
/// AsyncHTTPClient, which adds SwiftNIO and minutes to every clean build. Whatever the target
/// answers ends as a result or an error, never a crash.
///
/// - Redirects are followed, at most ``maxRedirects`` in a row and only to `http`/`https`
///   URLs (see `RedirectPolicy`); the result describes the last response.
/// - `timeout` (default 30 s) bounds the whole request including redirects and the body.
/// - At most ``bodyCap`` body bytes are read (then the body is `truncated`) and at most
///   ``maxHeaderBytes`` of headers (more is `invalid-response`).
/// - Cancel aborts the request in flight and reports at once. Pause aborts it without
///   reporting; the following resume sends the request again from the start.
///
/// The result is `{"status", "headers", "body", "bodyEncoding", "size", "truncated"}`; `body`
/// is the first ``bodyCap`` bytes, as text when they are UTF-8, else base64. A status outside
/// `expectStatus` (default `["2xx"]`) fails with `http-status` and the same object as `data`.
/// Transport failures have the types `timeout`, `connection-refused`, `dns`, `tls`, `network`,
/// `too-many-redirects`, `redirect-refused` and `invalid-response`.
public final class HTTPKind: OperationKind {
    /// How many body bytes a result keeps (64 KiB); reading stops there.
    public static let bodyCap = 64 * 1024
    /// Bytes of status line and header lines accepted per response (64 KiB).
    public static let maxHeaderBytes = 64 * 1024
    /// Seconds a request may take when the spec gives no `timeout`.
    public static let defaultTimeout = 30.0
    /// Accepted `timeout` range, in seconds.
    public static let timeoutRange = 0.1...3600.0
    /// Redirects followed; one more fails with `too-many-redirects`.
    public static let maxRedirects = RedirectPolicy.maxRedirects
    /// Accepted methods.
    public static let methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

    private let client: OutboundHTTPClient
    /// The request in flight per operation.
    private let inFlight = Lock<[OperationID: HTTPExchange]>([:])

    /// Creates the kind with its own client (one thread).
    public init() {
        client = OutboundHTTPClient()
    }

    // MARK: - spec

    /// Checks method, url, headers, body, expectStatus and timeout; unknown fields are refused.
    public func validate(spec: JSONValue?) throws(EngineError) {
        _ = try HTTPSpec(spec)
    }

    // MARK: - running

    /// Sends the request (again, from the start, when `context.isResume`).
    public func start(_ context: ExecutionContext) {
        let spec: HTTPSpec
        do { spec = try HTTPSpec(context.spec) } catch {
            context.finish(.failed(type: "invalid-spec", detail: Self.describe(error)))
            return
        }
        let exchange = HTTPExchange(context: context)
        let replaced = inFlight.withLock { $0.updateValue(exchange, forKey: context.operation) }
        if let replaced, replaced.claim() { replaced.abort() }
        let task = client.send(spec.request) { [weak self] result in
            guard exchange.claim() else { return }
            self?.forget(exchange)
            context.finish(Self.completion(spec, result))
        }
        exchange.attach(task)
    }

    /// Aborts the request in flight and reports `cancelled` at once.
    public func cancel(_ context: ExecutionContext) {
        if let exchange = take(context), exchange.claim() {
            exchange.abort()
        }
        context.finish(.failed(type: "cancelled", detail: "request aborted"))
    }

    /// Aborts the request in flight without reporting; the resume sends it again.
    public func pause(_ context: ExecutionContext) {
        if let exchange = take(context), exchange.claim() {
            exchange.abort()
        }
    }

    /// Removes and returns the exchange of this run (same attempt) of the operation.
    private func take(_ context: ExecutionContext) -> HTTPExchange? {
        inFlight.withLock { map -> HTTPExchange? in
            guard let e = map[context.operation], e.context.attempt == context.attempt else { return nil }
            map[context.operation] = nil
            return e
        }
    }

    private func forget(_ exchange: HTTPExchange) {
        inFlight.withLock { map in
            if map[exchange.context.operation] === exchange { map[exchange.context.operation] = nil }
        }
    }

    static func describe(_ error: EngineError) -> String {
        if case let .invalidArgument(field, detail) = error { return "\(field): \(detail)" }
        return "\(error)"
    }

    /// What an operation with `spec` reports for `outcome`, the end of its request: the
    /// result, `http-status` outside `expectStatus`, or the transport error. An invalid spec
    /// gives `invalid-spec`. Total on any input (the fuzz target feeds it arbitrary ones).
    public static func completion(spec: JSONValue?, outcome: Result<OutboundResponse, OutboundError>) -> Completion {
        do {
            return completion(try HTTPSpec(spec), outcome)
        } catch {
            return .failed(type: "invalid-spec", detail: describe(error))
        }
    }

    static func completion(_ spec: HTTPSpec, _ outcome: Result<OutboundResponse, OutboundError>) -> Completion {
        switch outcome {
        case let .failure(error):
            // The spec's URL was checked with the same rules, so this is a client-side refusal.
            let type = error.type == "invalid-url" ? "invalid-spec" : error.type
            return .failed(type: type, detail: error.detail)
        case let .success(response):
            let result = HTTPResult.json(response)
            let status = response.status
            if spec.expect.contains(where: { $0.matches(status) }) { return .succeeded(result) }
            let expected = JSONValue.array(spec.expect.map(\.json)).text
            return .failed(type: "http-status", detail: "status \(status) is outside expectStatus \(expected)", data: result)
        }
    }
}

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
                  ("1"..."5").contains(scalars[0]) else { return nil }
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
    var headers: [(String, String)]
    var body: [UInt8]?
    var bodyIsJSON: Bool
    var expect: [StatusMatch]
    var timeout: Double

    static let fields = ["method", "url", "headers", "body", "expectStatus", "timeout"]

    init(_ spec: JSONValue?) throws(EngineError) {
        let shape = "{\"method\", \"url\", \"headers\"?, \"body\"?, \"expectStatus\"?, \"timeout\"?}"
        guard let spec else { throw .invalidArgument(field: "spec", detail: "kind http needs a spec \(shape)") }
        guard case let .object(members) = spec else {
            throw .invalidArgument(field: "spec", detail: "must be an object \(shape); got \(spec.typeName)")
        }
        for (k, _) in members where !Self.fields.contains(k) {
            throw .invalidArgument(field: "spec.\(k)", detail: "unknown field; kind http allows \(Self.fields.joined(separator: ", "))")
        }

        let methods = HTTPKind.methods.joined(separator: " ")
        guard let m = spec["method"] else { throw .invalidArgument(field: "spec.method", detail: "is required: one of \(methods)") }
        guard case let .string(method) = m, HTTPKind.methods.contains(method) else {
            throw .invalidArgument(field: "spec.method", detail: "must be one of \(methods) (upper case); got \(m.text)")
        }
        self.method = method

        let urlRule = "an absolute http:// or https:// URL with a host"
        guard let u = spec["url"] else { throw .invalidArgument(field: "spec.url", detail: "is required: \(urlRule)") }
        guard case let .string(text) = u else { throw .invalidArgument(field: "spec.url", detail: "must be \(urlRule); got \(u.typeName)") }
        switch OutboundURL.check(text) {
        case let .success(parts): url = parts.url
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

        body = nil
        bodyIsJSON = false
        if let b = spec["body"] {
            guard method != "GET" && method != "HEAD" else {
                throw .invalidArgument(field: "spec.body", detail: "a body is not sent with \(method); use POST, PUT, PATCH, DELETE or OPTIONS")
            }
            if case let .string(s) = b {
                body = Array(s.utf8)
            } else {
                body = Array(b.bytes)
                bodyIsJSON = true
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
                    throw .invalidArgument(field: "spec.expectStatus[\(i)]", detail: "must be an integer from 100 to 599 or one of \"1xx\" to \"5xx\"; got \(item.text)")
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
        if body != nil, bodyIsJSON, !headers.contains(where: { $0.0.lowercased() == "content-type" }) {
            headers.append(("Content-Type", "application/json"))
        }
        return OutboundRequest(method: method, url: url, headers: headers, body: body, timeout: timeout,
                               maxResponseBytes: HTTPKind.bodyCap, maxHeaderBytes: HTTPKind.maxHeaderBytes)
    }

    static func format(_ d: Double) -> String { JSONValue.number(d).text }

    /// RFC 9110 `tchar`.
    static func isTokenByte(_ b: UInt8) -> Bool { HTTPSyntax.isTokenByte(b) }
}

// MARK: - one request

/// One sending of an operation's request. Exactly one party ends it — the client's
/// completion, cancel or pause — by winning `claim()`.
final class HTTPExchange: Sendable {
    let context: ExecutionContext
    private let ended = Atomic<Bool>(false)
    private let task = Lock<OutboundTask?>(nil)

    init(context: ExecutionContext) {
        self.context = context
    }

    /// True for the one caller that ends this exchange.
    func claim() -> Bool {
        ended.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
    }

    /// Records the client's task; aborts it at once when the exchange already ended.
    func attach(_ outbound: OutboundTask) {
        task.withLock { $0 = outbound }
        if ended.load(ordering: .acquiring) { outbound.cancel() }
    }

    /// Stops the transfer; the client's completion for it will find the exchange claimed.
    func abort() { task.withLock { $0 }?.cancel() }
}

/// The result object of a response.
enum HTTPResult {
    /// `{"status", "headers", "body", "bodyEncoding", "size", "truncated"}`. Header fields
    /// are sorted by lower-cased name; repeated fields are joined with ", " under the first
    /// spelling of the name. `size` is the bytes received, or the declared Content-Length
    /// when the body was cut and declared longer.
    static func json(_ response: OutboundResponse) -> JSONValue {
        var merged: [(String, String)] = []
        var index: [String: Int] = [:]
        for (name, value) in response.headers {
            let key = name.lowercased()
            if let i = index[key] {
                merged[i].1 += ", " + value
            } else {
                index[key] = merged.count
                merged.append((name, value))
            }
        }
        merged.sort { $0.0.lowercased() < $1.0.lowercased() }
        let body = response.body
        let truncated = response.truncated
        var size = max(response.size, body.count)
        if truncated, let declared = response.contentLength, declared > size { size = declared }
        var kept = body[...]
        if truncated { kept = kept.dropLast(incompleteUTF8Suffix(body)) }
        let text = String(validating: kept, as: UTF8.self)
        let (bodyValue, encoding): (String, String) = text.map { ($0, "utf8") } ?? (Data(body).base64EncodedString(), "base64")
        return .object([
            ("status", .number(Double(response.status))),
            ("headers", .object(merged.map { ($0.0, JSONValue.string($0.1)) })),
            ("body", .string(bodyValue)),
            ("bodyEncoding", .string(encoding)),
            ("size", .number(Double(size))),
            ("truncated", .bool(truncated)),
        ])
    }

    /// How many bytes at the end of `bytes` are an unfinished UTF-8 sequence (cut by the cap).
    static func incompleteUTF8Suffix(_ bytes: [UInt8]) -> Int {
        var i = bytes.count - 1
        var continuation = 0
        while i >= 0, continuation < 3, bytes[i] & 0xC0 == 0x80 { continuation += 1; i -= 1 }
        guard i >= 0 else { return 0 }
        let lead = bytes[i]
        let need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0
        return need > continuation ? continuation + 1 : 0
    }
}
