import Dispatch
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import QueueEngine
import Locking

/// `command` `{"argv": [...], "env"?, "cwd"?, "timeout"?}`: runs one process, without a shell.
///
/// Off unless the server allows the executable: `argv[0]` must be an absolute path listed in
/// ``KindsConfiguration/allowCommands`` (exact string match, symlinks are not resolved).
///
/// The child is started with `posix_spawn` in a process group of its own, with stdin
/// `/dev/null`, stdout and stderr on close-on-exec pipes, every other descriptor closed
/// (`closefrom(3)`), an empty signal mask and default signal dispositions (the server blocks
/// SIGINT/SIGTERM, which children would otherwise inherit). Its whole environment is `env`
/// plus `PATH=/usr/bin:/bin` unless `env` sets `PATH`.
///
/// One thread per child drains both pipes continuously (a chatty child never blocks) keeping
/// the last ``tailCap`` bytes of each, and reaps the child; no signal handlers are installed.
///
/// - Cancel: SIGTERM to the process group, SIGKILL after ``killGrace`` seconds; it finishes
///   when the child has exited. Survivors of the group are SIGKILLed when the leader exits.
/// - Pause: SIGSTOP to the group; resume: SIGCONT (the same process continues). A resume
///   that finds no process (the server restarted) starts a new one.
/// - `timeout` (default 30 s, paused time not counted) stops it like cancel, failing `timeout`.
///
/// The result is `{"exitCode", "signal", "stdout", "stderr", "stdoutBytes", "stderrBytes",
/// "truncated"}`. Exit status 0 succeeds; otherwise it fails `exit-status` or `signal` with the
/// result as `data`; a process that cannot be started fails `spawn-failed`.
public final class CommandKind: OperationKind {
    /// Bytes of each of stdout and stderr a result keeps (the last 64 KiB).
    public static let tailCap = 64 * 1024
    /// Seconds between SIGTERM and SIGKILL when stopping a child.
    public static let killGrace = 2.0
    /// Seconds a command may run when the spec gives no `timeout`.
    public static let defaultTimeout = 30.0
    /// `PATH` of the child unless its `env` sets one.
    public static let defaultPath = "/usr/bin:/bin"

    private let configuration: KindsConfiguration
    private let runs = Lock<[OperationID: CommandRun]>([:])
    /// Pauses that came while the operation's child was being spawned (no run registered yet):
    /// applied as soon as the run is registered, so the child is stopped, not left running.
    private let earlyPauses = Lock<Set<OperationID>>([])
    /// `configuration.maxCommands` children at once; the others wait for a slot.
    private let slots: ProcessSlots

    /// A kind that may run the executables `configuration.allowCommands` lists.
    public init(_ configuration: KindsConfiguration) {
        self.configuration = configuration
        self.slots = ProcessSlots(limit: configuration.maxCommands)
    }

    /// Whether `path` may be run as `argv[0]` on this server: an exact match with one of
    /// `allowCommands` (no symlink resolution, no `PATH` lookup).
    public static func isAllowed(_ path: String, in config: KindsConfiguration) -> Bool {
        path.utf8.first == UInt8(ascii: "/") && config.allowCommands.contains(path)
    }

    // MARK: - spec

