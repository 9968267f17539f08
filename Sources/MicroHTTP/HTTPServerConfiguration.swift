import Foundation

/// Settings of an `HTTPServer`.
public struct HTTPServerConfiguration: Sendable {
    /// IPv4 address to listen on; `"0.0.0.0"` for all interfaces.
    public var host: String = "127.0.0.1"
    /// TCP port; 0 picks a free one (read it back from `HTTPServer.port`).
    public var port: Int = 8080
    /// Number of server threads (each runs its own epoll loop).
    public var threads: Int = ProcessInfo.processInfo.activeProcessorCount
    /// Largest accepted request body; larger ones are answered 413.
    public var maxBodyBytes: Int = 1 << 20
    /// Largest request line plus header fields; larger requests are answered 431.
    public var maxHeaderBytes: Int = 16384
    /// Seconds after which an idle (keep-alive) connection is closed.
    public var connectionTimeout: Int = 30
    /// Maximum number of simultaneous connections.
    public var connectionLimit: Int = 4096
    /// Length of the listen socket's accept queue.
    public var listenBacklog: Int = 1024
    /// An already listening socket to serve instead of binding `host:port`, e.g. one a process
    /// kept open across `execv` so that connections wait in its backlog meanwhile.
    public var listenSocket: Int32? = nil
    /// Binds with `SO_REUSEPORT`, so that `HTTPServer.openSpareListener()` can bind a second
    /// socket to the same port before this server stops (a role change that re-executes the
    /// process). Only sockets of the same user can share the port.
    public var reusePort = false

    /// Creates a configuration; every argument has the default shown on its property.
    public init(
        host: String = "127.0.0.1",
        port: Int = 8080,
        threads: Int = ProcessInfo.processInfo.activeProcessorCount,
        maxBodyBytes: Int = 1 << 20,
        connectionTimeout: Int = 30,
        connectionLimit: Int = 4096,
        listenBacklog: Int = 1024,
        maxHeaderBytes: Int = 16384,
        listenSocket: Int32? = nil,
        reusePort: Bool = false
    ) {
        self.listenSocket = listenSocket
        self.reusePort = reusePort
        self.maxHeaderBytes = maxHeaderBytes
        self.host = host
        self.port = port
        self.threads = threads
        self.maxBodyBytes = maxBodyBytes
        self.connectionTimeout = connectionTimeout
        self.connectionLimit = connectionLimit
        self.listenBacklog = listenBacklog
    }
}

/// Why an `HTTPServer` could not start.
public struct HTTPServerError: Error, CustomStringConvertible, Sendable {
    /// A readable explanation, e.g. `"cannot listen on 127.0.0.1:8080: Address already in use"`.
    public let message: String

    /// Creates an error with a readable message.
    public init(_ message: String) { self.message = message }

    /// The message.
    public var description: String { message }
}
