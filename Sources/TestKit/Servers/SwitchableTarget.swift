import Dispatch
import Foundation
import Locking
import MicroHTTP

#if canImport(Glibc)
import Glibc
#endif

/// A target for `http` operations on 127.0.0.1 whose behaviour a test switches while it runs
/// (API.md "Hosts"): up, refusing connections, 503, slow, 429 or 503 with `Retry-After`, 404.
/// Its port stays the same across every mode, so one host (`127.0.0.1:PORT`) goes down and comes
/// back. Every request that reaches it is recorded with the mode it met, its path and the time,
/// so a test can say "nothing reached the target while its host was open".
///
/// Well-formed HTTP comes from MicroHTTP (as ``WebhookReceiver``'s); `refusing` stops that server,
/// so the port has no listener and connections are refused, and any other mode starts a new one
/// on the same port. The port is kept meanwhile by a socket bound to it that never listens
/// (`SO_REUSEADDR` and `SO_REUSEPORT`, as the server's own socket has): without it, an outgoing
/// connection of this process could be given the port as its local one while nothing listens,
/// and the server could not come back on it.
public final class SwitchableTarget: Sendable {
    /// How it answers.
    public enum Mode: Sendable, Hashable, CustomStringConvertible {
        /// `200` `ok`.
        case up
        /// Nothing listens on the port: connections are refused.
        case refusing
        /// `503`, with `Retry-After: retryAfter` when given (seconds or an HTTP date).
        case serviceUnavailable(retryAfter: String?)
        /// `200` `ok`, `seconds` after the request arrived (longer than an operation's `timeout`,
        /// it times out). The connection is held without a server thread.
        case slow(seconds: Double)
        /// `429`, with `Retry-After: retryAfter` when given.
        case tooManyRequests(retryAfter: String?)
        /// `404`.
        case notFound

        public var description: String {
            switch self {
            case .up: "up"
            case .refusing: "refusing"
            case let .serviceUnavailable(r): r.map { "503 Retry-After: \($0)" } ?? "503"
            case let .slow(s): "slow \(s) s"
            case let .tooManyRequests(r): r.map { "429 Retry-After: \($0)" } ?? "429"
            case .notFound: "404"
            }
        }
    }

    /// One request that reached it.
    public struct Hit: Sendable {
        /// The mode it met.
        public let mode: Mode
        /// The request target as sent.
        public let path: String
        /// When it arrived (``monotonicSeconds()``).
        public let at: Double
        /// When it arrived, by the wall clock (to set beside the server's own times).
        public let time: Date
    }

    private struct State {
        var mode: Mode
        var server: HTTPServer?
        var hits: [Hit] = []
        var stopped = false
    }

    private let state: Lock<State>
    /// Bound to the port for the target's whole life, never listening (see the type's comment).
    private let keeper: Int32
    /// The port, the same in every mode.
    public let port: Int

    /// `127.0.0.1:PORT`: the host its operations are held by (API.md "Hosts").
    public var host: String { "127.0.0.1:\(port)" }
    /// `http://127.0.0.1:PORT` + `path`.
    public func url(_ path: String = "/x") -> String { "http://127.0.0.1:\(port)\(path)" }