    /// Checks argv, env, cwd and timeout; refuses an executable this server does not allow
    /// with field `spec.argv[0]` (the API answers 403 when ``isAllowed(_:in:)`` is false).
    public func validate(spec: JSONValue?) throws(EngineError) {
        let parsed = try CommandSpec(spec)
        guard Self.isAllowed(parsed.argv[0], in: configuration) else {
            let allowed = configuration.allowCommands.isEmpty
                ? "none (the command kind is off; see allowCommands)"
                : configuration.allowCommands.joined(separator: ", ")
            throw .invalidArgument(field: "spec.argv[0]", detail: "executable \(parsed.argv[0]) is not allowed on this server; allowed: \(allowed)")
        }
        if let cwd = parsed.cwd {
            var st = stat()
            guard stat(cwd, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else {
                throw .invalidArgument(field: "spec.cwd", detail: "\(cwd) is not an existing directory")
            }
        }
    }

    // MARK: - running

    /// Spawns the process, or SIGCONTs the stopped one when `context.isResume`.
    public func start(_ context: ExecutionContext) {
        // A new start ends any earlier pause: a mark left by one must not stop this run.
        earlyPauses.withLock { _ = $0.remove(context.operation) }
        if context.isResume {
            let run = runs.withLock { $0[context.operation] }
            if let run, run.attempt == context.attempt, run.resume() { return }
        }
        slots.run(context.operation, attempt: context.attempt) { [self] in launch(context) }
    }

    /// Spawns the child in a slot; false when nothing was started (the slot is free again).
    private func launch(_ context: ExecutionContext) -> Bool {
        // Cancelled, paused or timed out while it waited for its slot: nothing to start.
        guard context.isCurrent else { return false }
        let spec: CommandSpec
        do { spec = try CommandSpec(context.spec) } catch {
            context.finish(.failed(type: "invalid-spec", detail: HTTPKind.describe(error)))
            return false
        }
        guard Self.isAllowed(spec.argv[0], in: configuration) else {
            context.finish(.failed(type: "spawn-failed", detail: "executable \(spec.argv[0]) is no longer allowed on this server"))
            return false
        }
        let pid: pid_t
        let out: Int32, err: Int32
        switch Spawn.run(spec) {
        case let .failure(message):
            context.finish(.failed(type: "spawn-failed", detail: message))
            return false
        case let .success(p, o, e):
            (pid, out, err) = (p, o, e)
        }
        let run = CommandRun(context: context, pid: pid, timeout: spec.timeout)
        if let identity = ProcessIdentity(pid: pid) { context.save(identity.json) }
        let replaced = runs.withLock { $0.updateValue(run, forKey: context.operation) }
        replaced?.stop(.cancelled)
        if earlyPauses.withLock({ $0.remove(context.operation) != nil }) {
            // Paused while it was being spawned: stop it now; resume finds it and SIGCONTs it.
            run.pause()
        } else if !context.isCurrent {
            // A cancel that came between taking the slot and registering the run found no
            // process and finished the operation: this child must not run on unsupervised.
            run.stop(.cancelled)
        }
        run.armTimeout()
        Thread.detachNewThread { [weak self] in
            let completion = run.watch(out: out, err: err)
            // Report before forgetting the run: a resume racing this finds the run (exited)
            // and waits for this report instead of starting a second process.
            context.finish(completion)
            self?.runs.withLock { map in
                if map[context.operation] === run { map[context.operation] = nil }
            }
            self?.slots.release()
        }
        return true
    }

    /// SIGTERM to the process group, SIGKILL after ``killGrace``; reports once the child is gone.
    public func cancel(_ context: ExecutionContext) {
        earlyPauses.withLock { _ = $0.remove(context.operation) }
        let run = runs.withLock { $0[context.operation] }
        if let run, run.attempt == context.attempt {
            run.stop(.cancelled)
        } else if slots.withdraw(context.operation, attempt: context.attempt) {
            context.finish(.failed(type: "cancelled", detail: "cancelled while waiting for a process slot (--max-commands)"))
        } else {
            context.finish(.failed(type: "cancelled", detail: "no process was running"))
        }
    }

    /// SIGSTOP to the process group.
    public func pause(_ context: ExecutionContext) {
        let run = runs.withLock { $0[context.operation] }
        if let run, run.attempt == context.attempt {
            run.pause()
        } else if !slots.withdraw(context.operation, attempt: context.attempt) {
            // Not waiting for a slot either: its child is being spawned right now.
            earlyPauses.withLock { _ = $0.insert(context.operation) }
            // Registered meanwhile? Then no launch will look at the mark: pause it here.
            if let run = runs.withLock({ $0[context.operation] }), run.attempt == context.attempt,
               earlyPauses.withLock({ $0.remove(context.operation) != nil }) {
                run.pause()
            }
        }
        // (Waiting for a slot: it left the line; resume starts it again, and it waits again.)
    }

    /// After a restart the children of the previous server process are orphans still running:
    /// the one this operation started (recognised by pid, start time and boot id) is killed
    /// with its process group, then the default applies (retry if allowed, else `interrupted`).
    public func recover(_ operation: OperationSnapshot) -> Recovery {
        if let saved = operation.kindState.flatMap(ProcessIdentity.init(json:)),
           let now = ProcessIdentity(pid: saved.pid), now == saved {
            kill(-saved.pid, SIGKILL)
            kill(saved.pid, SIGKILL)
        }
        if let r = operation.options.retry, operation.attempt < r.maxAttempts { return .retry }
        return .fail("interrupted")
    }
}

// MARK: - spec

/// A checked `command` spec.
struct CommandSpec: Sendable {
    var argv: [String]
    var env: [(String, String)]
    var cwd: String?
    var timeout: Double

