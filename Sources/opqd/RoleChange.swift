import Locking
import Logging
import OpqdApp
import QueueAPI
import QueueCluster

#if canImport(Glibc)
import Glibc
#endif

/// A cluster instance's role change, asked for by the service from any thread and carried out
/// on the main thread: `request` records it and raises SIGUSR1, which the main thread's
/// `sigwait` receives; it then hands the listening socket over and re-executes this binary
/// (`reexecute`), which starts again in the new role with the same pid, arguments and port.
enum RoleChanges {
    private static let pending = Locking.Lock<RoleChange?>(nil)
    /// This instance's id, kept across images.
    nonisolated(unsafe) static var instanceID = ""
    /// The `--data` identity lock's descriptor, kept across images (`ClusterHandoff`).
    nonisolated(unsafe) static var identityLock: Int32?

    static func request(_ change: RoleChange) {
        let first = pending.withLock { p -> Bool in
            guard p == nil else { return false }
            p = change
            return true
        }
        if first { kill(getpid(), SIGUSR1) }
    }

    static var requested: RoleChange? { pending.withLock { $0 } }

    /// Replaces this process image with a fresh one of the same binary. Every descriptor but
    /// stdio and the listening socket is closed on exec (libpq's and libcurl's sockets, files,
    /// pipes of commands), so the next image starts with nothing of this one but the socket.
    /// Returns only if `execv` failed, after logging why (the caller then stops).
    static func reexecute(_ change: RoleChange, socket: Int32?, logger: Logger) {
        var handoff = ClusterHandoff(instanceID: instanceID, epoch: nil, token: nil, listenSocket: socket, identityLock: identityLock)
        if case let .becomeOwner(epoch, token) = change {
            handoff.epoch = epoch
            handoff.token = token
        }
        for name in ClusterHandoff.variables { unsetenv(name) }
        for (name, value) in handoff.environment() { setenv(name, value, 1) }
        if let dir = opendir("/proc/self/fd") {
            var fds: [Int32] = []
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                if let fd = Int32(name), fd > 2, fd != socket, fd != identityLock { fds.append(fd) }
            }
            closedir(dir)
            for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        }
        if let socket { _ = fcntl(socket, F_SETFD, 0) }
        if let identityLock { _ = fcntl(identityLock, F_SETFD, 0) }
        fflush(nil)
        let args = CommandLine.arguments.map { strdup($0) } + [nil]
        execv("/proc/self/exe", args)
        logger.critical("cannot re-execute opqd for its role change", metadata: ["errno": "\(errno)"])
    }
}
