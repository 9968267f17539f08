import Foundation
import Locking
#if canImport(Glibc)
import Glibc
#endif

/// Finds the `opqd` executable built next to the test bundle.
public enum OpqdBinary {
    /// `OPQD_TEST_BINARY` if set; otherwise the first `opqd` found in the directories of the
    /// running test bundle (`CommandLine.arguments[0]`, `/proc/self/exe`, `Bundle.main`) and
    /// their parents: `.build/debug`, `.build-tsan/debug`, or any other scratch path.
    public static func locate() throws -> String {
        let fm = FileManager.default
        if let explicit = ProcessInfo.processInfo.environment["OPQD_TEST_BINARY"] {
            guard fm.isExecutableFile(atPath: explicit) else { throw TestClientError("OPQD_TEST_BINARY=\(explicit) is not an executable") }
            return explicit
        }
        var starts: [URL] = []
        if let first = CommandLine.arguments.first, !first.isEmpty {
            starts.append(URL(fileURLWithPath: first).resolvingSymlinksInPath())
        }
        if let exe = try? fm.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            starts.append(URL(fileURLWithPath: exe))
        }
        starts.append(Bundle.main.bundleURL.resolvingSymlinksInPath())
        starts.append(Bundle.main.executableURL?.resolvingSymlinksInPath() ?? Bundle.main.bundleURL)
        var tried: [String] = []
        for start in starts {
            var dir = start.deletingLastPathComponent()
            for _ in 0..<4 {
                let candidate = dir.appendingPathComponent("opqd").path
                tried.append(candidate)
                var isDirectory: ObjCBool = false
                if fm.fileExists(atPath: candidate, isDirectory: &isDirectory), !isDirectory.boolValue, fm.isExecutableFile(atPath: candidate) {
                    return candidate
                }
                dir = dir.deletingLastPathComponent()
            }
        }
        throw TestClientError("no opqd executable next to the test bundle; looked at \(tried)")
    }
}

/// How a process ended.
public enum ProcessExit: Equatable, Sendable, CustomStringConvertible {
    case exited(Int32)
    case signaled(Int32)
    public var description: String {
        switch self {
        case let .exited(code): "exited with status \(code)"
        case let .signaled(signal): "killed by signal \(signal)"
        }
    }
}

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

/// The real `opqd` executable as a child process: started with `posix_spawn`, its port read from
/// the `opqd listening on http://HOST:PORT` line on its stdout, its stderr kept in a log file.
/// Killed (SIGKILL) and reaped on deinit if still running.
public final class ServerProcess: Sendable {
    public let pid: pid_t
    public let port: Int
    public let logPath: String
    /// Seconds from spawn to the listening line.
    public let startupSeconds: Double
    private let state: Lock<(exit: ProcessExit?, stdout: Int32)>