    static let fields = ["argv", "env", "cwd", "timeout"]

    init(_ spec: JSONValue?) throws(EngineError) {
        let shape = "{\"argv\": [\"/absolute/path\", ...], \"env\"?, \"cwd\"?, \"timeout\"?}"
        guard let spec else { throw .invalidArgument(field: "spec", detail: "kind command needs a spec \(shape)") }
        guard case let .object(members) = spec else {
            throw .invalidArgument(field: "spec", detail: "must be an object \(shape); got \(spec.typeName)")
        }
        for (k, _) in members where !Self.fields.contains(k) {
            throw .invalidArgument(field: "spec.\(k)", detail: "unknown field; kind command allows \(Self.fields.joined(separator: ", "))")
        }
        guard let a = spec["argv"] else {
            throw .invalidArgument(field: "spec.argv", detail: "is required: a non-empty array of strings, the first an absolute path")
        }
        guard case let .array(items) = a, !items.isEmpty else {
            throw .invalidArgument(field: "spec.argv", detail: "must be a non-empty array of strings, the first an absolute path; got \(a.text)")
        }
        argv = []
        for (i, item) in items.enumerated() {
            guard case let .string(s) = item else {
                throw .invalidArgument(field: "spec.argv[\(i)]", detail: "must be a string; got \(item.typeName)")
            }
            guard !s.utf8.contains(0) else { throw .invalidArgument(field: "spec.argv[\(i)]", detail: "must not contain NUL") }
            argv.append(s)
        }
        guard argv[0].utf8.first == UInt8(ascii: "/") else {
            throw .invalidArgument(field: "spec.argv[0]", detail: "must be an absolute path (no PATH lookup); got \(JSONValue.string(argv[0]).text)")
        }

        env = []
        if let e = spec["env"] {
            guard case let .object(pairs) = e else {
                throw .invalidArgument(field: "spec.env", detail: "must be an object of strings {\"NAME\": \"value\"}; got \(e.typeName)")
            }
            for (name, value) in pairs {
                guard !name.isEmpty, !name.utf8.contains(UInt8(ascii: "=")), !name.utf8.contains(0) else {
                    throw .invalidArgument(field: "spec.env", detail: "variable name \(JSONValue.string(name).text) must be non-empty without '=' or NUL")
                }
                guard case let .string(v) = value, !v.utf8.contains(0) else {
                    throw .invalidArgument(field: "spec.env.\(name)", detail: "must be a string without NUL; got \(value.text)")
                }
                env.append((name, v))
            }
        }

        cwd = nil
        if let c = spec["cwd"] {
            guard case let .string(path) = c, path.utf8.first == UInt8(ascii: "/"), !path.utf8.contains(0) else {
                throw .invalidArgument(field: "spec.cwd", detail: "must be an absolute path of an existing directory; got \(c.text)")
            }
            cwd = path
        }

        timeout = CommandKind.defaultTimeout
        if let t = spec["timeout"] { timeout = try HTTPSpec.timeout(t, field: "spec.timeout") }
    }

    /// The child's whole environment, `NAME=value` each.
    var environment: [String] {
        var out = env.map { "\($0.0)=\($0.1)" }
        if !env.contains(where: { $0.0 == "PATH" }) { out.append("PATH=\(CommandKind.defaultPath)") }
        return out
    }
}

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

/// Identifies a process across a server restart: pid, start time (clock ticks after boot,
/// from /proc/PID/stat) and the boot id, so a reused pid is never mistaken for it.
struct ProcessIdentity: Equatable {
    var pid: pid_t
    var startTicks: UInt64
    var boot: String

