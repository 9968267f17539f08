/// What a handler returns: an answer now, an answer later, or a streamed body.
public enum HTTPHandlerResult: Sendable {
    /// Answer now.
    case response(HTTPResponse)
    /// Answer later without holding a server thread. The closure runs at once on the server thread
    /// (it must not block) and receives the responder; unless it has answered by the time it
    /// returns, the connection is suspended (`MHD_suspend_connection`) until `respond` is called,
    /// from any thread. A suspended connection does not notice its client leaving, so whoever
    /// keeps the responder must answer eventually, e.g. at a deadline.
    case deferred(@Sendable (HTTPResponder) -> Void)
    /// A body of unknown length (chunked on HTTP/1.1), e.g. Server-Sent Events. `start` runs on
    /// the server thread right after the headers are queued and must not block.
    case stream(status: Int, headers: [(String, String)], start: @Sendable (HTTPStream) -> Void)
    /// `result`, reported to the server's `responseObserver` under `route` (e.g. the matched
    /// pattern `/v1/queues/{name}`) when its answer leaves.
    indirect case routed(_ route: String, _ result: HTTPHandlerResult)
}

/// Handles one fully received request. Runs on a server thread: never block it. An error thrown
/// here is answered with its `problem` when it is `ProblemConvertible`; any other error is logged
/// and answered 500 `internal-error`.
public typealias HTTPHandler = @Sendable (HTTPRequest) throws -> HTTPHandlerResult
