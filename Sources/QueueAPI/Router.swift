import MicroHTTP

/// Path parameters in the order the pattern names them.
struct Params {
    let values: [Substring]
    subscript(_ i: Int) -> String { String(values[i]) }
}

typealias RouteHandler = @Sendable (HTTPRequest, Params) throws -> HTTPHandlerResult

/// Who may call a route when tokens are configured (API.md "Who may call").
enum RouteAccess: Sendable {
    /// No token needed: liveness and readiness.
    case open
    /// The read token is enough (GET/HEAD).
    case read
    /// Only the full token.
    case write
}

/// A small table router: `/v1/queues/{name}` style patterns, 404 for unknown paths and
/// 405 with `Allow` for a known path with another method.
package struct Router: Sendable {
    struct Route: Sendable {
        let method: String
        /// As added, e.g. `/v1/queues/{name}`.
        let pattern: String
        /// `GET /v1/queues/{name}`: what `/metrics` counts its answers under.
        let label: String
        let segments: [String?]  // nil = parameter
        let access: RouteAccess
        let handler: RouteHandler
    }
    private(set) var routes: [Route] = []
    /// The metrics label of answers no route made (404, 405, a refused token or target).
    static let unmatched = "- unmatched"

    /// Adds a route. Access defaults to `.read` for GET and `.write` for anything else.
    mutating func add(_ method: String, _ pattern: String, access: RouteAccess? = nil, _ handler: @escaping RouteHandler) {
        // Split as `match` splits a path, so `/` is one empty segment and matches only `/`.
        let segs = pattern.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map { s -> String? in
            s.hasPrefix("{") ? nil : String(s)
        }
        routes.append(
            Route(
                method: method, pattern: pattern, label: method + " " + pattern, segments: segs, access: access ?? (method == "GET" ? .read : .write),
                handler: handler))
    }

    enum Match {
        case found(Route, Params)
        /// The path exists with other methods; `open` when every route on it is `.open` (then
        /// a caller without a token may be told 405: it learns nothing the open routes do not).
        case methodNotAllowed([String], open: Bool)
        case notFound
    }

    /// Matches an absolute path (the caller refuses anything else before routing).
    func match(method: String, path: String) -> Match {
        guard path.utf8.first == UInt8(ascii: "/") else { return .notFound }
        let parts = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
        // A trailing slash or empty segment never matches.
        var allowed: [String] = []
        var allOpen = true
        for r in routes where r.segments.count == parts.count {
            var params: [Substring] = []
            var ok = true
            for (seg, part) in zip(r.segments, parts) {
                if let seg {
                    if seg != part { ok = false; break }
                } else {
                    if part.isEmpty { ok = false; break }
                    params.append(part)
                }
            }
            guard ok else { continue }
            if r.method == method || (method == "HEAD" && r.method == "GET") {
                return .found(r, Params(values: params))
            }
            if !allowed.contains(r.method) { allowed.append(r.method) }
            if r.access != .open { allOpen = false }
        }
        return allowed.isEmpty ? .notFound : .methodNotAllowed(allowed, open: allOpen)
    }
}