    init?(pid: pid_t) {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return nil }
        // Fields after the command name: state is field 3, starttime field 22.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 19, let start = UInt64(fields[19]) else { return nil }
        let boot = (try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8)) ?? ""
        self.pid = pid
        self.startTicks = start
        self.boot = boot.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    init?(json: JSONValue) {
        // Saved by this kind, but read back from the store: any number may come back.
        guard case let .number(p)? = json["pid"], case let .number(s)? = json["startTicks"],
              // pid >= 2 and whole: pid_t(0.5) is 0 and recover's kill(-pid) of 0 or -1 would
              // signal our own process group or every process.
              case let .string(b)? = json["bootId"], p >= 2, p < Double(Int32.max), p == p.rounded(),
              s >= 0, s < 18_446_744_073_709_551_616.0 else { return nil }
        pid = pid_t(p)
        startTicks = UInt64(s)
        boot = b
    }

    var json: JSONValue {
        .object([("pid", .number(Double(pid))), ("startTicks", .number(Double(startTicks))), ("bootId", .string(boot))])
    }
}

// MARK: - posix_spawn

/// `posix_spawn` with the GNU extensions Swift's Glibc module does not import
/// (`pipe2`, `posix_spawn_file_actions_addclosefrom_np`, `..._addchdir_np`), found with dlsym.
enum Spawn {
    enum Outcome {
        case success(pid: pid_t, out: Int32, err: Int32)
        case failure(String)
    }

    private typealias Pipe2 = @convention(c) (UnsafeMutablePointer<Int32>, Int32) -> Int32
    private typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    private typealias ChDir = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>) -> Int32

    private struct Extensions: @unchecked Sendable {
        var pipe2: Pipe2?
        var closeFrom: CloseFrom?
        var chdir: ChDir?
    }

    private static let extensions: Extensions = {
        let handle = dlopen(nil, RTLD_NOW)
        func symbol<T>(_ name: String, _ type: T.Type) -> T? {
            dlsym(handle, name).map { unsafeBitCast($0, to: type) }
        }
        return Extensions(pipe2: symbol("pipe2", Pipe2.self),
                          closeFrom: symbol("posix_spawn_file_actions_addclosefrom_np", CloseFrom.self),
                          chdir: symbol("posix_spawn_file_actions_addchdir_np", ChDir.self))
    }()

    /// A pipe whose both ends are close-on-exec.
    private static func makePipe() -> (read: Int32, write: Int32)? {
        var fds: [Int32] = [-1, -1]
        if let pipe2 = extensions.pipe2 {
            guard pipe2(&fds, O_CLOEXEC) == 0 else { return nil }
        } else {
            guard pipe(&fds) == 0 else { return nil }
            _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
            _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
        }
        return (fds[0], fds[1])
    }

    static func run(_ spec: CommandSpec) -> Outcome {
        guard let out = makePipe() else { return .failure("cannot create a pipe: \(String(cString: strerror(errno)))") }
        guard let err = makePipe() else {
            let e = errno
            close(out.read); close(out.write)
            return .failure("cannot create a pipe: \(String(cString: strerror(e)))")
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, out.write, 1)
        posix_spawn_file_actions_adddup2(&actions, err.write, 2)
        // After the dup2s: closes the pipes' originals and anything else not close-on-exec.
        _ = extensions.closeFrom?(&actions, 3)
        if let cwd = spec.cwd {
            guard let chdir = extensions.chdir else {
                for fd in [out.read, out.write, err.read, err.write] { close(fd) }
                return .failure("this C library cannot set a child's working directory")
            }
            _ = chdir(&actions, cwd)
        }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        posix_spawnattr_setpgroup(&attributes, 0)
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigdefault(&attributes, &all)

        let argv = spec.argv.map { strdup($0) } + [nil]
        let envp = spec.environment.map { strdup($0) } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, spec.argv[0], &actions, &attributes, argv, envp)
        close(out.write)
        close(err.write)
        guard rc == 0 else {
            close(out.read)
            close(err.read)
            let place = spec.cwd.map { " in \($0)" } ?? ""
            return .failure("cannot run \(spec.argv[0])\(place): \(String(cString: strerror(rc)))")
        }
        return .success(pid: pid, out: out.read, err: err.read)
    }
}
