import Glibc

/// State of one connection and of the request it is currently serving, across MHD's several
/// access-handler calls per request (headers, each body chunk, final).
///
/// One per connection, reused by each request on it: allocated in `MHD_CONNECTION_NOTIFY_STARTED`
/// (kept in MHD's `socket_context`) and freed in `MHD_CONNECTION_NOTIFY_CLOSED`. Per connection
/// rather than per request because MHD 0.9.75 skips `NOTIFY_COMPLETED` for a request whose client
/// leaves before the access handler's first call, while the close notification always comes.
///
/// Plain memory rather than a class: only the connection's own server thread touches it, so it
/// needs no lock, no reference counting and no dynamic exclusivity checks on the hot path. What
/// other threads may reach (responder, stream) has its own lock.
typealias ConnectionContext = UnsafeMutablePointer<ConnectionState>

struct ConnectionState {
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

    /// True between the request line being parsed and the request completing.
    var requestOpen = false
    var phase = Phase.headers
    /// The path as sent (from the raw request target), without the query string.
    var path = ""
    /// Bytes of the whole request target (path and query), for the header-size limit.
    var targetBytes = 0
    var headers: [String: String] = [:]
    var body: [UInt8] = []
    /// Body bytes received so far, including any discarded after the limit was passed.
    var received = 0
    var tooLarge = false
    /// The route the handler named (`HTTPHandlerResult.routed`), for `responseObserver`.
    var route: String?
    var responder: HTTPResponder?
    var stream: HTTPStream?
    /// When the request line arrived (CLOCK_MONOTONIC nanoseconds), for the answer's latency.
    var arrived: UInt64 = 0

    static func allocate() -> ConnectionContext {
        let context = ConnectionContext.allocate(capacity: 1)
        context.initialize(to: ConnectionState())
        return context
    }

    static func free(_ context: ConnectionContext) {
        context.deinitialize(count: 1)
        context.deallocate()
    }

    mutating func beginRequest(path: String, targetBytes: Int) {
        requestOpen = true
        phase = .headers
        self.path = path
        self.targetBytes = targetBytes
        received = 0
        tooLarge = false
        route = nil
        arrived = monotonicNanos()
    }

    /// Time since the request line arrived.
    func elapsed() -> Duration {
        let now = monotonicNanos()
        return .nanoseconds(Int64(truncatingIfNeeded: now &- min(arrived, now)))
    }
}

/// CLOCK_MONOTONIC in nanoseconds (a vDSO call: tens of nanoseconds, no system call).
@inline(__always)
func monotonicNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(truncatingIfNeeded: ts.tv_sec) &* 1_000_000_000 &+ UInt64(truncatingIfNeeded: ts.tv_nsec)
}
