import Dispatch
import Locking
import MicroHTTP

#if canImport(Glibc)
import Glibc
#endif

/// A target for `http` operations on 127.0.0.1 whose behaviour a test switches while it runs
/// (API.md "Hosts"): up (200), refusing (its port closed: connections refused; switching back
/// listens on the same port again), 503, slow (answers after a delay), 429 or 503 with a
/// `Retry-After` value, and 404. It counts what reached it, by the mode it was in.
///
/// While refusing, the port stays this target's: a socket bound to it that does not listen, so
/// connections get a reset (refused) and no other test's server can take the port meanwhile.
public final class SwitchableTarget: @unchecked Sendable {
    public enum Mode: Sendable, Equatable {
        case up
        case refusing
        case unavailable
        case slow(seconds: Double)
        case tooManyRequests(retryAfter: String?)
        case unavailableRetryAfter(String)
        case notFound
    }

    private struct State {
        var mode: Mode = .up
        var server: HTTPServer?
        /// Holds the port while refusing (bound, not listening).
        var holder: Int32 = -1
        var hits: [Double] = []
        var hitModes: [Mode] = []
    }
    private let state = Lock(State())
    public let port: Int

    public var host: String { "127.0.0.1:\(port)" }
    public func url(_ path: String = "/work") -> String { "http://127.0.0.1:\(port)\(path)" }

    public init() throws {
        var p = 0
        let s = try Self.listen(port: 0, state: state)
        p = s.port
        port = p
        state.withLock { $0.server = s }
    }

    deinit { stop() }

    public var mode: Mode { state.withLock { $0.mode } }

    /// Switches behaviour: `refusing` stops listening (the port held), any other mode listens again.
    public func set(_ mode: Mode) throws {
        let old: HTTPServer? = state.withLock { s in
            s.mode = mode
            if mode == .refusing { defer { s.server = nil }; return s.server }
            return nil
        }
        if let old {
            old.shutdown(timeout: .seconds(2))
            let fd = Self.hold(port: port)
            state.withLock { $0.holder = fd }
        }
        if mode != .refusing && state.withLock({ $0.server == nil }) {
            let fd = state.withLock { s -> Int32 in
                defer { s.holder = -1 }
                return s.holder
            }
            if fd >= 0 { close(fd) }
            let s = try Self.listen(port: port, state: state)
            state.withLock { $0.server = s }
        }
    }

    /// A socket bound to 127.0.0.1:`port` that does not listen (-1 if it could not be bound).
    private static func hold(port: Int) -> Int32 {
        for _ in 0..<50 {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var one: Int32 = 1
            _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
            var addr = sockaddr_in()
            addr.sin_family = sa_family_t(AF_INET)
            addr.sin_addr.s_addr = inet_addr("127.0.0.1")
            addr.sin_port = UInt16(port).bigEndian
            let ok = withUnsafePointer(to: &addr) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
            }
            if ok { return fd }
            close(fd)
            usleep(10_000)
        }
        return -1
    }

    /// Requests that reached it, in all.
    public var count: Int { state.withLock { $0.hits.count } }
    /// Arrival times of every request (monotonic seconds).
    public var arrivals: [Double] { state.withLock { $0.hits } }

    public func stop() {
        let (s, fd) = state.withLock { st -> (HTTPServer?, Int32) in
            defer {
                st.server = nil
                st.holder = -1
            }
            return (st.server, st.holder)
        }
        s?.shutdown(timeout: .seconds(2))
        if fd >= 0 { close(fd) }
    }

    private static func listen(port: Int, state: Lock<State>) throws -> HTTPServer {
        let server = HTTPServer(configuration: HTTPServerConfiguration(host: "127.0.0.1", port: port, threads: 2)) { _ in
            let mode = state.withLock { s -> Mode in
                s.hits.append(monotonicSeconds())
                s.hitModes.append(s.mode)
                return s.mode
            }
            func answer(_ status: Int, _ headers: [(String, String)] = []) -> HTTPHandlerResult {
                .response(HTTPResponse(status: status, headers: [("Content-Type", "text/plain")] + headers, body: Array("status \(status)".utf8)))
            }
            switch mode {
            case .up, .refusing: return answer(200)
            case .unavailable: return answer(503)
            case .notFound: return answer(404)
            case let .tooManyRequests(retryAfter): return answer(429, retryAfter.map { [("Retry-After", $0)] } ?? [])
            case let .unavailableRetryAfter(value): return answer(503, [("Retry-After", value)])
            case let .slow(seconds):
                return .deferred { responder in
                    DispatchQueue.global().asyncAfter(deadline: .now() + seconds) {
                        responder.respond(HTTPResponse(status: 200, headers: [("Content-Type", "text/plain")], body: Array("slow".utf8)))
                    }
                }
            }
        }
        try server.start()
        return server
    }
}