    /// Starts `binary --port 0 --data <data> --log-level warning <extra>`; throws (with the log)
    /// if it does not print its listening line within `timeout`.
    public init(binary: String, data: String, logPath: String, extraArguments: [String] = [], timeout: Double = 30) throws {
        let arguments = [binary, "--host", "127.0.0.1", "--port", "0", "--data", data, "--log-level", "warning"] + extraArguments
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw TestClientError("pipe failed: errno \(errno)") }
        _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
        posix_spawn_file_actions_addopen(&actions, 2, logPath, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        // Tests run in parallel in this process and open sockets without close-on-exec: the
        // child must not hold any of them open.
        if let closeFrom = Self.closeFrom { _ = closeFrom(&actions, 3) }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigdefault(&attributes, &all)

        // The test runner's environment, without OPQD_* settings that would change the server.
        let environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("OPQD_") }.map { "\($0.key)=\($0.value)" }
        let argv = arguments.map { strdup($0) } + [nil]
        let envp = environment.map { strdup($0) } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        let started = Date()
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, binary, &actions, &attributes, argv, envp)
        close(fds[1])
        guard rc == 0 else {
            close(fds[0])
            throw TestClientError("cannot run \(binary): \(String(cString: strerror(rc)))")
        }

        // Reads stdout up to the listening line.
        var line: [UInt8] = []
        var found: Int? = nil
        let deadline = started.addingTimeInterval(timeout)
        reading: while Date() < deadline {
            var p = pollfd(fd: fds[0], events: Int16(POLLIN), revents: 0)
            let ready = poll(&p, 1, 100)
            if ready < 0 && errno != EINTR { break }
            if ready <= 0 { continue }
            var chunk = [UInt8](repeating: 0, count: 512)
            let n = read(fds[0], &chunk, chunk.count)
            if n <= 0 { break }
            line += chunk[..<n]
            while let nl = line.firstIndex(of: 0x0A) {
                let text = String(decoding: line[..<nl], as: UTF8.self)
                line.removeFirst(nl + 1)
                if text.hasPrefix("opqd listening on http://"), let colon = text.lastIndex(of: ":"), let p = Int(text[text.index(after: colon)...]) {
                    found = p
                    break reading
                }
            }
        }
        startupSeconds = Date().timeIntervalSince(started)
        guard let found else {
            Glibc.kill(pid, SIGKILL)
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
            close(fds[0])
            let log = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
            throw TestClientError("opqd printed no listening line within \(timeout) s (got \(String(decoding: line, as: UTF8.self).debugDescription)); log:\n\(log.suffix(4000))")
        }
        self.pid = pid
        self.logPath = logPath
        self.port = found
        state = Lock((exit: nil, stdout: fds[0]))
    }

    deinit {
        if state.withLock({ $0.exit }) == nil {
            Glibc.kill(pid, SIGKILL)
            _ = waitForExit(timeout: 10)
        }
        state.withLock { s in
            if s.stdout >= 0 { close(s.stdout); s.stdout = -1 }
        }
    }

    private typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    private static let closeFrom: CloseFrom? = {
        dlsym(dlopen(nil, RTLD_NOW), "posix_spawn_file_actions_addclosefrom_np").map { unsafeBitCast($0, to: CloseFrom.self) }
    }()

    /// Sends `signal` unless the process has been reaped already.
    public func signal(_ signal: Int32) {
        state.withLock { s in
            if s.exit == nil { Glibc.kill(pid, signal) }
        }
    }

    /// How it ended, once reaped (nil while running).
    public var exit: ProcessExit? { state.withLock { $0.exit } }

    /// Waits (polling) until the process ends, up to `timeout` seconds; reaps it.
    @discardableResult
    public func waitForExit(timeout: Double) -> ProcessExit? {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let result: ProcessExit? = state.withLock { s in
                if let e = s.exit { return e }
                var status: Int32 = 0
                let r = waitpid(pid, &status, WNOHANG)
                guard r == pid else { return nil }
                // WIFEXITED / WEXITSTATUS / WTERMSIG, which Swift does not import as macros.
                let e: ProcessExit = (status & 0x7f) == 0 ? .exited((status >> 8) & 0xff) : .signaled(status & 0x7f)
                s.exit = e
                if s.stdout >= 0 { close(s.stdout); s.stdout = -1 }
                return e
            }
            if let result { return result }
            if Date() >= deadline { return nil }
            usleep(2_000)
        }
    }

    /// SIGKILL, then reap.
    public func killNow() {
        signal(SIGKILL)
        waitForExit(timeout: 30)
    }

    /// The server's stderr so far (its tail).
    public func logTail(_ count: Int = 4000) -> String {
        String(((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "").suffix(count))
    }

    /// One blocking request on a fresh connection; never throws, says what happened.
    public func exchange(_ method: String, _ path: String, json: String? = nil, timeout: Double = 10) -> HTTPOutcome {
        HTTPExchange.run(port: port, method: method, path: path, body: json.map { Array($0.utf8) }, timeout: timeout)
    }

    /// One blocking request; throws unless a complete answer came.
    public func request(_ method: String, _ path: String, json: String? = nil, timeout: Double = 10) throws -> TestResponse {
        let outcome = exchange(method, path, json: json, timeout: timeout)
        guard let r = outcome.response else { throw TestClientError("\(method) \(path): \(outcome)") }
        return r
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
