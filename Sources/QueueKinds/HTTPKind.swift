import Dispatch
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import QueueEngine
import Locking
import Synchronization

/// `http` `{"method", "url", "headers"?, "body"?, "expectStatus"?, "timeout"?}`: one HTTP(S)
/// request.
///
/// The request is made with FoundationNetworking's `URLSession` (libcurl underneath) rather
/// than AsyncHTTPClient: AHC pulls in SwiftNIO and its SSL stack, which adds minutes to every
/// clean CI build, while `URLSession` ships with the toolchain. One ephemeral session (no
/// cookies, no cache) serves every operation; its delegate streams the body so at most
/// ``bodyCap`` bytes are kept however large the response is.
///
/// - Redirects are followed (the `URLSession` default), at most ``maxRedirects`` in a row and
///   only to `http`/`https` URLs; the result describes the last response.
/// - `timeout` (default 30 s) bounds the whole request including redirects and the body.
/// - Cancel aborts the request in flight (`task.cancel()`) and reports at once. Pause aborts
///   it without reporting; the following resume sends the request again from the start.
///
/// The result is `{"status", "headers", "body", "bodyEncoding", "size", "truncated"}`; `body`
/// is the first ``bodyCap`` bytes, as text when they are UTF-8, else base64. A status outside
/// `expectStatus` (default `["2xx"]`) fails with `http-status` and the same object as `data`.
/// Transport failures have the types `timeout`, `connection-refused`, `dns`, `tls`, `network`
/// and `invalid-response`.
public final class HTTPKind: OperationKind {
    /// How many body bytes a result keeps (64 KiB).
    public static let bodyCap = 64 * 1024
    /// Seconds a request may take when the spec gives no `timeout`.
    public static let defaultTimeout = 30.0
    /// Accepted `timeout` range, in seconds.
    public static let timeoutRange = 0.1...3600.0
    /// Redirects followed before the last response is taken as the answer.
    public static let maxRedirects = 10
    /// Accepted methods.
    public static let methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

    private let delegate: HTTPSessionDelegate
    private let session: URLSession
    /// The request in flight per operation.
    private let inFlight = Lock<[OperationID: HTTPExchange]>([:])

    /// Creates the kind with its own URLSession.
    public init() {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        configuration.urlCache = nil
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        configuration.timeoutIntervalForResource = Self.timeoutRange.upperBound + 60
        configuration.httpMaximumConnectionsPerHost = 64
        delegate = HTTPSessionDelegate()
        let delegateQueue = OperationQueue()
        delegateQueue.name = "opqd.http"
        delegateQueue.maxConcurrentOperationCount = 1
        session = URLSession(configuration: configuration, delegate: delegate, delegateQueue: delegateQueue)
    }

