import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// What became of one HTTP request to a server that may be going away.
public enum HTTPOutcome: Sendable, CustomStringConvertible {
    /// A complete answer.
    case response(TestResponse)
    /// `connect` was refused: nothing listens (any more).
    case refused
    /// The connection ended (EOF or reset) before a single byte of an answer came.
    case closedWithoutAnswer(String)
    /// Some of an answer came, then the connection ended.
    case partial(String, bytes: Int)
    /// Nothing (or not everything) came within the timeout.
    case timedOut(bytes: Int)
    /// `socket`/`connect` failed otherwise.
    case failed(String)

    public var response: TestResponse? { if case let .response(r) = self { r } else { nil } }
    public var status: Int? { response?.status }

    public var description: String {
        switch self {
        case let .response(r): "HTTP \(r.status) \(r.text.prefix(300))"
        case .refused: "connection refused"
        case let .closedWithoutAnswer(how): "closed without an answer (\(how))"
        case let .partial(how, bytes): "partial answer: \(bytes) bytes, then \(how)"
        case let .timedOut(bytes): "timed out after \(bytes) bytes"
        case let .failed(what): "failed: \(what)"
        }
    }
}

/// A one-shot HTTP/1.1 exchange (`Connection: close`) that tells a refused connection, an
/// answer that never started, a cut-off answer and a timeout apart.
public enum HTTPExchange {
    public static func run(port: Int, method: String, path: String, body: [UInt8]?, headers: [String: String] = [:], timeout: Double) -> HTTPOutcome {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .failed("socket: errno \(errno)") }
        defer { close(fd) }
        var tv = timeval(tv_sec: Int(timeout), tv_usec: Int((timeout - Double(Int(timeout))) * 1e6))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var connected: Int32
        repeat {
            connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
        } while connected < 0 && errno == EINTR
        if connected < 0 {
            let e = errno
            if e == ECONNREFUSED { return .refused }
            if e == ECONNRESET { return .closedWithoutAnswer("reset at connect") }
            return .failed("connect: errno \(e)")
        }
        let head = RawConnection.head(method, path, headers: body == nil ? headers : headers.merging(["Content-Type": "application/json"]) { a, _ in a },
                                      contentLength: body?.count)
        let request = Array(head.utf8) + (body ?? [])
        var sent = 0
        while sent < request.count {
            let n = request.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, request.count - sent, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }  // the server may have answered and closed: read what it said
            sent += n
        }
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            if let response = parse(buffer, method: method, atEOF: false) { return .response(response) }
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            if n > 0 {
                buffer += chunk[..<n]
                continue
            }
            if n < 0 && errno == EINTR { continue }
            let how: String
            if n == 0 {
                if let response = parse(buffer, method: method, atEOF: true) { return .response(response) }
                how = "EOF"
            } else {
                let e = errno
                if e == EAGAIN || e == EWOULDBLOCK { return .timedOut(bytes: buffer.count) }
                how = e == ECONNRESET ? "ECONNRESET" : "errno \(e)"
            }
            return buffer.isEmpty ? .closedWithoutAnswer(how) : .partial(how, bytes: buffer.count)
        }
    }

    /// A complete response in `bytes`, or nil if more is needed.
    static func parse(_ bytes: [UInt8], method: String, atEOF: Bool) -> TestResponse? {
        let separator: [UInt8] = [13, 10, 13, 10]
        var searchFrom = 0
        while true {
            guard let end = find(separator, in: bytes, from: searchFrom) else { return nil }
            let headText = String(decoding: bytes[searchFrom..<end], as: UTF8.self)
            var lines = headText.components(separatedBy: "\r\n")
            let statusLine = lines.removeFirst().split(separator: " ", maxSplits: 2)
            guard statusLine.count >= 2, statusLine[0].hasPrefix("HTTP/1."), let status = Int(statusLine[1]) else { return nil }
            var headers: [(String, String)] = []
            for line in lines {
                guard let colon = line.firstIndex(of: ":") else { return nil }
                headers.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
            }
            let bodyStart = end + 4
            if status == 100 { searchFrom = bodyStart; continue }
            let h = TestHeaders(headers)
            if method == "HEAD" || status == 204 || status == 304 {
                return TestResponse(status: status, headers: h, body: [])
            }
            if h["transfer-encoding"]?.lowercased().contains("chunked") == true {
                var at = bodyStart
                var body: [UInt8] = []
                while true {
                    guard let lineEnd = find([13, 10], in: bytes, from: at) else { return nil }
                    let sizeText = String(decoding: bytes[at..<lineEnd], as: UTF8.self).split(separator: ";").first.map(String.init) ?? ""
                    guard let size = Int(sizeText.trimmingCharacters(in: .whitespaces), radix: 16) else { return nil }
                    at = lineEnd + 2
                    if size == 0 {
                        // Trailer section ends with an empty line.
                        guard find([13, 10], in: bytes, from: at) != nil else { return nil }
                        return TestResponse(status: status, headers: h, body: body)
                    }
                    guard bytes.count >= at + size + 2 else { return nil }
                    body += bytes[at..<(at + size)]
                    at += size + 2
                }
            }
            if let length = h["content-length"].flatMap({ Int($0) }) {
                guard bytes.count >= bodyStart + length else { return nil }
                return TestResponse(status: status, headers: h, body: Array(bytes[bodyStart..<(bodyStart + length)]))
            }
            return atEOF ? TestResponse(status: status, headers: h, body: Array(bytes[bodyStart...])) : nil
        }
    }

    private static func find(_ needle: [UInt8], in bytes: [UInt8], from start: Int) -> Int? {
        guard bytes.count >= needle.count, start <= bytes.count - needle.count else { return nil }
        var i = start
        while i <= bytes.count - needle.count {
            if bytes[i] == needle[0] && Array(bytes[i..<(i + needle.count)]) == needle { return i }
            i += 1
        }
        return nil
    }
}
