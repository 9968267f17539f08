import Dispatch
import Locking
import MicroHTTP

/// A target for `http` operations on 127.0.0.1 whose behaviour a test switches while it runs
/// (API.md "Hosts"): up (200), refusing (its port closed: connections refused; switching back
/// listens on the same port again), 503, slow (answers after a delay), 429 or 503 with a
/// `Retry-After` value, and 404. It counts what reached it, by the mode it was in.
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

    /// Switches behaviour: `refusing` closes the port, any other mode listens again.
    public func set(_ mode: Mode) throws {
        let old: HTTPServer? = state.withLock { s in
            s.mode = mode
            if mode == .refusing { defer { s.server = nil }; return s.server }
            return nil
        }
        old?.shutdown(timeout: .seconds(2))
        if mode != .refusing && state.withLock({ $0.server == nil }) {
            let s = try Self.listen(port: port, state: state)
            state.withLock { $0.server = s }
        }
    }

    /// Requests that reached it, in all.
    public var count: Int { state.withLock { $0.hits.count } }
    /// Arrival times of every request (monotonic seconds).
    public var arrivals: [Double] { state.withLock { $0.hits } }

    public func stop() {
        let s = state.withLock { st -> HTTPServer? in
            defer { st.server = nil }
            return st.server
        }
        s?.shutdown(timeout: .seconds(2))
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
