import Foundation
import Locking
import QueueEngine
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

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
    /// The kill grace, and a second for the child to be reaped.
    public var stopGrace: Double { Self.killGrace + 1 }
    /// Seconds a command may run when the spec gives no `timeout`.
    public static let defaultTimeout = 30.0
    /// `PATH` of the child unless its `env` sets one.
    public static let defaultPath = "/usr/bin:/bin"

    private let configuration: KindsConfiguration
    private let runs = Lock<[OperationID: CommandRun]>([:])
    /// Set once by `killAllForHandover`: nothing is spawned any more.
    private let handingOver = Atomic<Bool>(false)
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

    /// An `argv[0]` this server does not allow is refused whatever else the spec says.
    public func permit(spec: JSONValue?) throws(EngineError) {
        if case let .array(argv)? = spec?["argv"], case let .string(exe)? = argv.first, !Self.isAllowed(exe, in: configuration) {
            throw notAllowed(exe)
        }
    }

    private func notAllowed(_ exe: String) -> EngineError {
        let allowed =
            configuration.allowCommands.isEmpty
            ? "none (start opqd with --allow-command PATH)"
            : configuration.allowCommands.joined(separator: ", ")
        return .notPermitted(
            field: "spec.argv[0]", reason: "command-not-allowed",
            detail: "executable '\(exe)' is not allowed on this server; allowed: \(allowed)")
    }

    /// Refuses an executable this server does not allow (`.notPermitted`, 403
    /// `command-not-allowed`) before anything else about the spec: whatever else is wrong with
    /// it, it would not run here. Then checks argv, env, cwd and timeout.
    public func validate(spec: JSONValue?) throws(EngineError) {
        try permit(spec: spec)
        let parsed = try CommandSpec(spec)
        guard Self.isAllowed(parsed.argv[0], in: configuration) else { throw notAllowed(parsed.argv[0]) }
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
        // Cancelled, paused or timed out while it waited for its slot: nothing to start. Nor
        // once this cluster owner is handing its queues over.
        guard context.isCurrent, !handingOver.load(ordering: .sequentiallyConsistent) else { return false }
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
        if handingOver.load(ordering: .sequentiallyConsistent) { kill(-pid, SIGKILL) }
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

    /// SIGKILL to the process group of every child now running (their operations are reported
    /// failed, in commits the fence refuses), and no child spawned after it: for a
    /// cluster owner that lost its queues and is about to re-execute itself. The next owner
    /// runs these operations again (a new attempt), so none may run on here unsupervised.
    public func killAllForHandover() {
        // First: no launch after this one spawns (a killed child frees its slot, which would
        // launch the next waiting command), and one that registers its run after the snapshot
        // below kills its own child (`launch`).
        handingOver.store(true, ordering: .sequentiallyConsistent)
        let pids = runs.withLock { $0.values.map(\.pid) }
        for pid in pids where pid > 0 { kill(-pid, SIGKILL) }
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
                earlyPauses.withLock({ $0.remove(context.operation) != nil })
            {
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
            let now = ProcessIdentity(pid: saved.pid), now == saved
        {
            kill(-saved.pid, SIGKILL)
            kill(saved.pid, SIGKILL)
        }
        if let r = operation.options.retry, operation.attempt < r.maxAttempts { return .retry }
        return .fail("interrupted")
    }
}
