import CSystem
import Dispatch
import Foundation
import Locking

#if canImport(Glibc)
import Glibc
#endif

/// The kit's one raw-socket server on 127.0.0.1, for test targets that must misbehave (send
/// malformed or endless bytes, hang, cut answers off), which a real HTTP server such as MicroHTTP
/// never does. Every accepted connection gets a thread of its own and is handed to `handler` as a
/// ``RawConnection``; it is closed when the handler returns. Well-formed test servers use
/// MicroHTTP instead (see ``WebhookReceiver``).
public final class RawServer: Sendable {
    public let port: Int
    private let listener: Int32
    private let state = Lock<(stopped: Bool, active: Int)>((false, 0))
    private let acceptDone = DispatchSemaphore(value: 0)

    public var base: String { "http://127.0.0.1:\(port)" }
    public func url(_ path: String) -> String { base + path }
    /// True once `stop` was called: handlers that loop should end.
    public var isStopping: Bool { state.withLock { $0.stopped } }

    /// `timeout`: the accepted connections' send and receive timeout, in seconds.
    public init(timeout: Double = 5, _ handler: @escaping @Sendable (_ connection: RawConnection, _ server: RawServer) -> Void) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestClientError("socket() failed: errno \(errno)") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &address) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                bind(fd, sa, length) == 0 && listen(fd, 64) == 0 && getsockname(fd, sa, &length) == 0
            }
        }
        guard ok else {
            let e = errno
            Glibc.close(fd)
            throw TestClientError("bind/listen on 127.0.0.1 failed: errno \(e)")
        }
        listener = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        Thread.detachNewThread { [self] in
            acceptLoop(timeout: timeout, handler)
        }
    }

    deinit { stop() }

    /// Stops accepting and waits (up to 5 s) for the handlers to return. Idempotent. The
    /// listening descriptor is closed only after the accept thread has left `accept`, so its
    /// number cannot be reused by another socket while that thread might still accept on it.
    public func stop() {
        let first = state.withLock { s -> Bool in
            defer { s.stopped = true }; return !s.stopped
        }
        guard first else { return }
        shutdown(listener, Int32(SHUT_RDWR))
        acceptDone.wait()
        Glibc.close(listener)
        waitUntil(timeout: 5, every: 0.001) { state.withLock { $0.active } == 0 }
    }

    private func acceptLoop(timeout: Double, _ handler: @escaping @Sendable (RawConnection, RawServer) -> Void) {
        defer { acceptDone.signal() }
        while true {
            let client = csystem_accept_cloexec(listener)
            if client < 0 {
                if errno == EINTR { continue }
                return
            }
            let admitted = state.withLock { s -> Bool in
                if !s.stopped { s.active += 1 }
                return !s.stopped
            }
            guard admitted else { Glibc.close(client); return }
            Thread.detachNewThread { [self] in
                let connection = RawConnection(acceptedFD: client, timeout: timeout)
                handler(connection, self)
                connection.close()
                state.withLock { $0.active -= 1 }
            }
        }
    }
}

extension RawConnection {
    /// Reads one request: the request line, the headers, and (when `body`) a body by
    /// Content-Length or chunked, answering `Expect: 100-continue` first when `answeringContinue`.
    public func readRequest(body readsBody: Bool = true, answeringContinue: Bool = true) throws -> ReceivedRequest {
        let line = try readLine()
        let parts = line.split(separator: " ")
        guard parts.count >= 2 else { throw TestClientError("bad request line: \(line.debugDescription)") }
        let h = try readHeaderFields()
        guard readsBody else { return ReceivedRequest(method: String(parts[0]), path: String(parts[1]), headers: h, body: []) }
        if answeringContinue, h["expect"]?.lowercased() == "100-continue" { send("HTTP/1.1 100 Continue\r\n\r\n") }
        let body = try readBody(h, toEOF: false)
        return ReceivedRequest(method: String(parts[0]), path: String(parts[1]), headers: h, body: body)
    }
}
