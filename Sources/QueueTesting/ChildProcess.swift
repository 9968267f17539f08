import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A child process started with `posix_spawn`, for tests.
///
/// Not Foundation's `Process`: on this toolchain `Process.run()` crashed the test runner
/// (a bad memcpy inside it) when tests in parallel started processes at the same moment.
public final class ChildProcess: @unchecked Sendable {  // used from one test at a time
    public let pid: pid_t
    private var status: Int32?

    /// Starts `path` with `arguments`; stdin is /dev/null, stdout goes to `stdout` (a descriptor,
    /// default /dev/null), stderr to /dev/null. `environment` replaces the child's environment.
    public init(_ path: String, _ arguments: [String], environment: [String: String]? = nil, stdout: Int32? = nil) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        if let stdout {
            posix_spawn_file_actions_adddup2(&actions, stdout, 1)
        } else {
            posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        }
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let envp: [UnsafeMutablePointer<CChar>?]? = environment.map { env in env.map { strdup("\($0.key)=\($0.value)") } + [nil] }
        defer { envp?.forEach { free($0) } }
        var child: pid_t = 0
        let rc: Int32
        if let envp {
            rc = posix_spawn(&child, path, &actions, nil, argv, envp)
        } else {
            rc = posix_spawn(&child, path, &actions, nil, argv, environ)
        }
        guard rc == 0 else { throw TestClientError("posix_spawn \(path) failed: \(String(cString: strerror(rc)))") }
        pid = child
    }

    /// False once the child has exited (it is reaped then).
    public var isRunning: Bool {
        if status != nil { return false }
        var s: Int32 = 0
        let r = waitpid(pid, &s, WNOHANG)
        if r == pid { status = s; return false }
        return r == 0
    }

    /// Waits for the child and returns its raw wait status.
    @discardableResult
    public func wait() -> Int32 {
        if let status { return status }
        var s: Int32 = 0
        while waitpid(pid, &s, 0) < 0 && errno == EINTR {}
        status = s
        return s
    }

    public func signal(_ signal: Int32) { kill(pid, signal) }

    /// The signal that ended it, or nil when it exited.
    public var terminatingSignal: Int32? {
        let s = wait() & 0x7f
        return s != 0 && s != 0x7f ? s : nil
    }

    /// Its exit code, or nil when a signal ended it.
    public var exitCode: Int32? { terminatingSignal == nil ? (wait() >> 8) & 0xff : nil }

    /// Runs `path` to the end and returns its exit code and standard output.
    public static func capture(_ path: String, _ arguments: [String]) throws -> (exitCode: Int32?, output: [UInt8]) {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw TestClientError("pipe failed: errno \(errno)") }
        // Close-on-exec on both ends, so children other tests start meanwhile do not keep the
        // write end open (and the read below would never see EOF); dup2 clears it for our child.
        _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
        let child: ChildProcess
        do {
            child = try ChildProcess(path, arguments, stdout: fds[1])
        } catch {
            close(fds[0]); close(fds[1])
            throw error
        }
        close(fds[1])
        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(fds[0], &buffer, buffer.count)
            if n > 0 { output.append(contentsOf: buffer[0..<n]); continue }
            if n < 0 && errno == EINTR { continue }
            break
        }
        close(fds[0])
        return (child.exitCode, output)
    }
}
