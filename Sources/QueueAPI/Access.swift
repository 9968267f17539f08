import Logging
import MicroHTTP

/// Who may call what (API.md "Who may call"): `--token` for everything, `--read-token` for
/// GET/HEAD, nothing for the open routes. Decided on the route that matched, never on a raw-path
/// prefix, and on the request head, before the body is read.
package struct Access: Sendable {
    package init(token: String?, readToken: String?) {
        self.token = token
        self.readToken = readToken
    }

    let token: String?
    let readToken: String?

    /// The credentials a request presents, compared in constant time.
    enum Credential { case none, full, read }

    func credential(_ request: HTTPRequest) -> Credential {
        guard let token else { return .full }
        guard let presented = Self.bearer(request) else { return .none }
        // Both comparisons always run, so the time taken says nothing about which matched.
        let full = Self.constantTimeEquals(presented, Array(token.utf8))
        let read = readToken.map { Self.constantTimeEquals(presented, Array($0.utf8)) } ?? false
        return full ? .full : read ? .read : .none
    }

    /// The token of `Authorization: Bearer <token>` (scheme case-insensitive, RFC 7235).
    static func bearer(_ request: HTTPRequest) -> ArraySlice<UInt8>? {
        guard let header = request.header("authorization") else { return nil }
        let bytes = Array(header.utf8)
        guard bytes.count > 7 else { return nil }
        let scheme = bytes[0..<6].map { $0 | 0x20 }
        guard scheme == Array("bearer".utf8), bytes[6] == 0x20 else { return nil }
        var token = bytes[7...]
        while token.first == 0x20 { token = token.dropFirst() }
        while token.last == 0x20 || token.last == 0x09 { token = token.dropLast() }
        return token.isEmpty ? nil : token
    }

    /// True when equal; the time depends only on the length of `expected`.
    static func constantTimeEquals(_ given: ArraySlice<UInt8>, _ expected: [UInt8]) -> Bool {
        var diff = UInt(bitPattern: given.count ^ expected.count)
        let base = given.startIndex
        for i in 0..<expected.count {
            let g: UInt8 = i < given.count ? given[base + i] : 0
            diff |= UInt(g ^ expected[i])
        }
        return diff == 0
    }

    static let unauthorized = Problem(
        401, "unauthorized", "Unauthorized",
        "this server needs an Authorization: Bearer <token> header (only GET /healthz, GET /readyz and the dashboard page at GET / are open)",
        headers: [("WWW-Authenticate", "Bearer realm=\"opqd\"")])

    /// 400 for a target that is not an absolute path, 401/403 for a missing, wrong or read-only
    /// token on the route `match` found for it; nil when the request may go on. Run on the head
    /// (before the body is read) and again in `APIDispatcher.handle`.
    /// `match` is evaluated only when a token is configured: without one, the head check costs
    /// no route match.
    package func refusal(_ request: HTTPRequest, match: @autoclosure () -> Router.Match) -> Problem? {
        // `x/v1/queues`, `*`, `http://host/...`: the router must never guess what was meant.
        guard request.path.utf8.first == UInt8(ascii: "/") else {
            return Problem(400, "bad-request-target", "Bad Request", "the request target must be an absolute path such as /v1/queues")
        }
        guard token != nil else { return nil }
        // Decided on the route that matched: unknown paths and other methods need a token too,
        // so nothing about the API is told to a caller without one.
        let access: RouteAccess
        switch match() {
        case let .found(route, _): access = route.access
        case .methodNotAllowed(_, open: true): access = .open
        case .methodNotAllowed, .notFound: access = .read
        }
        guard access != .open else { return nil }
        switch credential(request) {
        case .none:
            return Self.unauthorized
        case .read where access == .write || !(request.method == "GET" || request.method == "HEAD"):
            return Problem(
                403, "read-only-token", "Forbidden",
                "the read-only token may make GET and HEAD requests only; \(request.method) \(request.path) needs the full token")
        case .read, .full:
            return nil
        }
    }

    package static func isLoopback(_ host: String) -> Bool {
        host.hasPrefix("127.") || host == "localhost" || host == "::1"
    }
}

/// The server's handler: routing, access, the handlers, and the one place where a thrown error
/// becomes its answer. Built complete before the server exists.
package struct APIDispatcher: Sendable {
    package init(router: Router, access: Access, log: @escaping @Sendable (_ request: HTTPRequest, _ error: any Error) -> Void) {
        self.router = router
        self.access = access
        self.log = log
    }

    let router: Router
    let access: Access
    let log: @Sendable (_ request: HTTPRequest, _ error: any Error) -> Void

    /// The `log` of every dispatcher: an error no handler turned into an answer (a 500).
    package static func logFailures(_ logger: Logger) -> @Sendable (_ request: HTTPRequest, _ error: any Error) -> Void {
        { request, error in
            logger.error("handler failed", metadata: ["request.id": "\(request.id)", "path": "\(request.path)", "error": "\(error)"])
        }
    }

    /// The target and token checks of `handle`, on the head alone (before the body is read).
    package func refusal(_ head: HTTPRequest) -> HeadRefusal? {
        access.refusal(head, match: router.match(method: head.method, path: head.path)).map { HeadRefusal($0.response, route: Router.unmatched) }
    }

    package func handle(_ request: HTTPRequest) -> HTTPHandlerResult {
        // One route match serves both the access decision and the handler.
        let match = router.match(method: request.method, path: request.path)
        if let refused = access.refusal(request, match: match) { return .routed(Router.unmatched, .response(refused.response)) }
        switch match {
        case let .found(route, params):
            do {
                return .routed(route.label, try route.handler(request, params))
            } catch {
                if !(error is any ProblemConvertible) { log(request, error) }
                return .routed(route.label, .response(Problem.from(error, requestID: request.id).response))
            }
        case let .methodNotAllowed(allowed, _):
            let list = allowed.joined(separator: ", ")
            return .routed(
                Router.unmatched,
                .response(
                    Problem(
                        405, "method-not-allowed", "Method Not Allowed",
                        "\(request.method) is not allowed on \(request.path); allowed: \(list)",
                        headers: [("Allow", list)]
                    ).response))
        case .notFound:
            return .routed(Router.unmatched, .response(Problem.notFound("no route for \(request.path)").response))
        }
    }
}