    deinit { session.invalidateAndCancel() }

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
        var request = URLRequest(url: spec.url)
        request.httpMethod = spec.method
        // The deadline is our own timer below. URLSession's is only a backstop: corelibs
        // truncates it to whole seconds (0.3 s would time out at once).
        request.timeoutInterval = spec.timeout.rounded(.up) + 1
        for (name, value) in spec.headers { request.addValue(value, forHTTPHeaderField: name) }
        if let body = spec.body {
            request.httpBody = body
            if spec.bodyIsJSON, !spec.headers.contains(where: { $0.0.lowercased() == "content-type" }) {
                request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            }
        }
        let task = session.dataTask(with: request)
        let exchange = HTTPExchange(context: context, spec: spec, task: task)
        let replaced = inFlight.withLock { $0.updateValue(exchange, forKey: context.operation) }
        if let replaced, replaced.claim() { replaced.abort() }
        delegate.register(task.taskIdentifier, exchange)
        exchange.onEnd = { [weak self] in self?.forget($0) }
        // Weak: an exchange that ended is not kept alive (with its body) until the deadline.
        EngineTimers.queue.asyncAfter(deadline: .now() + .nanoseconds(Int(spec.timeout * 1e9))) { [weak self, weak exchange] in
            guard let exchange, exchange.claim() else { return }
            self?.forget(exchange)
            exchange.abort()
            context.finish(.failed(type: "timeout", detail: "no complete answer from \(spec.url.absoluteString) within \(HTTPSpec.format(spec.timeout)) s"))
        }
        task.resume()
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
        let exchange = inFlight.withLock { map -> HTTPExchange? in
            guard let e = map[context.operation], e.context.attempt == context.attempt else { return nil }
            map[context.operation] = nil
            return e
        }
        if let exchange { delegate.unregister(exchange.task.taskIdentifier) }
        return exchange
    }

    private func forget(_ exchange: HTTPExchange) {
        inFlight.withLock { map in
            if map[exchange.context.operation] === exchange { map[exchange.context.operation] = nil }
        }
        delegate.unregister(exchange.task.taskIdentifier)
    }

    static func describe(_ error: EngineError) -> String {
        if case let .invalidArgument(field, detail) = error { return "\(field): \(detail)" }
        return "\(error)"
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
    var url: URL
    var headers: [(String, String)]
    var body: Data?
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
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
              scheme == "http" || scheme == "https", let host = components.host, !host.isEmpty,
              let url = components.url else {
            throw .invalidArgument(field: "spec.url", detail: "must be \(urlRule); got \(u.text)")
        }
        self.url = url

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
                body = Data(s.utf8)
            } else {
                body = Data(b.bytes)
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
                switch item {
                case let .number(n) where n == n.rounded() && n >= 100 && n <= 599:
                    expect.append(.code(Int(n)))
                case let .string(s) where s.count == 3 && s.hasSuffix("xx") && ("1"..."5").contains(String(s.prefix(1))):
                    expect.append(.hundreds(Int(String(s.prefix(1)))!))
                default:
                    throw .invalidArgument(field: "spec.expectStatus[\(i)]", detail: "must be an integer from 100 to 599 or one of \"1xx\" to \"5xx\"; got \(item.text)")
                }
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

    static func format(_ d: Double) -> String { JSONValue.number(d).text }

    /// RFC 9110 `tchar`.
    static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return Array("!#$%&'*+-.^_`|~".utf8).contains(b)
        }
    }
}

// MARK: - one request

/// What a result keeps of a response besides its body.
struct ResponseHead: Sendable {
    var status: Int
    /// Sorted by lower-cased name.
    var headers: [(String, String)]

    init(_ response: HTTPURLResponse) {
        status = response.statusCode
        headers = response.allHeaderFields.map { ("\($0.key)", "\($0.value)") }
        headers.sort { $0.0.lowercased() < $1.0.lowercased() }
    }
}

/// One sending of an operation's request. Exactly one party ends it — the delegate (answer or
/// transport error), the timeout timer, cancel or pause — by winning `claim()`.
final class HTTPExchange: Sendable {
    struct Received: Sendable {
        /// Status and headers of the latest response (a redirect is replaced by its target's).
        var head: ResponseHead?
        var body: [UInt8] = []
        var size = 0
        var redirects = 0
    }

    let context: ExecutionContext
    let spec: HTTPSpec
    let task: URLSessionDataTask
    private let ended = Atomic<Bool>(false)
    private let received = Lock(Received())
    private let endHook = Lock<(@Sendable (HTTPExchange) -> Void)?>(nil)

    init(context: ExecutionContext, spec: HTTPSpec, task: URLSessionDataTask) {
        self.context = context
        self.spec = spec
        self.task = task
    }

    /// Called by the delegate when it ends the exchange.
    var onEnd: (@Sendable (HTTPExchange) -> Void)? {
        get { endHook.withLock { $0 } }
        set { endHook.withLock { $0 = newValue } }
    }

    /// True for the one caller that ends this exchange.
    func claim() -> Bool {
        ended.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
    }

    var isEnded: Bool { ended.load(ordering: .acquiring) }


    /// Stops the transfer; the delegate's completion for it will find the exchange claimed.
    func abort() { task.cancel() }

    func response(_ head: ResponseHead?) {
        received.withLock { $0.head = head; $0.body = []; $0.size = 0 }
    }

    func append(_ data: Data) {
        received.withLock { r in
            r.size += data.count
            let room = HTTPKind.bodyCap - r.body.count
            if room > 0 { r.body.append(contentsOf: data.prefix(room)) }
        }
    }

    /// Counts a redirect; false once too many were followed.
    func redirect() -> Bool {
        received.withLock { r in
            r.redirects += 1
            return r.redirects <= HTTPKind.maxRedirects
        }
    }

