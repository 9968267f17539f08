import Locking
import TestKit

/// A well-behaved HTTP/1.1 target on 127.0.0.1 that keeps connections alive: it answers every
/// request on a connection until the client closes it (or stays silent for `idle` seconds),
/// and records each request with the number of the connection it came on, so a test sees what
/// the client sent, byte for byte, and whether it reused a connection. The kit's `RawServer`.
final class KeepAliveTarget: Sendable {
    /// A request and the connection (numbered from 1 in accept order) it arrived on.
    struct Seen: Sendable {
        let connection: Int
        let request: ReceivedRequest
    }

    /// Status, extra header fields and body of the answer to a request. A HEAD gets the head
    /// of that answer and no body (RFC 9110 §9.3.2), with the body's Content-Length.
    typealias Answer = @Sendable (ReceivedRequest) -> (status: Int, headers: [(String, String)], body: String)

    private let server: RawServer
    private let seen: Lock<(connections: Int, requests: [Seen])>

    var base: String { server.base }
    /// Requests received so far, in order.
    var requests: [Seen] { seen.value.requests }
    /// Connections accepted so far.
    var connections: Int { seen.value.connections }

    init(idle: Double = 2, _ answer: @escaping Answer) throws {
        let seen = Lock<(connections: Int, requests: [Seen])>((0, []))
        self.seen = seen
        server = try RawServer(timeout: idle) { connection, server in
            let number = seen.withLock { s -> Int in
                s.connections += 1
                return s.connections
            }
            while !server.isStopping, let request = try? connection.readRequest(answeringContinue: true) {
                seen.withLock { $0.requests.append(Seen(connection: number, request: request)) }
                let (status, headers, body) = answer(request)
                var head = "HTTP/1.1 \(status) X\r\nContent-Length: \(body.utf8.count)\r\n"
                for (name, value) in headers { head += "\(name): \(value)\r\n" }
                guard connection.send(head + "\r\n" + (request.method == "HEAD" ? "" : body)) else { return }
            }
        }
    }

    func stop() { server.stop() }
}
