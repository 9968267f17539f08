/// Per-request state across MHD's several access-handler calls (headers, each body chunk, final).
///
/// Created in the URI log callback (`Unmanaged.passRetained`, stored as MHD's `con_cls`) and
/// released in `NOTIFY_COMPLETED`. Only the connection's own server thread touches it, so it
/// needs no lock; what other threads may reach (responder, stream) has its own.
final class RequestContext {
    enum Phase {
        /// Next call is the first one: headers are complete.
        case headers
        /// Receiving the body; a call without data is the final one.
        case body
        /// Deferred: waiting for the responder (the connection is suspended meanwhile).
        case waiting
        /// A response is queued.
        case done
    }

    var phase = Phase.headers
    /// The path as sent (from the raw request target), without the query string.
    let path: String
    var headers: [String: String] = [:]
    var body: [UInt8] = []
    /// Body bytes received so far, including any discarded after the limit was passed.
    var received = 0
    var tooLarge = false
    var responder: HTTPResponder?
    var stream: HTTPStream?

    init(path: String) {
        self.path = path
    }
}
