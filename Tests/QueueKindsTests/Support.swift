import Dispatch
import Foundation
import QueueEngine
import QueueKinds
import Locking
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Every kind test runs in this one serialized suite: they measure latencies, count file
/// descriptors and look for zombie children of the test process, which parallel tests would
/// disturb.
@Suite(.serialized) struct KindsTests {}

// MARK: - small shared state

/// A value behind a `Mutex`, shareable between threads and `@Sendable` closures.
/// A value behind the shared pthread `Lock` (the one ThreadSanitizer can see).
typealias Locked = Lock

/// Polls `condition` every millisecond until it holds or `timeout` seconds have passed.
@discardableResult
func waitUntil(timeout: Double = 5, _ condition: () -> Bool) -> Bool {
    let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(timeout * 1e9)
    while !condition() {
        if DispatchTime.now().uptimeNanoseconds > deadline { return condition() }
        usleep(1000)
    }
    return true
}

/// Seconds since an arbitrary fixed point (monotonic).
func now() -> Double { Double(DispatchTime.now().uptimeNanoseconds) / 1e9 }

// MARK: - the engine

/// A real engine with the standard kinds, one queue and helpers to run operations.
struct Harness {
    let engine: QueueEngine
    let queue = "q"

    init(allow: [String] = [], maxCommands: Int = 16) throws {
        engine = QueueEngine(kinds: standardKinds(KindsConfiguration(allowCommands: allow, maxCommands: maxCommands)))
        try engine.createQueue(name: queue, maxConcurrentOperationCount: 8)
    }

    func add(_ kind: String, _ spec: String, timeout: Double? = nil) throws -> OperationID {
        try engine.addOperationID(to: queue, OperationRequest(kind: kind, spec: try JSONValue.parse(spec),
                                                              options: OperationOptions(timeout: timeout)))
    }

    /// Waits until `id` is finished and returns it; records an issue if it does not finish.
    @discardableResult
    func wait(_ id: OperationID, timeout: Double = 10) throws -> OperationSnapshot {
        let finished = waitUntil(timeout: timeout) { (try? engine.operation(id).isFinished) ?? false }
        #expect(finished, "operation \(id) did not finish within \(timeout) s")
        return try engine.operation(id)
    }

    func state(_ id: OperationID) throws -> OperationState { try engine.operation(id).state }

    /// Runs one operation to its end.
    func run(_ kind: String, _ spec: String, timeout: Double = 10) throws -> OperationSnapshot {
        try wait(try add(kind, spec), timeout: timeout)
    }

    /// The field an invalid spec is refused for, or nil when it is accepted.
    func refusal(_ kind: String, _ spec: String) throws -> String? {
        do {
            _ = try add(kind, spec)
            return nil
        } catch let EngineError.invalidArgument(field, _) {
            return field
        } catch let EngineError.notPermitted(field, _, _) {
            return field
        }
    }
}

extension OperationSnapshot {
    var errorType: String? {
        if case let .string(t)? = error?["type"] { return t }
        return nil
    }
    var errorData: JSONValue? { error?["data"] }
}

extension JSONValue {
    var int: Int? { if case let .number(n) = self { return Int(n) }; return nil }
    var string: String? { if case let .string(s) = self { return s }; return nil }
    var bool: Bool? { if case let .bool(b) = self { return b }; return nil }
}

// MARK: - processes

/// Children of the test process: pid, state letter and argv.
func childProcesses() -> [(pid: pid_t, state: Character, argv: [String])] {
    let me = getpid()
    var out: [(pid_t, Character, [String])] = []
    guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return [] }
    for entry in entries {
        guard let pid = pid_t(entry), let stat = procStat(pid), stat.ppid == me else { continue }
        let cmdline = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline"))) ?? Data()
        let argv = cmdline.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        out.append((pid, stat.state, argv))
    }
    return out
}

/// Fields of /proc/PID/stat: state, parent, and CPU time (utime + stime, clock ticks).
func procStat(_ pid: pid_t) -> (state: Character, ppid: pid_t, cpu: Int)? {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = text.lastIndex(of: ")") else { return nil }
    let f = text[text.index(close, offsetBy: 2)...].split(separator: " ")
    guard f.count > 13, let ppid = pid_t(f[1]), let utime = Int(f[11]), let stime = Int(f[12]) else { return nil }
    return (f[0].first!, ppid, utime + stime)
}

/// Waits for the child of this process running exactly `argv` and returns its pid.
func child(running argv: [String], timeout: Double = 5) -> pid_t? {
    var found: pid_t?
    waitUntil(timeout: timeout) {
        found = childProcesses().first { $0.argv == argv && $0.state != "Z" }?.pid
        return found != nil
    }
    return found
}

