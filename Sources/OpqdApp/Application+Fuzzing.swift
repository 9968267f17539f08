import MicroHTTP
import QueueAPI
import QueueCluster

extension OpqdApplication {
    /// Runs `request` through exactly what the HTTP server calls for a fully received request
    /// (the body limit, then routing, auth, handlers and error mapping), without a connection:
    /// for in-process tests and the `fuzz-request` target. The application need not be started.
    /// `.deferred` and `.stream` results are the caller's to drive, e.g. with
    /// `HTTPResponder.detached()` and `HTTPStream.detached()`.
    package func handleForTesting(_ request: HTTPRequest, declaredBodyBytes: Int? = nil) -> HTTPHandlerResult {
        server.handleDetached(request, declaredBodyBytes: declaredBodyBytes)
    }
}
