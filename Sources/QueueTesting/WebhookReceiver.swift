import Foundation
import Locking
#if canImport(Glibc)
import Glibc
#endif

/// A request the receiver got.
public struct ReceivedRequest: Sendable {
    public let method: String
    public let path: String
    public let headers: TestHeaders
    public let body: [UInt8]
    public var text: String { String(decoding: body, as: UTF8.self) }
    /// The body as a JSON object; empty if it is not one.
    public var object: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:]
    }
}

/// A tiny HTTP server on 127.0.0.1 (raw sockets, one thread per connection) that records every
/// request and answers `200` with `Connection: close`: the far end of a webhook.
public final class WebhookReceiver: Sendable {
    public let port: Int
    private let listenFD: Int32
    private let state = Lock<(requests: [ReceivedRequest], closed: Bool)>(([], false))

    public var url: String { "http://127.0.0.1:\(port)/hook" }

    public init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestClientError("socket() failed: errno \(errno)") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, 64) == 0 else {
            Glibc.close(fd)
            throw TestClientError("bind/listen failed: errno \(errno)")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        listenFD = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        let thread = Thread { [self] in acceptLoop() }
        thread.start()
    }

    deinit { close() }

    /// Stops listening. The accept thread closes the socket itself once `accept` fails, so the
    /// descriptor cannot be reused by another socket while that thread might still accept on it.
    public func close() {
        let wasOpen = state.withLock { s -> Bool in
            defer { s.closed = true }
            return !s.closed
        }
        if wasOpen { shutdown(listenFD, Int32(SHUT_RDWR)) }
    }

    /// Everything received so far.
    public var requests: [ReceivedRequest] { state.withLock { $0.requests } }

    /// Waits until `condition` holds for the received requests, or `timeout`.
    public func waitFor(timeout: Double = 5, _ condition: ([ReceivedRequest]) -> Bool) async -> Bool {
        await eventually(timeout: timeout) { condition(requests) }
    }

    private func acceptLoop() {
        defer { Glibc.close(listenFD) }
        while true {
            let client = accept(listenFD, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                return
            }
            if state.withLock({ $0.closed }) {
                Glibc.close(client)
                return
            }
            let thread = Thread { [self] in serve(client) }
            thread.start()
        }
    }

    private func serve(_ fd: Int32) {
        let connection = RawConnection(acceptedFD: fd, timeout: 5)
        defer { connection.close() }
        do {
            let requestLine = try connection.readLine()
            let parts = requestLine.split(separator: " ")
            guard parts.count >= 2 else { return }
            var headers: [(String, String)] = []
            while true {
                let line = try connection.readLine()
                if line.isEmpty { break }
                guard let colon = line.firstIndex(of: ":") else { return }
                headers.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
            }
            let h = TestHeaders(headers)
            if h["expect"]?.lowercased() == "100-continue" { connection.send("HTTP/1.1 100 Continue\r\n\r\n") }
            var body: [UInt8] = []
            if h["transfer-encoding"]?.lowercased().contains("chunked") == true {
                while let chunk = try connection.readChunk() { body += chunk }
            } else if let length = h["content-length"].flatMap({ Int($0) }) {
                body = try connection.readBytes(length)
            }
            let request = ReceivedRequest(method: String(parts[0]), path: String(parts[1]), headers: h, body: body)
            state.withLock { $0.requests.append(request) }
            connection.send("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        } catch {}
    }
}

extension RawConnection {
    /// Wraps an accepted socket.
    public convenience init(acceptedFD fd: Int32, timeout: Double) {
        self.init(adopting: fd, timeout: timeout)
    }
}
