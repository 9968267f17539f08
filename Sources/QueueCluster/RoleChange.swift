import Digest
import QueueAPI

#if canImport(Glibc)
import Glibc
#endif

/// How a cluster instance changes role. `main` re-executes the binary (same pid, same
/// arguments, the listening socket kept): becoming the owner starts from an empty process that
/// loads every queue from PostgreSQL with the restart rules, exactly like a restart; losing the
/// ownership drops everything the old owner held in memory (engine, kinds' timers, leases,
/// answers waiting for commits that the fence refused), which nothing short of a new process
/// guarantees.
public enum RoleChange: Sendable, Equatable {
    /// This instance won the ownership at `epoch` (it holds the lease row already; `token`
    /// proves it to the next image).
    case becomeOwner(epoch: Int64, token: String)
    /// Another instance owns the queues now (a fenced commit, or a renewal that found a newer
    /// epoch): forward to it.
    case becomeFollower
}

/// What one image of the process hands the next across `execv` (environment variables).
/// Nothing in it is trusted by itself: the epoch counts only with the token that only the
/// instance that won it knows (`PGMembership.confirm`), and the socket only when it is a
/// listening TCP socket.
public struct ClusterHandoff: Sendable {
    public var instanceID: String
    /// The epoch this instance won, and the token that proves it.
    public var epoch: Int64?
    public var token: String?
    public var listenSocket: Int32?
    /// The descriptor of the `--data` identity lock (`InstanceIdentity`), when the id came
    /// from there: kept open across `execv`, taken again by the next image.
    public var identityLock: Int32? = nil

    public init(instanceID: String, epoch: Int64?, token: String?, listenSocket: Int32?, identityLock: Int32? = nil) {
        self.identityLock = identityLock
        self.instanceID = instanceID
        self.epoch = epoch
        self.token = token
        self.listenSocket = listenSocket
    }

    static let instanceVariable = "OPQD_HANDOFF_INSTANCE"
    static let epochVariable = "OPQD_HANDOFF_EPOCH"
    static let tokenVariable = "OPQD_HANDOFF_TOKEN"
    static let socketVariable = "OPQD_HANDOFF_FD"
    static let lockVariable = "OPQD_HANDOFF_IDLOCK"

    /// Read from the environment; nil on a first start. Values that do not parse are ignored.
    public static func fromEnvironment(_ env: [String: String]) -> ClusterHandoff? {
        guard let id = env[instanceVariable], OpqdConfiguration.isInstanceID(id) else { return nil }
        let fd = env[socketVariable].flatMap { Int32($0) }.flatMap { isListeningSocket($0) ? $0 : nil }
        let lock = env[lockVariable].flatMap { Int32($0) }.flatMap { $0 > 2 && fcntl($0, F_GETFD) >= 0 ? $0 : nil }
        return ClusterHandoff(
            instanceID: id, epoch: env[epochVariable].flatMap { Int64($0) }, token: env[tokenVariable].flatMap { $0.isEmpty ? nil : $0 },
            listenSocket: fd, identityLock: lock)
    }

    /// A descriptor above stdio that is a listening stream socket.
    static func isListeningSocket(_ fd: Int32) -> Bool {
        guard fd > 2 else { return false }
        var accepting: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &length) == 0 && accepting == 1
    }

    /// The variables for the next image.
    public func environment() -> [(String, String)] {
        var out = [(Self.instanceVariable, instanceID)]
        if let epoch, let token {
            out.append((Self.epochVariable, String(epoch)))
            out.append((Self.tokenVariable, token))
        }
        if let listenSocket { out.append((Self.socketVariable, String(listenSocket))) }
        if let identityLock { out.append((Self.lockVariable, String(identityLock))) }
        return out
    }

    public static let variables = [instanceVariable, epochVariable, tokenVariable, socketVariable, lockVariable]

    /// A new instance's id: 96 random bits, 24 hex digits.
    public static func newInstanceID() -> String {
        var g = SystemRandomNumberGenerator()
        return SHA256.hex((0..<12).map { _ in UInt8.random(in: 0...255, using: &g) })
    }
}

/// The ownership was lost while this instance was still starting as the owner (a commit was
/// fenced, or the lease could not be renewed): `main` re-executes it as a follower.
public struct OwnershipLostDuringStart: Error, CustomStringConvertible {
    public init() {}

    public var description: String { "another instance took the queues over while this one was loading them" }
}

package func hex(_ n: UInt64) -> String {
    let s = String(n, radix: 16)
    return String(repeating: "0", count: max(0, 16 - s.count)) + s
}
