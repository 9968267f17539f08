import QueueAPI

#if canImport(Glibc)
import Glibc
#endif

/// Which id a cluster instance goes by (`PGMembership.instanceID`). The same id after a
/// restart lets the instance take back at once the partitions its previous process still held
/// (`PGMembership.claim`), and keeps the partitions it is given by rendezvous hashing, so a
/// rolling restart moves each queue away and back once, and a crashed instance started again
/// does not wait for its own leases to run out.
///
/// Taking back a live lease is safe only when the previous process is gone, so an id is used by
/// one live process at a time:
/// - `--instance-id` is the operator's promise (a container's stable name, a StatefulSet's
///   ordinal);
/// - otherwise the id is kept in `--data` (`cluster-instance-id`), and the directory is
///   locked (`flock` on `cluster-instance.lock`, released by the kernel when the process
///   ends, whatever the way): a second process on the same directory gets a fresh id.
public enum InstanceIdentity {
    /// The id file and the lock, inside the data directory.
    static let idFile = "cluster-instance-id"
    static let lockFile = "cluster-instance.lock"

    /// The id: `explicit` when set; else the one kept in `data`, under its lock; else a fresh
    /// one (the directory cannot be made, read or written, or another process holds it).
    /// `note` hears why a fresh one was taken. `lock`: the lock's descriptor, open for the
    /// process's life; a role change's `execv` passes it on (`ClusterHandoff.identityLock`),
    /// and children never get it (the spawner closes every descriptor above 2).
    public static func resolve(explicit: String?, data: String, note: (String) -> Void) -> (id: String, lock: Int32?) {
        if let explicit { return (explicit, nil) }
        guard !data.isEmpty else { return (ClusterHandoff.newInstanceID(), nil) }
        _ = mkdir(data, 0o700)
        let lock = open(data + "/" + lockFile, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard lock >= 0 else {
            note("cannot open \(data)/\(lockFile) (\(String(cString: strerror(errno)))): this instance takes a fresh identity")
            return (ClusterHandoff.newInstanceID(), nil)
        }
        guard flock(lock, LOCK_EX | LOCK_NB) == 0 else {
            close(lock)
            note("another process uses --data \(data): this instance takes a fresh identity")
            return (ClusterHandoff.newInstanceID(), nil)
        }
        let path = data + "/" + idFile
        if let kept = read(path), OpqdConfiguration.isInstanceID(kept) { return (kept, lock) }
        let id = ClusterHandoff.newInstanceID()
        guard write(id, to: path) else {
            note("cannot keep the instance's identity in \(path): it is fresh at every start")
            close(lock)
            return (id, nil)
        }
        return (id, lock)
    }

    /// The next image after a role change: the lock it was handed is taken again (the same
    /// open file, so it is still this process's). False when it cannot be: the id must not be
    /// used then.
    public static func retake(_ lock: Int32) -> Bool {
        flock(lock, LOCK_EX | LOCK_NB) == 0
    }

    /// The file's first line, at most 128 bytes read.
    static func read(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 128)
        let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return nil }
        let line = buffer[..<n].prefix { $0 != 0x0A && $0 != 0x0D }
        return String(decoding: line, as: UTF8.self)
    }

    /// Writes `id` and a newline to a temporary file, syncs it and renames it over `path`.
    static func write(_ id: String, to path: String) -> Bool {
        let temporary = path + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return false }
        let bytes = Array((id + "\n").utf8)
        let written = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        let synced = fsync(fd) == 0
        close(fd)
        guard written == bytes.count, synced, rename(temporary, path) == 0 else {
            unlink(temporary)
            return false
        }
        return true
    }
}