/// Open file descriptors of this process.
func openDescriptors() -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []).compactMap { name in
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(name)") else { return nil }
        return "\(name) -> \(target)"
    }
}

// MARK: - an HTTP target

/// A tiny HTTP/1.1 server on 127.0.0.1 (raw sockets, one thread per connection,
/// `Connection: close`). Routes: `/ok`, `/status/N`, `/slow` (2 s), `/large` (1 MiB),
/// `/binary`, `/redirect` (→ `/ok`), `/v6` (→ `//[::1]/`), `/loop` (→ itself),
/// `/to-file` (→ `file:///etc/passwd`), `/echo` (the request body back). It counts requests by path.
final class TargetServer: Sendable {
    let port: UInt16
    private let listener: Int32
    private let counts = Locked<[String: Int]>([:])
    private let active = Locked(0)
    private let stopping = Atomic<Bool>(false)
    private let acceptDone = DispatchSemaphore(value: 0)

    var base: String { "http://127.0.0.1:\(port)" }
    func count(_ path: String) -> Int { counts.value[path] ?? 0 }

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
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

    /// Stops accepting, waits for every connection thread, closes every descriptor.
    func stop() {
        stopping.store(true, ordering: .releasing)
        shutdown(listener, Int32(SHUT_RDWR))
        acceptDone.wait()
        close(listener)
        waitUntil(timeout: 5) { active.value == 0 }
    }

    private func acceptLoop() {
        while !stopping.load(ordering: .acquiring) {
            let c = accept(listener, nil, nil)
            if c < 0 {
                if errno == EINTR { continue }
                break
            }
            _ = fcntl(c, F_SETFD, FD_CLOEXEC)
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
            if data.first == 0x16 {
                // A TLS ClientHello: answer in plain HTTP, as a misconfigured server would.
                let reply = Array("HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".utf8)
                _ = reply.withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                return
            }
            headEnd = data.firstRange(of: Array("\r\n\r\n".utf8))?.upperBound
        }
        let head = String(decoding: data[0..<headEnd!], as: UTF8.self)
        let lines = head.components(separatedBy: "\r\n")
        let parts = lines[0].split(separator: " ")
        guard parts.count >= 2 else { return }
        let method = String(parts[0]), path = String(parts[1])
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let length = Int(headers["content-length"] ?? "0") ?? 0
        while data.count - headEnd! < length {
            let n = recv(c, &buffer, buffer.count, 0)
            if n <= 0 { return }
            data.append(contentsOf: buffer[0..<n])
        }
        let body = Array(data[headEnd!..<(headEnd! + length)])
        counts.withLock { $0[path, default: 0] += 1 }

        var status = 200
        var extra: [(String, String)] = [("Content-Type", "text/plain")]
        var reply: [UInt8] = Array("hello".utf8)
        switch path {
        case "/ok":
            extra.append(("X-Test", "yes"))
        case "/slow":
            let until = now() + 2
            while now() < until {
                if stopping.load(ordering: .acquiring) { return }
                usleep(10_000)
            }
            reply = Array("slow".utf8)
        case "/large":
            reply = (0..<(1 << 20)).map { UInt8(ascii: "a") + UInt8($0 % 26) }
        case "/binary":
            reply = (0..<1000).map { _ in 0xFF }
            extra = [("Content-Type", "application/octet-stream")]
        case "/redirect":
            status = 302
            extra.append(("Location", "/ok"))
            reply = []
        case "/v6", "/loop", "/to-file":
            status = path == "/loop" ? 301 : 302
            extra.append(("Location", path == "/v6" ? "//[::1]/" : path == "/loop" ? "/loop" : "file:///etc/passwd"))
            reply = []
        case "/echo":
            reply = body
            extra.append(("X-Got-Method", method))
            extra.append(("X-Got-Content-Type", headers["content-type"] ?? "none"))
        default:
            if path.hasPrefix("/status/"), let s = Int(path.dropFirst(8)) {
                status = s
                reply = Array("status \(s)".utf8)
            } else {
                status = 404
                reply = Array("no route".utf8)
            }
        }
        var out = "HTTP/1.1 \(status) X\r\nConnection: close\r\nContent-Length: \(reply.count)\r\n"
        for (k, v) in extra { out += "\(k): \(v)\r\n" }
        out += "\r\n"
        var bytes = Array(out.utf8)
        if method != "HEAD" { bytes += reply }
        var sent = 0
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            sent += n
        }
    }
}

/// A port on 127.0.0.1 that nothing listens on (bound, then closed).
func closedPort() -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) { p in
        p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
    }
    return UInt16(bigEndian: addr.sin_port)
}
