import CSystem

#if canImport(Glibc)
import Glibc
#endif

/// Where a child's standard output or error goes.
public enum SpawnOutput: Sendable, Equatable {
    /// /dev/null.
    case null
    /// The parent's own descriptor.
    case inherit
    /// A new close-on-exec pipe; the parent gets its read end (``SpawnedProcess``).
    case pipe
    /// A file, created if missing (mode 0644), appended to or truncated.
    case file(String, append: Bool)
    /// An open descriptor of the parent (dup2'd onto the child's).
    case descriptor(Int32)
}

/// What to start and how.
public struct SpawnRequest: Sendable {
    /// The executable's path, or its name when ``searchPath`` is set.
    public var executable: String
    /// The whole argument vector, `argv[0]` included.
    public var argv: [String]
    /// `NAME=value` entries replacing the child's environment; nil keeps the parent's.
    public var environment: [String]?
    /// The child's working directory; nil keeps the parent's.
    public var directory: String?
    /// Looks `executable` up in `PATH` (`posix_spawnp`).
    public var searchPath = false
    /// Puts the child in a new process group of its own (its pid), so one `kill(-pid)` reaches
    /// it and everything it starts.
    public var newProcessGroup = false
    /// stdin is /dev/null unless this is set (then the parent's).
    public var inheritStdin = false
    public var stdout: SpawnOutput = .null
    public var stderr: SpawnOutput = .null
    /// Closes every descriptor above 2 in the child, so it holds none of the parent's sockets
    /// or pipes that were opened without close-on-exec (by another thread, at any moment).
    public var closeOtherDescriptors = true

    /// `argv[0]` is the executable.
    public init(_ argv: [String], environment: [String]? = nil, directory: String? = nil) {
        self.executable = argv.first ?? ""
        self.argv = argv
        self.environment = environment
        self.directory = directory
    }
}

/// A started child: its pid and the read ends of the pipes asked for (the caller closes them
/// and reaps the child).
public struct SpawnedProcess: Sendable {
    public let pid: pid_t
    public let stdout: Int32?
    public let stderr: Int32?
}

/// Why nothing was started (no descriptor is left open then).
public enum SpawnError: Error, Sendable, CustomStringConvertible {
    /// `pipe2` failed with this errno.
    case pipe(Int32)
    /// This C library cannot set a child's working directory.
    case directoryUnsupported
    /// `posix_spawn` failed with this error number.
    case spawn(Int32)

    public var description: String {
        switch self {
        case let .pipe(e): "cannot create a pipe: \(String(cString: strerror(e)))"
        case .directoryUnsupported: "this C library cannot set a child's working directory"
        case let .spawn(e): String(cString: strerror(e))
        }
    }
}

/// `posix_spawn` with the GNU extensions (close-from, chdir) from ``CSystem``: the one process
/// spawner of the product (CommandKind) and of the tests and benchmarks.
///
/// The child starts with an empty signal mask and every signal at its default action: a
/// server blocks SIGTERM in its threads and posix_spawn would otherwise pass that mask on.
public enum Spawner {
    public static func spawn(_ request: SpawnRequest) throws(SpawnError) -> SpawnedProcess {
        var opened: [Int32] = []
        func closeAll() { for fd in opened { close(fd) } }
        func makePipe() throws(SpawnError) -> (read: Int32, write: Int32) {
            var fds: [Int32] = [-1, -1]
            guard csystem_pipe_cloexec(&fds) == 0 else {
                let e = errno
                closeAll()
                throw .pipe(e)
            }
            opened += fds
            return (fds[0], fds[1])
        }
        let out = request.stdout == .pipe ? try makePipe() : nil
        let err = request.stderr == .pipe ? try makePipe() : nil

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        if !request.inheritStdin { posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0) }
        for (target, output, pipe) in [(Int32(1), request.stdout, out), (Int32(2), request.stderr, err)] {
            switch output {
            case .null: posix_spawn_file_actions_addopen(&actions, target, "/dev/null", O_WRONLY, 0)
            case .inherit: break
            case .pipe: if let pipe { posix_spawn_file_actions_adddup2(&actions, pipe.write, target) }
            case let .file(path, append):
                posix_spawn_file_actions_addopen(&actions, target, path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0o644)
            case let .descriptor(fd): posix_spawn_file_actions_adddup2(&actions, fd, target)
            }
        }
        // After the dup2s: closes the pipes' originals and anything else not close-on-exec.
        // Without the extension (ENOSYS) the pipes are still close-on-exec.
        if request.closeOtherDescriptors { _ = csystem_spawn_addclosefrom(&actions, 3) }
        if let directory = request.directory, csystem_spawn_addchdir(&actions, directory) == ENOSYS {
            closeAll()
            throw .directoryUnsupported
        }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        let group = request.newProcessGroup ? POSIX_SPAWN_SETPGROUP : 0
        posix_spawnattr_setflags(&attributes, Int16(group | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        posix_spawnattr_setpgroup(&attributes, 0)
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigdefault(&attributes, &all)

        let argv = request.argv.map { strdup($0) } + [nil]
        let envp = request.environment.map { $0.map { strdup($0) } + [nil] }
        defer {
            argv.forEach { free($0) }
            envp?.forEach { free($0) }
        }
        var pid: pid_t = 0
        let rc: Int32
        switch (request.searchPath, envp) {
        case (false, let envp?): rc = posix_spawn(&pid, request.executable, &actions, &attributes, argv, envp)
        case (false, nil): rc = posix_spawn(&pid, request.executable, &actions, &attributes, argv, environ)
        case (true, let envp?): rc = posix_spawnp(&pid, request.executable, &actions, &attributes, argv, envp)
        case (true, nil): rc = posix_spawnp(&pid, request.executable, &actions, &attributes, argv, environ)
        }
        for pipe in [out, err] { if let pipe { close(pipe.write) } }
        guard rc == 0 else {
            for pipe in [out, err] { if let pipe { close(pipe.read) } }
            throw .spawn(rc)
        }
        return SpawnedProcess(pid: pid, stdout: out?.read, stderr: err?.read)
    }

    /// A raw wait status as exit code or signal (WIFEXITED, WEXITSTATUS and WTERMSIG are
    /// macros Swift does not import).
    public static func decode(_ status: Int32) -> (exitCode: Int32?, signal: Int32?) {
        status & 0x7f == 0 ? ((status >> 8) & 0xff, nil) : (nil, status & 0x7f)
    }
}
