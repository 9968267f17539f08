import Dispatch
import Foundation
import Locking
import Synchronization
// The kit (closedPort, waitUntil) for every file of this target.
@_exported import TestKit

#if canImport(Glibc)
import Glibc
#endif

/// An HTTP target on 127.0.0.1 whose answers are scripted per path, bytes and all, so it can
/// misbehave the ways a hostile target would: the kit's `RawServer` with a route table.
final class HostileServer: Sendable {
    /// What a route does with the connection: gets the request (head and body), writes bytes.
    typealias Route = @Sendable (_ request: ReceivedRequest, _ out: Connection) -> Void

    /// Used only on the connection's own thread.
    struct Connection: @unchecked Sendable {
        let raw: RawConnection
        let server: RawServer
        var fd: Int32 { raw.fd }
        /// Writes bytes; false when the peer is gone or the server stops.
        @discardableResult
        func write(_ bytes: [UInt8]) -> Bool { raw.send(bytes) && !server.isStopping }
        @discardableResult
        func write(_ text: String) -> Bool { write(Array(text.utf8)) }
    }

    private let server: RawServer
    private let seen: Lock<[ReceivedRequest]>

    var port: UInt16 { UInt16(server.port) }
    var base: String { server.base }
    var isStopping: Bool { server.isStopping }
    /// Requests received so far, in order.
    var requests: [ReceivedRequest] { seen.value }

    init(_ routes: [String: Route]) throws {
        let seen = Lock<[ReceivedRequest]>([])
        self.seen = seen
        // No 100 Continue: a hostile target does not help the client along.
        server = try RawServer { connection, server in
            guard let request = try? connection.readRequest(answeringContinue: false) else { return }
            seen.withLock { $0.append(request) }
            let out = Connection(raw: connection, server: server)
            if let route = routes[request.pathWithoutQuery] {
                route(request, out)
            } else {
                out.write("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            }
        }
    }

    func stop() { server.stop() }
}

/// A whole response with Content-Length and `Connection: close`.
func reply(_ status: Int, _ headers: [(String, String)] = [], body: String = "") -> String {
    var out = "HTTP/1.1 \(status) X\r\nConnection: close\r\nContent-Length: \(body.utf8.count)\r\n"
    for (k, v) in headers { out += "\(k): \(v)\r\n" }
    return out + "\r\n" + body
}

func now() -> Double { monotonicSeconds() }
