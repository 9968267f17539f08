import Locking
import OutboundHTTP
import QueueEngine

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

    /// `host:port` of the spec's URL, lowercase, the port always written (API.md "Hosts"):
    /// what its circuit breaker is keyed by (see ``hostKey(_:)``). The URL is read as the request
    /// will read it. Nil for an invalid spec: it is never sent, so its end says nothing about a
    /// host (`verdict` gives nil for it too). Total on any input.
    public func host(spec: JSONValue?) -> String? {
        (try? HTTPSpec(spec))?.host
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
            let completion = Self.completion(spec, result)
            if let verdict = Self.verdict(spec, result, now: Self.unixNow()) {
                context.finish(completion, host: verdict)
            } else {
                context.finish(completion)
            }
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
}
