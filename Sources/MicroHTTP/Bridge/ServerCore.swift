internal import CMicroHTTPD
import Glibc
import Locking
import Synchronization

/// The server behind `HTTPServer`: owns the MHD daemon and everything its callbacks reach.
///
/// MHD gets this object as the context of its callbacks (an unmanaged pointer); `start()` retains
/// it for the daemon and `shutdown` releases it after `MHD_stop_daemon` returns, so no callback can
/// outlive it.
final class ServerCore: Sendable {
    enum Lifecycle {
        case idle
        case running(MHDDaemon)
        case stopped
    }

    /// Deferred requests and streams in progress, for shutdown to answer and close.
    struct Registry {
        var stopping = false
        var responders: [ObjectIdentifier: HTTPResponder] = [:]
        var streams: [ObjectIdentifier: HTTPStream] = [:]
    }

    let configuration: HTTPServerConfiguration
    let handler: HTTPHandler
    let log: @Sendable (String, String) -> Void
    let maxBodyBytes: Int
    let maxHeaderBytes: Int
    /// Told the route, status and latency of every answer that leaves (complete responses and
    /// stream heads).
    let responseObserver: (@Sendable (String?, Int, Duration) -> Void)?
    /// Asked once the head is in (method, path, headers; no query, no body): a response answers
    /// at once and the body is never read.
    let headCheck: (@Sendable (HTTPRequest) -> HeadRefusal?)?
    /// After the limit we keep reading (and discarding) a chunked body this far so the client
    /// can get its 413 (MHD cannot queue a response while body data is being delivered); past
    /// it the connection is dropped.
    let discardLimit: Int

    let boundPort = Atomic<Int>(0)
    let lastRequestID = Atomic<UInt64>(0)
    /// Requests whose line has been parsed and that have not completed yet.
    let inFlight = Atomic<Int>(0)
    /// Connections open now (MHD_OPTION_NOTIFY_CONNECTION started minus closed).
    let openConnections = Atomic<Int>(0)
    /// Set when shutdown starts: requests that arrive from then on are answered 503 at once
    /// (this replaces MHD_quiesce_daemon, see `shutdown`).
    let refusing = Atomic<Bool>(false)
    let lifecycle = Lock<Lifecycle>(.idle)
    let registry = Lock<Registry>(Registry())
    /// Messages MHD logged while `start()` runs, to explain a failure.
    let startupMessages = Lock<[String]?>(nil)

    init(
        configuration: HTTPServerConfiguration,
        handler: @escaping HTTPHandler,
        log: @escaping @Sendable (String, String) -> Void,
        responseObserver: (@Sendable (String?, Int, Duration) -> Void)? = nil,
        headCheck: (@Sendable (HTTPRequest) -> HeadRefusal?)? = nil
    ) {
        self.headCheck = headCheck
        self.configuration = configuration
        self.handler = handler
        self.log = log
        self.responseObserver = responseObserver
        maxHeaderBytes = max(256, configuration.maxHeaderBytes)
        maxBodyBytes = max(0, configuration.maxBodyBytes)
        // Saturating: `maxBodyBytes` near Int.max must not trap here.
        discardLimit = maxBodyBytes.addingReportingOverflow(16 << 20).overflow ? Int.max : maxBodyBytes + 16 << 20
    }

    // MARK: Start and stop

