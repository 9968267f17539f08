#if canImport(Glibc)
import Glibc
#endif

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
