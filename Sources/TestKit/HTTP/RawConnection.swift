import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A failure of the test HTTP client: connect, send, receive, timeout or a malformed answer.
public struct TestClientError: Error, CustomStringConvertible, Sendable {
    public let description: String
    /// The errno behind it, when a system call failed.
    public let code: Int32?
    public init(_ description: String, code: Int32? = nil) { self.description = description; self.code = code }
}

/// The kit's raw HTTP/1.1 client: a blocking TCP connection to 127.0.0.1 with send and receive
/// timeouts, so a hung server fails a test instead of hanging it. It sends any bytes (malformed,
/// partial, byte by byte), keeps the connection alive across `request`s or closes it
/// (`Connection: close` heads), and reads answers by Content-Length, chunked or to EOF. Used from
/// one thread at a time (see `onThread`).
public final class RawConnection {
    public let fd: Int32
    /// Received bytes; those before `start` are consumed (dropped in bulk, not per read, so a
    /// benchmark's keep-alive loop does not copy the buffer for every line).
    private var buffer: [UInt8] = []
    private var start = 0
    private var scratch = [UInt8](repeating: 0, count: 65536)
    private var unread: Int { buffer.count - start }
    private var isClosed = false
    /// Bytes received so far.
    public private(set) var bytesReceived = 0
    /// How reading ended, once it did: the peer closed, reset, or the receive timeout passed.
    public private(set) var ending: Ending?
    public enum Ending: String, Sendable { case eof = "EOF", reset = "ECONNRESET", timeout = "timeout" }

    /// `receiveBufferBytes` sets `SO_RCVBUF` before connecting (a small window makes a client
    /// that does not read fill the server's buffers quickly).
    public convenience init(port: Int, timeout: Double = 10, receiveBufferBytes: Int? = nil) throws {
        try self.init(host: "127.0.0.1", port: port, timeout: timeout, receiveBufferBytes: receiveBufferBytes)
    }

    /// The same to another IPv4 address than 127.0.0.1 (a test's network namespaces).
    public init(host: String, port: Int, timeout: Double = 10, receiveBufferBytes: Int? = nil) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { isClosed = true; throw TestClientError("socket() failed: errno \(errno)") }
        if let receiveBufferBytes {
            var size = Int32(clamping: receiveBufferBytes)
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var tv = timeval(tv_sec: Int(timeout), tv_usec: Int((timeout - Double(Int(timeout))) * 1e6))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr(host)
        var result: Int32
        repeat {
            result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
        } while result < 0 && errno == EINTR
        guard result == 0 else {
            let e = errno
            // A class whose init throws still runs deinit: mark it closed so the descriptor is
            // not closed twice (the second close could hit a server's reused descriptor; it
            // did, and libmicrohttpd aborted when its listen socket vanished).
            isClosed = true
            Glibc.close(fd)
            throw TestClientError("connect() to \(host):\(port) failed: errno \(e)", code: e)
        }
    }

    /// Takes over an already connected socket (the accepting side of a raw test server).
    public init(acceptedFD fd: Int32, timeout: Double) {
        self.fd = fd
        var tv = timeval(tv_sec: Int(timeout), tv_usec: Int((timeout - Double(Int(timeout))) * 1e6))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close() }

    public func close() {
        if !isClosed {
            isClosed = true
            Glibc.close(fd)
        }
    }