    func start() throws {
        let config = configuration
        try lifecycle.withLock { (lifecycle: inout Lifecycle) throws(HTTPServerError) in
            guard case .idle = lifecycle else {
                throw HTTPServerError("the HTTP server was already started")
            }
            guard (0...65535).contains(config.port) else {
                throw HTTPServerError("invalid port \(config.port): it must be 0...65535")
            }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = in_port_t(UInt16(config.port).bigEndian)
            guard inet_pton(AF_INET, config.host, &address.sin_addr) == 1 else {
                throw HTTPServerError("invalid host \"\(config.host)\": expected an IPv4 address such as 0.0.0.0")
            }

            // SO_REUSEPORT would let a second server (another opqd started on the same port by
            // mistake) share the port silently: a plain bind first must find it free.
            if config.reusePort && config.listenSocket == nil && config.port != 0 {
                let probe = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                if probe >= 0 {
                    defer { close(probe) }
                    // SO_REUSEADDR as MHD's own socket has: connections of a previous run in
                    // TIME_WAIT do not count, a listening socket does.
                    var one: Int32 = 1
                    _ = setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
                    let free = withUnsafePointer(to: &address) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(probe, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
                    }
                    if !free { throw HTTPServerError("cannot listen on \(config.host):\(config.port): Address already in use") }
                }
            }
            // EPOLL_INTERNAL_THREAD implies INTERNAL_POLLING_THREAD; ALLOW_SUSPEND_RESUME brings the
            // inter-thread channel that MHD_resume_connection needs.
            let flags =
                MHD_USE_EPOLL_INTERNAL_THREAD.rawValue | MHD_ALLOW_SUSPEND_RESUME.rawValue
                | MHD_USE_ERROR_LOG.rawValue
            let context = Unmanaged.passRetained(self).toOpaque()
            startupMessages.withLock { $0 = [] }
            let daemon = withUnsafeMutablePointer(to: &address) { address in
                var options: [MHD_OptionItem] = [
                    option(.THREAD_POOL_SIZE, max(1, config.threads)),
                    option(.CONNECTION_TIMEOUT, max(0, config.connectionTimeout)),
                    option(.CONNECTION_LIMIT, max(1, config.connectionLimit)),
                    // MHD answers an HTML 431 itself when the header fields do not fit its
                    // per-connection pool; sized so our own limit (a problem+json 431) comes first,
                    // also for a few hundred short lines (MHD keeps ~50 bytes of bookkeeping for
                    // each); many more tiny lines get MHD's own 431. Large pools are mmap'ed by
                    // MHD: pages a connection never touches cost nothing.
                    option(.CONNECTION_MEMORY_LIMIT, max(32 * 1024, min(max(256, config.maxHeaderBytes), 1 << 20) * 4 + 32 * 1024)),
                    option(.LISTEN_BACKLOG_SIZE, max(1, config.listenBacklog)),
                    config.listenSocket.map { option(.LISTEN_SOCKET, Int($0)) } ?? option(.SOCK_ADDR, pointer: UnsafeMutableRawPointer(address)),
                    // Two-pointer options: the function goes in `value`, its context in `ptr_value`.
                    option(
                        .NOTIFY_CONNECTION, unsafeBitCast(Callbacks.connectionChanged, to: Int.self),
                        pointer: context),
                    option(
                        .URI_LOG_CALLBACK, unsafeBitCast(Callbacks.requestStarted, to: Int.self),
                        pointer: context),
                    option(
                        .NOTIFY_COMPLETED, unsafeBitCast(Callbacks.requestCompleted, to: Int.self),
                        pointer: context),
                    option(.END),
                ]
                // Only to ask for SO_REUSEPORT: a 0 here would also turn off MHD's default
                // SO_REUSEADDR, and a restart on the same port would wait out TIME_WAIT.
                if config.reusePort { options.insert(option(.LISTENING_ADDRESS_REUSE, 1), at: options.count - 1) }
                return options.withUnsafeMutableBufferPointer { options in
                    CMicroHTTPD_start_daemon(
                        flags, UInt16(config.port), Callbacks.access, context, Callbacks.log, context,
                        options.baseAddress)
                }
            }
            let messages = startupMessages.withLock { messages in
                defer { messages = nil }
                return messages ?? []
            }
            guard let daemon else {
                Unmanaged<ServerCore>.fromOpaque(context).release()
                let reason = messages.last ?? "libmicrohttpd could not start"
                throw HTTPServerError("cannot listen on \(config.host):\(config.port): \(reason)")
            }
            boundPort.store(Int(CMicroHTTPD_daemon_bind_port(daemon)), ordering: .releasing)
            if let fd = config.listenSocket, boundPort.load(ordering: .acquiring) == 0 {
                var bound = sockaddr_in()
                var length = socklen_t(MemoryLayout<sockaddr_in>.size)
                let ok = withUnsafeMutablePointer(to: &bound) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) == 0 }
                }
                if ok { boundPort.store(Int(UInt16(bigEndian: bound.sin_port)), ordering: .releasing) }
            }
            lifecycle = .running(MHDDaemon(raw: daemon))
        }
        log("info", "listening on \(config.host):\(port) with \(max(1, config.threads)) threads")
    }

    private var port: Int { boundPort.load(ordering: .acquiring) }

    /// A second socket listening on this server's address and port (`SO_REUSEPORT`: the server
    /// must have been started with `reusePort`), close-on-exec clear; nil with errno's reason
    /// logged when it cannot be made. The server's own socket is shut down when it stops, so a
    /// process that re-executes itself hands this one over instead: connections that arrive
    /// after the server stopped wait in its backlog for the next image.
    func openSpareListener() -> Int32? {
        let port = boundPort.load(ordering: .acquiring)
        guard port > 0 else { return nil }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        var one: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(truncatingIfNeeded: port).bigEndian)
        guard inet_pton(AF_INET, configuration.host, &address.sin_addr) == 1 else {
            close(fd)
            return nil
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, Int32(max(1, min(configuration.listenBacklog, 65535)))) == 0 else {
            log("error", "cannot open a second listening socket on port \(port): errno \(errno)")
            close(fd)
            return nil
        }
        return fd
    }

    func shutdown(timeout: Duration) {
        // The lock is held throughout so that a concurrent second call returns only once stopped.
        lifecycle.withLock { lifecycle in
            guard case .running(let daemon) = lifecycle else {
                lifecycle = .stopped
                return
            }
            lifecycle = .stopped
            // No MHD_quiesce_daemon: with the epoll thread pool it races the workers, which
            // also take the listen socket out of their epoll sets once quiesced, and the loser
            // aborts the process ("Failed to remove listen FD from epoll set"; seen twice under
            // ThreadSanitizer). New connections in the short drain below are still accepted;
            // their requests get 503 at once (`refusing`), so in-flight work drains.
            // MHD_stop_daemon closes the listen socket itself.
            // From now on a request whose headers arrive is answered 503 (it changes nothing),
            // so the in-flight count drains even under steady load.
            refusing.store(true, ordering: .releasing)
            let (responders, streams) = registry.withLock { registry in
                registry.stopping = true
                return (Array(registry.responders.values), Array(registry.streams.values))
            }
            // Resumes every suspended connection: MHD_stop_daemon panics on a suspended one.
            // `stopping` keeps new deferred requests and streams from suspending from now on.
            for responder in responders { responder.respondUnlessKept(.shuttingDown) }
            for stream in streams { stream.close() }

            // Idle keep-alive connections stay open until they time out, so "in flight" is counted
            // per request; either count reaching zero means nothing is left to finish.
            let clock = ContinuousClock()
            let deadline = clock.now.advanced(by: timeout)
            // (MHD does not count suspended connections, so only our own count tells whether an
            // answer waiting for a commit is still out.)
            while inFlight.load(ordering: .acquiring) > 0, clock.now < deadline {
                usleep(2_000)
            }
            // Whatever is still pending at the deadline is answered now, and given a moment to go
            // out: MHD_stop_daemon aborts the process if it meets a suspended connection.
            let late = registry.withLock { Array($0.responders.values) }
            for responder in late { responder.respond(.shuttingDown) }
            let grace = clock.now.advanced(by: .seconds(1))
            while !late.isEmpty, registry.withLock({ !$0.responders.isEmpty }), clock.now < grace {
                usleep(2_000)
            }
            let unfinished = inFlight.load(ordering: .acquiring)
            if unfinished > 0 {
                log("warning", "closing \(unfinished) unfinished requests at the shutdown deadline")
            }
            MHD_stop_daemon(daemon.raw)
            Unmanaged.passUnretained(self).release()
            log("info", "stopped")
        }
    }

    // MARK: Registry

    func register(_ responder: HTTPResponder, force: Bool = false) -> Bool {
        registry.withLock { registry in
            guard !registry.stopping || force else { return false }
            registry.responders[ObjectIdentifier(responder)] = responder
            return true
        }
    }

    func register(_ stream: HTTPStream) -> Bool {
        registry.withLock { registry in
            guard !registry.stopping else { return false }
            registry.streams[ObjectIdentifier(stream)] = stream
            return true
        }
    }

    func unregister(responder: HTTPResponder?, stream: HTTPStream?) {
        registry.withLock { registry in
            if let responder { registry.responders[ObjectIdentifier(responder)] = nil }
            if let stream { registry.streams[ObjectIdentifier(stream)] = nil }
        }
    }

    /// An MHD log line: explains a failed start, and goes to the log in any case. Once running,
    /// MHD mostly reports what clients did (reset connections, malformed requests): `notice`.
    func mhdLogged(_ message: String) {
        let starting = startupMessages.withLock { messages in
            guard messages != nil else { return false }
            messages!.append(message)
            return true
        }
        log(starting ? "error" : "notice", "libmicrohttpd: \(message)")
    }
}

/// The daemon handle. `@unchecked Sendable`: MHD's daemon calls used here (info, stop) are
/// made from one thread at a time, under `ServerCore.lifecycle`.
struct MHDDaemon: @unchecked Sendable {
    let raw: OpaquePointer
}

private func option(_ option: MHD_OPTION, _ value: Int = 0, pointer: UnsafeMutableRawPointer? = nil) -> MHD_OptionItem {
    MHD_OptionItem(option: option, value: value, ptr_value: pointer)
}