    /// The end of the transfer as the delegate saw it, turned into the operation's completion.
    func completion(error: (any Error)?) -> Completion {
        let r = received.withLock { $0 }
        if let error { return Self.failure(error, url: spec.url) }
        guard let head = r.head else {
            return .failed(type: "invalid-response", detail: "\(spec.url.absoluteString) gave no HTTP response")
        }
        let result = Self.result(head, body: r.body, size: r.size)
        let status = head.status
        if spec.expect.contains(where: { $0.matches(status) }) { return .succeeded(result) }
        let expected = JSONValue.array(spec.expect.map(\.json)).text
        return .failed(type: "http-status", detail: "status \(status) is outside expectStatus \(expected)", data: result)
    }

    static func result(_ head: ResponseHead, body: [UInt8], size: Int) -> JSONValue {
        let headers = head.headers.map { ($0.0, JSONValue.string($0.1)) }
        let truncated = size > body.count
        var text: String?
        var kept = body[...]
        if truncated { kept = kept.dropLast(incompleteUTF8Suffix(body)) }
        text = String(validating: kept, as: UTF8.self)
        let (bodyValue, encoding): (String, String) = text.map { ($0, "utf8") } ?? (Data(body).base64EncodedString(), "base64")
        return .object([
            ("status", .number(Double(head.status))),
            ("headers", .object(headers)),
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

    /// Maps a transport error to a failure type. libcurl's TLS failures often arrive as
    /// `URLError.unknown` with an OpenSSL message, so the message is consulted too.
    static func failure(_ error: any Error, url: URL) -> Completion {
        let message = (error as NSError).localizedDescription
        let detail = "\(url.absoluteString): \(message)"
        guard let e = error as? URLError else { return .failed(type: "network", detail: detail) }
        switch e.code {
        case .timedOut:
            return .failed(type: "timeout", detail: detail)
        case .cannotConnectToHost:
            return .failed(type: "connection-refused", detail: detail)
        case .cannotFindHost, .dnsLookupFailed:
            return .failed(type: "dns", detail: detail)
        case .secureConnectionFailed, .serverCertificateHasBadDate, .serverCertificateUntrusted,
             .serverCertificateHasUnknownRoot, .serverCertificateNotYetValid, .clientCertificateRejected,
             .clientCertificateRequired:
            return .failed(type: "tls", detail: detail)
        case .badServerResponse, .cannotParseResponse, .cannotDecodeRawData, .cannotDecodeContentData,
             .httpTooManyRedirects, .redirectToNonExistentLocation:
            return .failed(type: "invalid-response", detail: detail)
        default:
            let lower = message.lowercased()
            if lower.contains("ssl") || lower.contains("tls") || lower.contains("certificate") {
                return .failed(type: "tls", detail: detail)
            }
            return .failed(type: "network", detail: detail)
        }
    }
}

// MARK: - the session delegate

/// Routes URLSession callbacks to the exchange of each task.
final class HTTPSessionDelegate: NSObject, URLSessionDataDelegate, Sendable {
    private let exchanges = Lock<[Int: HTTPExchange]>([:])

    func register(_ task: Int, _ exchange: HTTPExchange) { exchanges.withLock { $0[task] = exchange } }
    func unregister(_ task: Int) { exchanges.withLock { _ = $0.removeValue(forKey: task) } }
    private func exchange(_ task: URLSessionTask) -> HTTPExchange? {
        exchanges.withLock { $0[task.taskIdentifier] }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                    completionHandler: @escaping (URLSession.ResponseDisposition) -> Void) {
        guard let exchange = exchange(dataTask), !exchange.isEnded else {
            completionHandler(.cancel)
            return
        }
        exchange.response((response as? HTTPURLResponse).map(ResponseHead.init))
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        exchange(dataTask)?.append(data)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                    newRequest request: URLRequest, completionHandler: @escaping (URLRequest?) -> Void) {
        let scheme = request.url?.scheme?.lowercased()
        guard let exchange = exchange(task), scheme == "http" || scheme == "https", exchange.redirect() else {
            // Not followed: the redirect response itself becomes the answer.
            completionHandler(nil)
            return
        }
        completionHandler(request)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let exchange = exchanges.withLock({ $0.removeValue(forKey: task.taskIdentifier) }), exchange.claim() else { return }
        exchange.onEnd?(exchange)
        exchange.context.finish(exchange.completion(error: error))
    }
}