    /// Sends everything; false if the peer closed or reset (never SIGPIPE).
    @discardableResult
    public func send(_ bytes: [UInt8]) -> Bool {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL)) }
            if n <= 0 {
                if n < 0 && errno == EINTR { continue }
                return false
            }
            sent += n
        }
        return true
    }

    @discardableResult
    public func send(_ text: String) -> Bool { send(Array(text.utf8)) }

    /// True when bytes (or EOF) can be read within `milliseconds`.
    public func isReadable(milliseconds: Int32) -> Bool {
        if unread > 0 { return true }
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&p, 1, milliseconds) > 0
    }

    /// Receives more bytes into the buffer; false at EOF (or reset). Throws on timeout.
    private func fill() throws -> Bool {
        if start > 0 && (start == buffer.count || start >= 1 << 16) {
            buffer.removeSubrange(0..<start)
            start = 0
        }
        while true {
            let n = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { ending = .eof; return false }
            if n < 0 {
                let e = errno
                if e == EINTR { continue }
                if e == ECONNRESET { ending = .reset; return false }
                if e == EAGAIN || e == EWOULDBLOCK {
                    ending = .timeout
                    throw TestClientError("timed out waiting for the server's answer", code: e)
                }
                throw TestClientError("recv failed: errno \(e)", code: e)
            }
            bytesReceived += n
            buffer.append(contentsOf: scratch[0..<n])
            return true
        }
    }

    public func readLine() throws -> String {
        var searched = 0
        while true {
            if let index = buffer[(start + searched)...].firstIndex(of: 0x0A) {
                let end = index > start && buffer[index - 1] == 0x0D ? index - 1 : index
                let line = String(decoding: buffer[start..<end], as: UTF8.self)
                start = index + 1
                return line
            }
            searched = unread
            guard try fill() else { throw TestClientError("connection closed while reading a line") }
        }
    }

    public func readBytes(_ count: Int) throws -> [UInt8] {
        while unread < count {
            guard try fill() else { throw TestClientError("connection closed after \(unread) of \(count) bytes") }
        }
        let bytes = Array(buffer[start..<(start + count)])
        start += count
        return bytes
    }

    /// Whatever arrives within `milliseconds` (at most `limit` bytes), plus what was buffered;
    /// `eof` is true when the peer closed (or reset). Never throws on a timeout.
    public func readAvailable(milliseconds: Int32, limit: Int = 1 << 20) -> (bytes: [UInt8], eof: Bool) {
        var eof = false
        let deadline = Date().addingTimeInterval(Double(milliseconds) / 1000)
        while unread < limit {
            let left = Int32(max(0, deadline.timeIntervalSinceNow * 1000))
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&p, 1, left)
            if ready < 0 && errno == EINTR { continue }
            if ready <= 0 { break }
            let n = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if n > 0 { bytesReceived += n; buffer.append(contentsOf: scratch[0..<n]); continue }
            if n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) { continue }
            eof = true
            break
        }
        return (takeAll(), eof)
    }

    /// True when the peer closed the connection (EOF or reset) with no further bytes.
    public func readsEOF() throws -> Bool {
        if unread > 0 { return false }
        return try !fill()
    }

    /// One request on this connection, which stays open (keep-alive) unless `headers` say
    /// otherwise; a `Content-Length` is sent whenever `body` is not nil.
    public func request(_ method: String = "GET", _ target: String, headers: [(String, String)] = [], body: [UInt8]? = nil) throws -> TestResponse {
        var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        guard send(Array(head.utf8) + (body ?? [])) else { throw TestClientError("send failed: errno \(errno)") }
        return try readResponse(requestMethod: method)
    }

    /// Every unread byte; the buffer is empty afterwards.
    private func takeAll() -> [UInt8] {
        defer { buffer = []; start = 0 }
        return Array(buffer[start...])
    }

    /// Everything until the peer closes.
    public func readToEOF() throws -> [UInt8] {
        while try fill() {}
        return takeAll()
    }

    /// The status line and headers of the next response (skipping `100 Continue`).
    public func readHead() throws -> (status: Int, headers: TestHeaders) {
        while true {
            let statusLine = try readLine()
            let parts = statusLine.split(separator: " ", maxSplits: 2)
            guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
                throw TestClientError("bad status line: \(statusLine.debugDescription)")
            }
            let headers = try readHeaderFields()
            if status == 100 { continue }
            return (status, headers)
        }
    }

    /// Header lines up to the empty line that ends a head.
    func readHeaderFields() throws -> TestHeaders {
        var headers: [(String, String)] = []
        while true {
            let line = try readLine()
            if line.isEmpty { return TestHeaders(headers) }
            guard let colon = line.firstIndex(of: ":") else { throw TestClientError("bad header line: \(line.debugDescription)") }
            headers.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
    }

    /// A body framed as `headers` say: chunked, by Content-Length, or (when `toEOF`) until the
    /// peer closes; else none.
    func readBody(_ headers: TestHeaders, toEOF: Bool) throws -> [UInt8] {
        if headers["transfer-encoding"]?.lowercased().contains("chunked") == true {
            var body: [UInt8] = []
            while let chunk = try readChunk() { body += chunk }
            return body
        }
        if let length = headers["content-length"].flatMap({ Int($0) }) { return try readBytes(length) }
        return toEOF ? try readToEOF() : []
    }

    /// One chunk of a chunked body; nil at the last (zero) chunk, after its trailer.
    public func readChunk() throws -> [UInt8]? {
        let sizeLine = try readLine()
        guard let size = Int(sizeLine.split(separator: ";").first.map(String.init)?.trimmingCharacters(in: .whitespaces) ?? "", radix: 16) else {
            throw TestClientError("bad chunk size line: \(sizeLine.debugDescription)")
        }
        if size == 0 {
            while try !readLine().isEmpty {}
            return nil
        }
        let chunk = try readBytes(size)
        guard try readLine().isEmpty else { throw TestClientError("chunk not followed by CRLF") }
        return chunk
    }

    /// A whole response: body by Content-Length, chunked, or until EOF.
    public func readResponse(requestMethod: String = "GET") throws -> TestResponse {
        let (status, h) = try readHead()
        let bodiless = requestMethod == "HEAD" || status == 204 || status == 304 || (100..<200).contains(status)
        return TestResponse(status: status, headers: h, body: bodiless ? [] : try readBody(h, toEOF: true))
    }

    /// Request bytes for HTTP/1.1 with `Connection: close`.
    public static func head(_ method: String, _ path: String, headers: [String: String], contentLength: Int?) -> String {
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { head += "\(name): \(value)\r\n" }
        if let contentLength { head += "Content-Length: \(contentLength)\r\n" }
        head += "\r\n"
        return head
    }
}
