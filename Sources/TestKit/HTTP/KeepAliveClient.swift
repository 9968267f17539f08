/// A keep-alive HTTP/1.1 client: one ``RawConnection`` reused across requests (no
/// `Connection: close`), opened again when the server closed it. For floods in tests and the
/// benchmarks' clients. Not thread-safe: one per thread.
public final class KeepAliveClient {
    public let port: Int
    private let timeout: Double
    private let retries: Int
    private var connection: RawConnection?

    /// `retries`: how many times a request that failed (send, receive, a reset) is sent again on
    /// a new connection. A benchmark passes 0, so every failure counts.
    public init(port: Int, timeout: Double = 20, retries: Int = 1) {
        self.port = port
        self.timeout = timeout
        self.retries = retries
    }

    deinit { close() }

    /// Opens the connection now (e.g. before a benchmark's clock starts) unless it is open.
    public func connect() throws {
        if connection == nil { connection = try RawConnection(port: port, timeout: timeout) }
    }

    /// One request; `body` goes out as `application/json` unless `headers` name a Content-Type.
    /// A POST, PUT or PATCH without a body says `Content-Length: 0`.
    public func request(_ method: String, _ target: String, body: [UInt8]? = nil, headers: [String: String] = [:]) throws -> TestResponse {
        var fields = headers.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
        if body != nil, !headers.keys.contains(where: { $0.lowercased() == "content-type" }) {
            fields.append(("Content-Type", "application/json"))
        }
        if body == nil, ["POST", "PUT", "PATCH"].contains(method) { fields.append(("Content-Length", "0")) }
        var attempt = 0
        while true {
            try connect()
            guard let c = connection else { throw TestClientError("no connection to 127.0.0.1:\(port)") }
            do {
                let r = try c.request(method, target, headers: fields, body: body)
                if r.headers["connection"]?.lowercased() == "close" { close() }
                return r
            } catch {
                close()
                attempt += 1
                if attempt > retries { throw error }
            }
        }
    }

    public func close() {
        connection?.close()
        connection = nil
    }
}
