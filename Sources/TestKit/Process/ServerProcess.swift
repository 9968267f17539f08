import Foundation
import Locking
import Spawning

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
    /// From a raw wait status.
    public init(status: Int32) {
        let (code, signal) = Spawner.decode(status)
        self = code.map { .exited($0) } ?? .signaled(signal ?? 0)
    }
    public var description: String {
        switch self {
        case let .exited(code): "exited with status \(code)"
        case let .signaled(signal): "killed by signal \(signal)"
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

    /// Starts `binary --host 127.0.0.1 --port 0 --data <data> --log-level <logLevel> <extra>`;
    /// throws (with the log) if it does not print its listening line within `timeout`. The child
    /// gets this process's environment without its OPQD_* settings (which would change the server)
    /// unless `keepOpqdSettings`, with `environment` set over it.
    public init(
        binary: String, data: String, logPath: String, extraArguments: [String] = [], timeout: Double = 30,
        logLevel: String = "warning", keepOpqdSettings: Bool = false, environment extra: [String: String] = [:]
    ) throws {
        let arguments = [binary, "--host", "127.0.0.1", "--port", "0", "--data", data, "--log-level", logLevel] + extraArguments
        let environment = ProcessInfo.processInfo.environment.filter { keepOpqdSettings || !$0.key.hasPrefix("OPQD_") }
            .merging(extra) { _, new in new }
        var request = SpawnRequest(arguments, environment: environment.map { "\($0.key)=\($0.value)" })
        request.stdout = .pipe
        request.stderr = .file(logPath, append: true)
        // Tests run in parallel in this process and open sockets without close-on-exec: the
        // child must not hold any of them open (closeOtherDescriptors, on by default).
        let started = Date()
        let child: SpawnedProcess
        do {
            child = try Spawner.spawn(request)
        } catch {
            throw TestClientError("cannot run \(binary): \(error)")
        }
        let pid = child.pid
        guard let stdout = child.stdout else { throw TestClientError("no pipe for \(binary)'s stdout") }
        let fds = [stdout]

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
            throw TestClientError(
                "opqd printed no listening line within \(timeout) s (got \(String(decoding: line, as: UTF8.self).debugDescription)); log:\n\(log.suffix(4000))")
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
                let e = ProcessExit(status: status)
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
