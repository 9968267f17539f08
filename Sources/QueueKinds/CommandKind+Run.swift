import Dispatch
import Locking
import QueueEngine

#if canImport(Glibc)
import Glibc
#endif

// MARK: - one process

/// Why a child is being stopped by the server.
enum StopReason: Sendable { case cancelled, timeout }

/// One running child. Signals go to its process group only while the child is unreaped, so
/// the group id cannot have been reused.
final class CommandRun: Sendable {
    struct State: Sendable {
        /// The leader has exited (it may be a zombie about to be reaped); no more signals.
        var exited = false
        var stopping: StopReason?
        var paused = false
        /// Running seconds left before `timeout`.
        var timeLeft: Double
        var runningSince = DispatchTime.now()
        var timerGeneration: UInt64 = 0
    }

    let context: ExecutionContext
    let pid: pid_t
    let timeout: Double
    var attempt: Int { context.attempt }
    private let state: Lock<State>

    init(context: ExecutionContext, pid: pid_t, timeout: Double) {
        self.context = context
        self.pid = pid
        self.timeout = timeout
        state = Lock(State(timeLeft: timeout))
    }

    /// Sends `signal` to the process group if the leader is not reaped yet. Call under the lock.
    private func signalGroup(_ s: inout State, _ signal: Int32) {
        guard !s.exited else { return }
        if kill(-pid, signal) != 0 { kill(pid, signal) }
    }

    /// Starts the timeout clock for the time left.
    func armTimeout() {
        let (generation, left) = state.withLock { s in
            s.timerGeneration += 1
            s.runningSince = .now()
            return (s.timerGeneration, s.timeLeft)
        }
        context.scheduler.after(seconds: left) { [weak self] in
            guard let self else { return }
            let due = self.state.withLock { $0.timerGeneration == generation && !$0.paused }
            if due { self.stop(.timeout) }
        }
    }

    /// SIGTERM (and SIGCONT, in case it is stopped) now, SIGKILL after the grace period.
    func stop(_ reason: StopReason) {
        let first = state.withLock { s -> Bool in
            guard s.stopping == nil else { return false }
            s.stopping = reason
            s.timerGeneration += 1
            signalGroup(&s, SIGTERM)
            signalGroup(&s, SIGCONT)
            return true
        }
        guard first else { return }
        context.scheduler.after(seconds: CommandKind.killGrace) { [self] in
            state.withLock { signalGroup(&$0, SIGKILL) }
        }
    }

    func pause() {
        state.withLock { s in
            guard !s.exited, !s.paused, s.stopping == nil else { return }
            signalGroup(&s, SIGSTOP)
            s.paused = true
            s.timerGeneration += 1
            let ran = Double(DispatchTime.now().uptimeNanoseconds - s.runningSince.uptimeNanoseconds) / 1e9
            s.timeLeft -= ran
        }
    }

    /// SIGCONT after a pause; false when there is no process to continue.
    func resume() -> Bool {
        let resumed = state.withLock { s -> Bool in
            // Exited or being stopped: its watcher reports; never start a second process.
            guard !s.exited, s.stopping == nil else { return true }
            if s.paused {
                signalGroup(&s, SIGCONT)
                s.paused = false
            }
            return true
        }
        if resumed { armTimeout() }
        return resumed
    }