    /// Starts on a free port of 127.0.0.1 in `mode`.
    public init(_ mode: Mode = .up) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestClientError("socket() failed: errno \(errno)") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in bind(fd, sa, length) == 0 && getsockname(fd, sa, &length) == 0 }
        }
        guard bound else {
            let e = errno
            Glibc.close(fd)
            throw TestClientError("bind on 127.0.0.1 failed: errno \(e)")
        }
        keeper = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        state = Lock(State(mode: .refusing))
        // Should it throw, deinit (every property is set by now) stops it and frees the port.
        try set(mode)
    }

    deinit { stop() }

    /// The mode now.
    public var mode: Mode { state.withLock { $0.mode } }

    /// Switches to `mode`, at once for the next request. Into `refusing`, the server stops
    /// (a slow answer still pending is answered `503` then, and a request arriving during the
    /// stop too); out of it, a new one listens on the same port before this returns.
    public func set(_ mode: Mode) throws {
        let (stopping, starts): (HTTPServer?, Bool) = state.withLock { s in
            guard !s.stopped else { return (nil, false) }
            s.mode = mode
            if mode == .refusing {
                defer { s.server = nil }
                return (s.server, false)
            }
            return (nil, s.server == nil)
        }
        stopping?.shutdown(timeout: .milliseconds(200))
        guard starts else { return }
        let server = makeServer()
        try server.start()
        let stale = state.withLock { s -> HTTPServer? in
            // A stop or a switch to refusing that came meanwhile wins.
            guard !s.stopped, s.mode != .refusing, s.server == nil else { return server }
            s.server = server
            return nil
        }
        stale?.shutdown(timeout: .milliseconds(200))
    }

    /// Stops listening and frees the port (idempotent).
    public func stop() {
        let (first, server) = state.withLock { s -> (Bool, HTTPServer?) in
            defer {
                s.stopped = true
                s.mode = .refusing
                s.server = nil
            }
            return (!s.stopped, s.server)
        }
        server?.shutdown(timeout: .milliseconds(200))
        if first { Glibc.close(keeper) }
    }

    // MARK: - what reached it

    /// Every request that reached it, in arrival order.
    public var hits: [Hit] { state.withLock { $0.hits } }

    /// Requests that reached it: all, or those that met `mode`, or whose path is `path`.
    public func count(_ mode: Mode? = nil, path: String? = nil) -> Int {
        state.withLock { s in
            s.hits.reduce(0) { n, h in
                (mode == nil || h.mode == mode) && (path == nil || h.path == path) ? n + 1 : n
            }
        }
    }

    /// Requests that reached it so far.
    public var count: Int { state.withLock { $0.hits.count } }

    /// When each request arrived (``monotonicSeconds()``), in order.
    public var arrivals: [Double] { state.withLock { $0.hits.map(\.at) } }

    /// Counts of requests by the mode they met, for failure messages.
    public var summary: String {
        let hits = self.hits
        var order: [Mode] = []
        var counts: [Mode: Int] = [:]
        for h in hits {
            if counts[h.mode] == nil { order.append(h.mode) }
            counts[h.mode, default: 0] += 1
        }
        return order.isEmpty ? "no requests" : order.map { "\(counts[$0] ?? 0) × \($0)" }.joined(separator: ", ")
    }

    /// `date` as an HTTP date (IMF-fixdate, RFC 9110 §5.6.7), e.g. for `Retry-After`.
    public static func httpDate(_ date: Date) -> String {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "GMT")
        f.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return f.string(from: date)
    }

    // MARK: - the server

    private func makeServer() -> HTTPServer {
        let state = self.state
        let configuration = HTTPServerConfiguration(host: "127.0.0.1", port: port, threads: 2, reusePort: true)
        return HTTPServer(configuration: configuration) { request in
            let mode = state.withLock { s -> Mode in
                s.hits.append(Hit(mode: s.mode, path: request.path, at: monotonicSeconds(), time: Date()))
                return s.mode
            }
            if case let .slow(seconds) = mode {
                return .deferred { responder in
                    DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { responder.respond(Self.answer(.up)) }
                }
            }
            return .response(Self.answer(mode))
        }
    }

    /// The answer of `mode`: `200 ok`, or its status with its `Retry-After`.
    private static func answer(_ mode: Mode) -> HTTPResponse {
        func status(_ code: Int, _ retryAfter: String? = nil) -> HTTPResponse {
            HTTPResponse(
                status: code, headers: [("Content-Type", "text/plain")] + (retryAfter.map { [("Retry-After", $0)] } ?? []),
                body: Array((code == 200 ? "ok" : "status \(code)").utf8))
        }
        switch mode {
        case .up, .refusing, .slow: return status(200)
        case let .serviceUnavailable(retryAfter): return status(503, retryAfter)
        case let .tooManyRequests(retryAfter): return status(429, retryAfter)
        case .notFound: return status(404)
        }
    }
}
