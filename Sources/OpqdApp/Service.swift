import Locking
import Logging
import PostgresStore
import QueueAPI
import QueueCluster

#if canImport(Glibc)
import Glibc
#endif

/// Starts the service the configuration asks for: with a PostgreSQL store, this instance
/// joins the cluster and becomes the owner (it won the lease, or won it in its previous image
/// and proves it with the token) or a follower; otherwise the single-instance service
/// (`buildApplication`). `roleChange` is called (once, from a background thread) when the role
/// must change. Throws `OwnershipLostDuringStart` when the ownership goes while loading.
public func buildService(
    configuration: OpqdConfiguration, logger: Logger, instanceID id: String, handoff: ClusterHandoff?,
    roleChange: @escaping @Sendable (RoleChange) -> Void
) throws -> any OpqdService {
    guard OpqdConfiguration.isPostgresURL(configuration.store) else {
        return try buildApplication(configuration: configuration, logger: logger)
    }
    if configuration.advertise == nil && configuration.host == "0.0.0.0" {
        throw ConfigurationError(
            "with --host 0.0.0.0 and a postgres:// store, set --advertise to the URL the other instances reach this one by (http://0.0.0.0:… reaches nobody)"
        )
    }
    // A first start stops at once when PostgreSQL cannot be reached; a role change (the image
    // before this one was serving) waits for it up to a minute.
    var attempt = 0
    var joined: PGMembership?
    while joined == nil {
        do {
            joined = try PGMembership(url: configuration.store, instanceID: id, leaseSeconds: configuration.lease)
        } catch {
            attempt += 1
            guard handoff != nil, attempt < 120 else { throw error }
            if attempt == 1 { logger.warning("cannot reach PostgreSQL; retrying for a minute", metadata: ["error": "\(error)"]) }
            usleep(500_000)
        }
    }
    guard let membership = joined else { throw OwnershipLostDuringStart() }
    if configuration.partitioned {
        let once = Locking.Lock(false)
        var g = SystemRandomNumberGenerator()
        let setup = PartitionedSetup(
            membership: membership, held: PartitionEpochs(), token: hex(g.next()) + hex(g.next()), listenSocket: handoff?.listenSocket,
            lost: { [logger] reason in
                let first = once.withLock { c -> Bool in
                    defer { c = true }
                    return !c
                }
                guard first else { return }
                logger.warning("dropping every queue held here and starting again", metadata: ["reason": "\(reason)"])
                roleChange(.becomeFollower)
            })
        return try buildApplication(configuration: configuration, logger: logger, role: .partitioned(setup))
    }
    // Partitions do everything it did since batches across owners are atomic (README).
    if handoff == nil { logger.warning("--ownership one is deprecated: --ownership partitions (the default) does all it does, and it will go") }
    var won: (epoch: Int64, token: String)?
    if let epoch = handoff?.epoch, let token = handoff?.token, try membership.confirm(epoch: epoch, token: token) {
        won = (epoch, token)
    } else {
        won = try membership.tryAcquire()
    }
    let directory = ClusterDirectory(membership: membership, selfID: id, logger: logger)
    let cluster = OwnerCluster(membership: membership, directory: directory, roleChange: roleChange, listenSocket: handoff?.listenSocket)
    if let won {
        logger.info("owner of the queues", metadata: ["instance": "\(id)", "epoch": "\(won.epoch)"])
        cluster.epoch = won.epoch
        // Renewed from now on: loading the queues may take longer than the lease.
        cluster.startRenewing(logger: logger)
        return try buildApplication(configuration: configuration, logger: logger, role: .oneOwner(cluster))
    }
    logger.info("following the owner of the queues", metadata: ["instance": "\(id)"])
    return try FollowerService(configuration: configuration, logger: logger, cluster: cluster)
}

/// What a partitioned cluster instance's application is built with (`PartitionOwner`).
struct PartitionedSetup: Sendable {
    let membership: PGMembership
    let held: PartitionEpochs
    /// This image's secret on the lease rows it wins.
    let token: String
    let listenSocket: Int32?
    /// Called (at most once) when a partition was lost: the process re-executes.
    let lost: @Sendable (String) -> Void
}