    /// Drains both pipes until they close, reaps the child and returns its completion. Runs
    /// on the child's own thread; closes `out` and `err`.
    func watch(out: Int32, err: Int32) -> Completion {
        var tails = [OutputTail(), OutputTail()]
        var fds = [pollfd(fd: out, events: Int16(POLLIN), revents: 0), pollfd(fd: err, events: Int16(POLLIN), revents: 0)]
        var open = 2
        var status: Int32 = 0
        var exitedAt: UInt64?
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        defer { buffer.deallocate() }

        while true {
            if open > 0 {
                let n = poll(&fds, 2, exitedAt == nil ? 50 : 10)
                if n > 0 {
                    for i in 0..<2 where fds[i].fd >= 0 && fds[i].revents != 0 {
                        let r = read(fds[i].fd, buffer.baseAddress, buffer.count)
                        if r > 0 {
                            tails[i].append(UnsafeRawBufferPointer(rebasing: buffer[0..<r]))
                        } else if r == 0 || (errno != EINTR && errno != EAGAIN) {
                            close(fds[i].fd)
                            fds[i].fd = -1
                            open -= 1
                        }
                    }
                }
            }
            if exitedAt == nil {
                // Wait for the exit without reaping, so the group id stays ours while we mark it.
                var info = siginfo_t()
                info._sifields._kill.si_pid = 0
                let blocking = open == 0
                var rc: Int32
                repeat {
                    rc = waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT | (blocking ? 0 : WNOHANG))
                } while rc != 0 && errno == EINTR
                if rc != 0 || info._sifields._kill.si_pid != 0 {
                    state.withLock { s in
                        // Stragglers of a stopped command (a grandchild ignoring SIGTERM) go too.
                        if s.stopping != nil { signalGroup(&s, SIGKILL) }
                        s.exited = true
                    }
                    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
                    exitedAt = DispatchTime.now().uptimeNanoseconds
                }
            } else if open > 0, DispatchTime.now().uptimeNanoseconds - exitedAt! > 200_000_000 {
                // A background grandchild still holds the pipes: stop reading.
                for i in 0..<2 where fds[i].fd >= 0 { close(fds[i].fd); fds[i].fd = -1 }
                open = 0
            }
            if exitedAt != nil && open == 0 { break }
        }

        let stopping = state.withLock { $0.stopping }
        let exited = status & 0x7f == 0
        let code = exited ? Int((status >> 8) & 0xff) : nil
        let signal = exited ? nil : Int(status & 0x7f)
        let result = JSONValue.object([
            ("exitCode", code.map { .number(Double($0)) } ?? .null),
            ("signal", signal.map { .number(Double($0)) } ?? .null),
            ("stdout", .string(tails[0].text)),
            ("stderr", .string(tails[1].text)),
            ("stdoutBytes", .number(Double(tails[0].total))),
            ("stderrBytes", .number(Double(tails[1].total))),
            ("truncated", .bool(tails[0].truncated || tails[1].truncated)),
        ])
        let how = code.map { "exited with status \($0)" } ?? "was killed by signal \(signal ?? 0)\(signalName(signal ?? 0))"
        switch stopping {
        case .cancelled?:
            return .failed(type: "cancelled", detail: "stopped on request; the process \(how)", data: result)
        case .timeout?:
            return .failed(type: "timeout", detail: "ran longer than its timeout of \(HTTPSpec.format(timeout)) s; the process \(how)", data: result)
        case nil:
            if code == 0 { return .succeeded(result) }
            if code != nil { return .failed(type: "exit-status", detail: "the process \(how)", data: result) }
            return .failed(type: "signal", detail: "the process \(how)", data: result)
        }
    }

    private func signalName(_ s: Int) -> String {
        switch Int32(s) {
        case SIGTERM: return " (SIGTERM)"
        case SIGKILL: return " (SIGKILL)"
        case SIGINT: return " (SIGINT)"
        case SIGSEGV: return " (SIGSEGV)"
        case SIGABRT: return " (SIGABRT)"
        case SIGPIPE: return " (SIGPIPE)"
        default: return ""
        }
    }
}

/// The last `CommandKind.tailCap` bytes of a stream, and how many bytes it carried.
struct OutputTail {
    private var bytes: [UInt8] = []
    private(set) var total = 0

    mutating func append(_ chunk: UnsafeRawBufferPointer) {
        total += chunk.count
        bytes.append(contentsOf: chunk)
        if bytes.count > 4 * CommandKind.tailCap { bytes.removeFirst(bytes.count - CommandKind.tailCap) }
    }

    var truncated: Bool { total > CommandKind.tailCap }

    /// The tail as text (invalid UTF-8 replaced), starting at a character boundary.
    var text: String {
        var tail = bytes.suffix(CommandKind.tailCap)
        if truncated {
            while let first = tail.first, first & 0xC0 == 0x80 { tail = tail.dropFirst() }
        }
        return String(decoding: tail, as: UTF8.self)
    }
}
