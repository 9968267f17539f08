import Dispatch
import Foundation
import Locking
import Synchronization
// The kit (closedPort, waitUntil) for every file of this target.
@_exported import TestKit
#if canImport(Glibc)
import Glibc
#endif

/// A raw-socket HTTP target on 127.0.0.1 whose answers are scripted per path, bytes and all,
/// so it can misbehave the ways a hostile target would. One thread per connection.
final class HostileServer: Sendable {
    /// What a route does with the connection: gets the request (head and body), writes bytes.
    typealias Route = @Sendable (_ request: Received, _ out: Connection) -> Void

    struct Received: Sendable {
        var method: String
        var path: String
        var headers: [String: String]  // lower-cased names
        var body: [UInt8]
    }

    struct Connection: Sendable {
        let fd: Int32
        let server: HostileServer
        /// Writes bytes; false when the peer is gone or the server stops.
        @discardableResult
        func write(_ bytes: [UInt8]) -> Bool {
            var sent = 0
            while sent < bytes.count {
                let n = bytes[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if n <= 0 { return false }
                sent += n
            }
            return !server.isStopping
        }
        @discardableResult
        func write(_ text: String) -> Bool { write(Array(text.utf8)) }
    }

    let port: UInt16
    private let listener: Int32
    private let routes: [String: Route]
    private let seen = Lock<[Received]>([])
    private let active = Lock(0)
    private let stopping = Atomic<Bool>(false)
    private let acceptDone = DispatchSemaphore(value: 0)

    var base: String { "http://127.0.0.1:\(port)" }
    var isStopping: Bool { stopping.load(ordering: .acquiring) }
    /// Requests received so far, in order.
    var requests: [Received] { seen.value }

    init(_ routes: [String: Route]) throws {
        self.routes = routes
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                bind(fd, sa, len) == 0 && listen(fd, 64) == 0 && getsockname(fd, sa, &len) == 0
            }
        }
        guard ok else { close(fd); throw POSIXError(.EADDRINUSE) }
        listener = fd
        port = UInt16(bigEndian: addr.sin_port)
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    func stop() {
        stopping.store(true, ordering: .releasing)
        shutdown(listener, Int32(SHUT_RDWR))
        acceptDone.wait()
        close(listener)
        let deadline = Date().addingTimeInterval(5)
        while active.value > 0 && Date() < deadline { usleep(1000) }
    }

    private func acceptLoop() {
        while !isStopping {
            let c = accept(listener, nil, nil)
            if c < 0 {
                if errno == EINTR { continue }
                break
            }
            active.withLock { $0 += 1 }
            Thread.detachNewThread { [self] in
                serve(c)
                close(c)
                active.withLock { $0 -= 1 }
            }
        }
        acceptDone.signal()
    }

    private func serve(_ c: Int32) {
        var data: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        var headEnd: Int?
        while headEnd == nil {
            let n = recv(c, &buffer, buffer.count, 0)
            if n <= 0 { return }
            data.append(contentsOf: buffer[0..<n])
            headEnd = data.firstRange(of: Array("\r\n\r\n".utf8))?.upperBound
        }
        guard let end = headEnd else { return }
        let lines = String(decoding: data[0..<end], as: UTF8.self).components(separatedBy: "\r\n")
        let parts = lines[0].split(separator: " ")
        guard parts.count >= 2 else { return }
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let length = Int(headers["content-length"] ?? "0") ?? 0
        while data.count - end < length {
            let n = recv(c, &buffer, buffer.count, 0)
            if n <= 0 { return }
            data.append(contentsOf: buffer[0..<n])
        }
        let request = Received(method: String(parts[0]), path: String(parts[1]), headers: headers,
                               body: Array(data[end..<(end + length)]))
        seen.withLock { $0.append(request) }
        let path = request.path.split(separator: "?").first.map(String.init) ?? request.path
        let out = Connection(fd: c, server: self)
        if let route = routes[path] {
            route(request, out)
        } else {
            out.write("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        }
    }
}

/// A whole response with Content-Length and `Connection: close`.
func reply(_ status: Int, _ headers: [(String, String)] = [], body: String = "") -> String {
    var out = "HTTP/1.1 \(status) X\r\nConnection: close\r\nContent-Length: \(body.utf8.count)\r\n"
    for (k, v) in headers { out += "\(k): \(v)\r\n" }
    return out + "\r\n" + body
}

func now() -> Double { Double(DispatchTime.now().uptimeNanoseconds) / 1e9 }
