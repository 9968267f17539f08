import Foundation
import Locking
import MicroHTTP

/// A request a test server got.
public struct ReceivedRequest: Sendable {
    public let method: String
    /// The request target as sent (path and query).
    public let path: String
    /// The path without the query.
    public var pathWithoutQuery: String { path.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? path }
    public let headers: TestHeaders
    public let body: [UInt8]
    public var text: String { String(decoding: body, as: UTF8.self) }
    /// The body as a JSON object; empty if it is not one.
    public var object: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:]
    }

    public init(method: String, path: String, headers: TestHeaders, body: [UInt8]) {
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
    }

    init(_ request: HTTPRequest) {
        method = request.method
        path = request.path
        headers = TestHeaders(request.headers.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
        body = request.body
    }
}

/// The far end of a webhook: a MicroHTTP server on 127.0.0.1 that records every request and
/// answers `200` with an empty body (MicroHTTP speaks HTTP/1.1 well-formed, 100-continue included).
public final class WebhookReceiver: Sendable {
    private let server: HTTPServer
    private let received = Lock<[ReceivedRequest]>([])
    public let port: Int

    public var url: String { "http://127.0.0.1:\(port)/hook" }

    /// `status` picks each answer's status from the request (and how many came before it);
    /// every request is recorded, whatever it is answered.
    public init(status: @escaping @Sendable (_ request: ReceivedRequest, _ index: Int) -> Int = { _, _ in 200 }) throws {
        let received = self.received
        server = HTTPServer(configuration: HTTPServerConfiguration(host: "127.0.0.1", port: 0, threads: 2)) { request in
            let r = ReceivedRequest(request)
            let index = received.withLock { list in
                list.append(r); return list.count - 1
            }
            return .response(HTTPResponse(status: status(r, index)))
        }
        try server.start()
        port = server.port
    }

    deinit { close() }

    /// Stops listening (idempotent).
    public func close() { server.shutdown(timeout: .seconds(1)) }

    /// Everything received so far.
    public var requests: [ReceivedRequest] { received.withLock { $0 } }

    /// Waits until `condition` holds for the received requests, or `timeout`.
    public func waitFor(timeout: Double = 5, _ condition: ([ReceivedRequest]) -> Bool) async -> Bool {
        await eventually(timeout: timeout) { condition(requests) }
    }
}
