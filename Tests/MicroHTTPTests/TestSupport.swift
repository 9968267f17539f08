import Foundation
import Glibc
import Locking
import QueueTesting
import Testing

@testable import MicroHTTP

/// A parsed HTTP response read from a raw socket.
struct RawResponse {
    var status: Int
    var headers: [String: String]
    var body: [UInt8]
    var text: String { String(decoding: body, as: UTF8.self) }
}

struct ClientError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A blocking TCP client socket to 127.0.0.1 with a receive timeout, so a hung server fails the
/// test instead of hanging it. Used where the test needs control over the bytes: malformed,
/// partial and dropped requests, many simultaneous connections, streams.
final class TestSocket {
    let fd: Int32
    private var buffer: [UInt8] = []
    private var isClosed = false

    init(port: Int, receiveTimeout: Double = 10) throws {
        fd = try Self.connectedSocket(port: port, receiveTimeout: receiveTimeout)
    }

    /// Opens and connects the socket before `self` exists: a class whose init throws after full
    /// initialization still runs `deinit`, which would close the descriptor a second time (and by
    /// then the number may belong to the server under test).
    private static func connectedSocket(port: Int, receiveTimeout: Double) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ClientError("socket() failed: errno \(errno)") }
        var timeout = timeval(
            tv_sec: Int(receiveTimeout), tv_usec: Int((receiveTimeout - Double(Int(receiveTimeout))) * 1e6))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else {
            let error = errno
            Glibc.close(fd)
            throw ClientError("connect() failed: errno \(error)")
        }
        return fd
    }

    deinit { close() }

    func close() {
        if !isClosed {
            isClosed = true
            Glibc.close(fd)
        }
    }

    /// Sends everything; false if the peer closed (EPIPE / ECONNRESET), never SIGPIPE.
    @discardableResult
    func send(_ bytes: [UInt8]) -> Bool {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return false }
            sent += n
        }
        return true
    }

    @discardableResult
    func send(_ text: String) -> Bool { send(Array(text.utf8)) }

    /// Receives more bytes into the buffer; false at EOF. Throws on timeout or error.
    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
        if n == 0 { return false }
        if n < 0 {
            if errno == ECONNRESET { return false }
            throw ClientError("recv failed: errno \(errno) (timeout?)")
        }
        buffer.append(contentsOf: chunk[0..<n])
        return true
    }

    func readLine() throws -> String {
        while true {
            if let index = buffer.firstIndex(of: 0x0A) {
                var line = Array(buffer[..<index])
                buffer.removeFirst(index + 1)
                if line.last == 0x0D { line.removeLast() }
                return String(decoding: line, as: UTF8.self)
            }
            guard try fill() else { throw ClientError("connection closed while reading a line") }
        }
    }

    func readBytes(_ count: Int) throws -> [UInt8] {
        while buffer.count < count {
            guard try fill() else { throw ClientError("connection closed after \(buffer.count) of \(count) bytes") }
        }
        let bytes = Array(buffer[..<count])
        buffer.removeFirst(count)
        return bytes
    }

    /// True when the server closed the connection (EOF or reset) with no further bytes.
    func readsEOF() throws -> Bool {
        if !buffer.isEmpty { return false }
        return try !fill()
    }

    func readHead() throws -> (status: Int, headers: [String: String]) {
        let statusLine = try readLine()
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
            throw ClientError("bad status line: \(statusLine)")
        }
        var headers: [String: String] = [:]
        while true {
            let line = try readLine()
            if line.isEmpty { break }
            guard let colon = line.firstIndex(of: ":") else { throw ClientError("bad header line: \(line)") }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return (status, headers)
    }

    /// Reads one chunk of a chunked body; nil at the last (zero) chunk, after its trailer.
    func readChunk() throws -> [UInt8]? {
        let sizeLine = try readLine()
        guard let size = Int(sizeLine.split(separator: ";")[0], radix: 16) else {
            throw ClientError("bad chunk size line: \(sizeLine)")
        }
        if size == 0 {
            while try !readLine().isEmpty {}
            return nil
        }
        let chunk = try readBytes(size)
        guard try readLine().isEmpty else { throw ClientError("chunk not followed by CRLF") }
        return chunk
    }

    func readResponse(requestMethod: String = "GET") throws -> RawResponse {
        var (status, headers) = try readHead()
        while status == 100 { (status, headers) = try readHead() }
        var body: [UInt8] = []
        if requestMethod == "HEAD" || status == 204 || status == 304 {
        } else if headers["transfer-encoding"]?.lowercased() == "chunked" {
            while let chunk = try readChunk() { body += chunk }
        } else if let length = headers["content-length"].flatMap({ Int($0) }) {
            body = try readBytes(length)
        } else {
            while try fill() {}
            body = buffer
            buffer = []
        }
        return RawResponse(status: status, headers: headers, body: body)
    }

    /// One request on this connection (keep-alive).
    func request(
        _ method: String = "GET", _ target: String, headers: [(String, String)] = [], body: [UInt8]? = nil
    ) throws -> RawResponse {
        var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        guard send(Array(head.utf8) + (body ?? [])) else { throw ClientError("send failed: errno \(errno)") }
        return try readResponse(requestMethod: method)
    }
}

