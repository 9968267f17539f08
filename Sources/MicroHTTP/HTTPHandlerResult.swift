/// What a handler returns: an answer now, an answer later, or a streamed body.
public enum HTTPHandlerResult: Sendable {
    /// Answer now.
    case response(HTTPResponse)
    /// Answer later without holding a server thread: the connection is suspended and the closure
    /// receives the responder (it runs on the server thread, so it must not block; calling
    /// `respond` from inside it is fine). Whoever keeps the responder must eventually answer,
    /// e.g. at a deadline, because a suspended connection does not notice its client leaving.
    case deferred(@Sendable (HTTPResponder) -> Void)
    /// A body of unknown length (chunked on HTTP/1.1), e.g. Server-Sent Events. `start` runs on
    /// the server thread right after the headers are queued and must not block.
    case stream(status: Int, headers: [(String, String)], start: @Sendable (HTTPStream) -> Void)
}

/// Handles one fully received request. Runs on a server thread: never block it; an error thrown
/// here is logged and answered with a generic 500 `application/problem+json`.
public typealias HTTPHandler = @Sendable (HTTPRequest) throws -> HTTPHandlerResult
