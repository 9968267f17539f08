import MicroHTTP

/// Path parameters in the order the pattern names them.
package struct Params {
    package let values: [Substring]
    package subscript(_ i: Int) -> String { String(values[i]) }
}

package typealias RouteHandler = @Sendable (HTTPRequest, Params) throws -> HTTPHandlerResult

/// Who may call a route when tokens are configured (API.md "Who may call").
package enum RouteAccess: Sendable {
    /// No token needed: liveness and readiness.
    case open
    /// The read token is enough (GET/HEAD).
    case read
    /// Only the full token.
    case write
}

/// Which queues a request on a route touches: what a cluster decides where to answer it by
/// (`ClusterFront`), read from the route table itself. Every route declares one (`Router.add`),
/// so a route cannot be added without saying where a cluster answers it.
package enum RouteScope: Sendable {
    /// How a read of a queue this instance does not serve is answered.
    package enum Reads: Sendable {
        /// By the queue's holder, forwarded there like a change.
        case atHolder
        /// Here, from what the holder committed to the shared store (`FollowerReads`, which has
        /// the same route): it keeps answering while the queue moves.
        case fromStore
    }

    /// No queue, or this instance's own view: answered here (health, metrics, the feed, the page).
    case instance
    /// Every queue, as committed: answered from the shared store (`FollowerReads`).
    case everyQueue
    /// What every instance holds in memory (the leases of `GET /v1/workers`): in a cluster the
    /// same request is answered by every live instance and `merge` makes one answer of theirs
    /// (nil: they could not be merged). A single instance answers alone.
    case everyInstance(merge: @Sendable ([HTTPResponse]) -> HTTPResponse?)
    /// The queue named by path parameter `param`.
    case queue(param: Int, reads: Reads = .atHolder)
    /// The queue of the operation whose id is path parameter `param`. `into`: the body's member
    /// naming the queue the request writes into (a copy's target); that queue's holder answers
    /// when it is not the operation's.
    case operation(param: Int, reads: Reads = .atHolder, into: String? = nil)
    /// The queue named by the body's member `member` (a queue being created).
    case queueInBody(member: String)
    /// The queues named by member `member` of each element of the body's list `list`: one
    /// instance must serve them all (one commit); `what` names them when they are not.
    case queuesInBody(list: String, member: String, what: String)
    /// The operations whose ids are member `member` of each element of the body's list `list`,
    /// each element answered on its own: the request is split among their queues' holders.
    /// `valid`: whether the request is well formed as a whole; one that is not is answered
    /// here, whole, and never split.
    case operationsInBody(list: String, member: String, valid: @Sendable (HTTPRequest) -> Bool)
}

/// A small table router: `/v1/queues/{name}` style patterns, 404 for unknown paths and
/// 405 with `Allow` for a known path with another method.
package struct Router: Sendable {
    package init() {}

    package struct Route: Sendable {
        let method: String
        /// As added, e.g. `/v1/queues/{name}`.
        let pattern: String
        /// `GET /v1/queues/{name}`: what `/metrics` counts its answers under.
        let label: String
        let segments: [String?]  // nil = parameter
        let access: RouteAccess
        /// Which queues it touches (`RouteScope`).
        package let scope: RouteScope
        let handler: RouteHandler
    }
    private(set) var routes: [Route] = []
    /// The metrics label of answers no route made (404, 405, a refused token or target).
    package static let unmatched = "- unmatched"

    /// Adds a route. Access defaults to `.read` for GET and `.write` for anything else; the
    /// scope has no default (`RouteScope`).
    package mutating func add(
        _ method: String, _ pattern: String, scope: RouteScope, access: RouteAccess? = nil, _ handler: @escaping RouteHandler
    ) {
        // Split as `match` splits a path, so `/` is one empty segment and matches only `/`.
        let segs = pattern.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map { s -> String? in
            s.hasPrefix("{") ? nil : String(s)
        }
        routes.append(
            Route(
                method: method, pattern: pattern, label: method + " " + pattern, segments: segs, access: access ?? (method == "GET" ? .read : .write),
                scope: scope, handler: handler))
    }

    package enum Match {
        case found(Route, Params)
        /// The path exists with other methods; `open` when every route on it is `.open` (then
        /// a caller without a token may be told 405: it learns nothing the open routes do not).
        case methodNotAllowed([String], open: Bool)
        case notFound
    }

    /// Matches an absolute path (the caller refuses anything else before routing).
    package func match(method: String, path: String) -> Match {
        guard path.utf8.first == UInt8(ascii: "/") else { return .notFound }
        let parts = Self.segments(path).dropFirst()
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

    /// `path` split at every `/`, empty pieces kept: what `path.split(separator: "/",
    /// omittingEmptySubsequences: false)` gives. That split walks Characters (grapheme breaking),
    /// which made it most of the cost of routing a request; an ASCII path, which every API path
    /// is, has one Character per byte, so its bytes are split instead, with the same result.
    /// Any other path is split by Characters as before (a `/` followed by a combining mark is
    /// one Character there, and no separator).
    static func segments(_ path: String) -> [Substring] {
        let bytes = path.utf8
        var ascii = true
        var slashes = 0
        for byte in bytes {
            ascii = ascii && byte < 0x80
            if byte == UInt8(ascii: "/") { slashes += 1 }
        }
        guard ascii else { return path.split(separator: "/", omittingEmptySubsequences: false) }
        var parts: [Substring] = []
        parts.reserveCapacity(slashes + 1)
        var start = bytes.startIndex
        var i = start
        while i < bytes.endIndex {
            if bytes[i] == UInt8(ascii: "/") {
                parts.append(path[start..<i])
                start = bytes.index(after: i)
            }
            i = bytes.index(after: i)
        }
        parts.append(path[start..<bytes.endIndex])
        return parts
    }
}
