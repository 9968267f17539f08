import Dispatch
import Foundation
import Spawning

#if canImport(Glibc)
import Glibc
#endif

/// A child process for tests and benchmarks, started with the `Spawning` module's `posix_spawn`.
///
/// Not Foundation's `Process`: on this toolchain `Process.run()` crashed the test runner
/// (a bad memcpy inside it) when tests in parallel started processes at the same moment.
public final class ChildProcess: @unchecked Sendable {  // used from one thread at a time
    public let pid: pid_t
    public let argv: [String]
    /// The read end of its stdout when that was `.pipe` (see `readLine`), else -1.
    public private(set) var stdoutFD: Int32
    private var pending: [UInt8] = []
    private var status: Int32?

    /// Starts `request`; its stdout pipe, if any, is read with `readLine`.
    public init(_ request: SpawnRequest) throws {
        do {
            let child = try Spawner.spawn(request)
            pid = child.pid
            stdoutFD = child.stdout ?? -1
            if let err = child.stderr { close(err) }
        } catch {
            throw TestClientError("cannot run \(request.executable): \(error)")
        }
        argv = request.argv
    }

    /// Starts `path` with `arguments`; stdin and stderr are /dev/null, stdout goes to `stdout`
    /// (a descriptor, default /dev/null). `environment` replaces the child's environment.
    public convenience init(_ path: String, _ arguments: [String], environment: [String: String]? = nil, stdout: Int32? = nil) throws {
        var request = SpawnRequest([path] + arguments, environment: environment.map { $0.map { "\($0.key)=\($0.value)" } })
        request.stdout = stdout.map { .descriptor($0) } ?? .null
        try self.init(request)
    }

    deinit { if stdoutFD >= 0 { close(stdoutFD) } }

    /// The next line of the child's stdout pipe, or nil at EOF or after `timeout` seconds.
    public func readLine(timeout: Double) -> String? {
        let deadline = monotonicSeconds() + timeout
        while true {
            if let nl = pending.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: pending[..<nl], as: UTF8.self)
                pending.removeFirst(nl + 1)
                return line
            }
            let left = deadline - monotonicSeconds()
            guard left > 0, stdoutFD >= 0 else { return nil }
            var p = pollfd(fd: stdoutFD, events: Int16(POLLIN), revents: 0)
            let r = Glibc.poll(&p, 1, Int32(min(left, 1) * 1000) + 1)
            if r < 0 && errno != EINTR { return nil }
            if r <= 0 { continue }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = read(stdoutFD, &chunk, chunk.count)
            if n <= 0 { return nil }
            pending.append(contentsOf: chunk[..<n])
        }
    }

    /// Its raw wait status once it exited (it is reaped then); nil while it runs.
    public func poll() -> Int32? {
        if let status { return status }
        var s: Int32 = 0
        if waitpid(pid, &s, WNOHANG) == pid { status = s }
        return status
    }

    /// False once the child has exited (it is reaped then).
    public var isRunning: Bool { poll() == nil }

    /// Waits for the child and returns its raw wait status.
    @discardableResult
    public func wait() -> Int32 {
        if let status { return status }
        var s: Int32 = 0
        while waitpid(pid, &s, 0) < 0 && errno == EINTR {}
        status = s
        return s
    }

    /// Waits up to `timeout` seconds for the exit; its raw wait status, or nil if it still runs.
    @discardableResult
    public func wait(timeout: Double) -> Int32? {
        let deadline = monotonicSeconds() + timeout
        while monotonicSeconds() < deadline {
            if let s = poll() { return s }
            usleep(10_000)
        }
        return poll()
    }

    public func signal(_ signal: Int32) { if status == nil { kill(pid, signal) } }

    /// SIGTERM, then SIGKILL after `grace` seconds; reaps it. True if SIGTERM was enough.
    @discardableResult
    public func stop(grace: Double = 10) -> Bool {
        defer { if stdoutFD >= 0 { close(stdoutFD); stdoutFD = -1 } }
        guard poll() == nil else { return true }
        kill(pid, SIGTERM)
        if wait(timeout: grace) != nil { return true }
        kill(pid, SIGKILL)
        wait()
        return false
    }

    /// SIGKILL, then reap.
    public func killNow() {
        signal(SIGKILL)
        wait()
        if stdoutFD >= 0 { close(stdoutFD); stdoutFD = -1 }
    }

    /// The signal that ended it, or nil when it exited (waits for it).
    public var terminatingSignal: Int32? { Spawner.decode(wait()).signal }

    /// Its exit code, or nil when a signal ended it (waits for it).
    public var exitCode: Int32? { Spawner.decode(wait()).exitCode }

    /// Runs `path` to the end and returns its exit code (nil when a signal ended it) and
    /// standard output; its stderr goes to `stderr`.
    public static func capture(_ path: String, _ arguments: [String], stderr: SpawnOutput = .null) throws -> (exitCode: Int32?, output: [UInt8]) {
        var request = SpawnRequest([path] + arguments)
        request.stdout = .pipe
        request.stderr = stderr
        let child = try ChildProcess(request)
        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(child.stdoutFD, &buffer, buffer.count)
            if n > 0 { output.append(contentsOf: buffer[0..<n]); continue }
            if n < 0 && errno == EINTR { continue }
            break
        }
        return (child.exitCode, output)
    }
}