/// One request on a fresh connection.
func fetch(
    port: Int, _ method: String = "GET", _ target: String, headers: [(String, String)] = [], body: [UInt8]? = nil
) throws -> RawResponse {
    let socket = try TestSocket(port: port)
    defer { socket.close() }
    return try socket.request(method, target, headers: headers, body: body)
}

/// Runs `/usr/bin/curl` with `arguments` and returns (HTTP status, body); curl adds the status line.
func curl(_ arguments: [String]) throws -> (status: Int, body: String) {
    let (_, data) = try ChildProcess.capture("/usr/bin/curl", ["-s", "-S", "--max-time", "20", "-w", "\n%{http_code}"] + arguments)
    let text = String(decoding: data, as: UTF8.self)
    guard let newline = text.lastIndex(of: "\n"), let status = Int(text[text.index(after: newline)...]) else {
        throw ClientError("unexpected curl output: \(text)")
    }
    return (status, String(text[..<newline]))
}

/// Collects the server's log lines.
final class LogSink: Sendable {
    let lines = Lock<[(level: String, message: String)]>([])
    var log: @Sendable (String, String) -> Void {
        { level, message in self.lines.withLock { $0.append((level, message)) } }
    }
    func contains(level: String, _ text: String) -> Bool {
        lines.withLock { $0.contains { $0.level == level && $0.message.contains(text) } }
    }
}

/// Starts a server on 127.0.0.1 port 0, runs `body`, and always shuts it down.
@discardableResult
func withServer<T>(
    maxBodyBytes: Int = 1 << 20,
    threads: Int = 2,
    connectionTimeout: Int = 30,
    log: LogSink = LogSink(),
    handler: @escaping HTTPHandler,
    _ body: (HTTPServer) throws -> T
) throws -> T {
    let configuration = HTTPServerConfiguration(
        host: "127.0.0.1", port: 0, threads: threads, maxBodyBytes: maxBodyBytes, connectionTimeout: connectionTimeout)
    let server = HTTPServer(configuration: configuration, handler: handler, log: log.log)
    try server.start()
    defer { server.shutdown(timeout: .seconds(2)) }
    return try body(server)
}

/// Polls `condition` until true or `timeout` seconds pass; returns its last value.
@discardableResult
func waitUntil(timeout: Double = 5, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if condition() { return true }
        usleep(2_000)
    }
    return condition()
}

func text(_ string: String, status: Int = 200, contentType: String = "text/plain") -> HTTPHandlerResult {
    .response(HTTPResponse(status: status, headers: [("Content-Type", contentType)], body: Array(string.utf8)))
}

/// Decodes a JSON object body.
func jsonObject(_ bytes: [UInt8]) throws -> [String: Any] {
    let object = try JSONSerialization.jsonObject(with: Data(bytes))
    guard let dictionary = object as? [String: Any] else { throw ClientError("not a JSON object") }
    return dictionary
}
