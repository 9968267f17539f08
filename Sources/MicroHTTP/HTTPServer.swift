/// A small HTTP/1.1 server on libmicrohttpd: a pool of epoll threads calls `handler` for every
/// fully received request.
///
/// The handler runs on a server thread and must not block it: long polls use
/// `HTTPHandlerResult.deferred`, event streams `HTTPHandlerResult.stream`. Once started it runs
/// until `shutdown`, even if this object is released.
/// A request refused on its head alone (`headCheck`): its answer, and the route the
/// `responseObserver` is told (nil: counted as the server's own).
public struct HeadRefusal: Sendable {
    public var response: HTTPResponse
    public var route: String?
    public init(_ response: HTTPResponse, route: String? = nil) {
        self.response = response
        self.route = route
    }
}

public final class HTTPServer: Sendable {
    let core: ServerCore

    /// Creates a server; nothing listens until `start()`. `log` receives the server's own
    /// messages from any thread; `level` is a swift-log level name: `"error"` (a handler threw, a
    /// response could not be queued), `"warning"`, `"notice"` (libmicrohttpd's messages, mostly
    /// about misbehaving clients) or `"info"` (started, stopped). `responseObserver` is told the
    /// status of every answer as it leaves (deferred ones when they are answered), with the route the
    /// handler named through `HTTPHandlerResult.routed` (nil for the server's own answers: 413,
    /// 431, 400, 503 while stopping, a head check's refusal) and the time from the request line's
    /// arrival until the answer was queued for sending (a stream: its head), e.g. for metrics.
    /// It runs on a server thread for every request: keep it cheap.
    /// `headCheck` sees each request's method, path and headers before its body is read; a
    /// response it returns is sent at once (e.g. 401 for a missing token) and the body skipped.
    public init(
        configuration: HTTPServerConfiguration,
        handler: @escaping HTTPHandler,
        log: @escaping @Sendable (_ level: String, _ message: String) -> Void = { _, _ in },
        responseObserver: (@Sendable (_ route: String?, _ status: Int, _ duration: Duration) -> Void)? = nil,
        headCheck: (@Sendable (_ head: HTTPRequest) -> HeadRefusal?)? = nil
    ) {
        core = ServerCore(
            configuration: configuration, handler: handler, log: log, responseObserver: responseObserver,
            headCheck: headCheck)
    }

    /// Binds and starts serving. Throws `HTTPServerError` (e.g. when the port is in use, the host
    /// is not an IPv4 address, or the server was already started).
    public func start() throws {
        try core.start()
    }

    /// Connections open now, idle keep-alive ones included.
    public var openConnections: Int {
        core.openConnections.load(ordering: .relaxed)
    }

    /// Requests whose request line has arrived and that have not completed (answered and sent,
    /// or their client gone); held long polls and open streams included.
    public var requestsInFlight: Int {
        core.inFlight.load(ordering: .relaxed)
    }

    /// The bound port once started (the real one when the configuration asked for port 0); 0 before.
    public var port: Int {
        core.boundPort.load(ordering: .acquiring)
    }

    /// A second socket listening on the same address and port, for the next image of a process
    /// that re-executes itself (pass it as `HTTPServerConfiguration.listenSocket`): requires
    /// `reusePort`. Nil when it cannot be made.
    public func openSpareListener() -> Int32? { core.openSpareListener() }

    /// Graceful stop: answers new requests 503 at once (the listen socket stays open until the
    /// end), answers every pending deferred request with 503 `application/problem+json` except
    /// those marked `answerBeforeShutdown()`, closes every stream, waits until in-flight requests
    /// are done or `timeout` passes, answers what is still pending 503, then closes every
    /// connection. Idempotent; blocks the calling thread.
    /// Do not call it from a handler (it waits for the server threads).
    public func shutdown(timeout: Duration = .seconds(8)) {
        core.shutdown(timeout: timeout)
    }
}
