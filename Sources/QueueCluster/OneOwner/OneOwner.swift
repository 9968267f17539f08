import Digest
import Dispatch
import Locking
import Logging
import MicroHTTP
import PostgresStore
import QueueAPI
import QueueEngine

#if canImport(Glibc)
import Glibc
#endif

/// A running opqd, whichever role it serves in: what `main` starts, stops, and hands its
/// listening socket over from when the role changes.
public protocol OpqdService: AnyObject, Sendable {
    /// The bound port (after `start`).
    var port: Int { get }
    func start() throws
    /// Graceful stop (SIGTERM).
    func shutdown()
    /// Stops serving quickly for a role change and returns a duplicate of the listening socket
    /// that survives `execv` (nil if there is none), so the next image serves the same port and
    /// connections wait in its backlog meanwhile.
    func handOver() -> Int32?
}

/// What the owner's application needs of the cluster: its membership and the lease renewal,
/// the directory `GET /v1/cluster` reads, and how to give up the role.
package final class OwnerCluster: @unchecked Sendable {
    package let membership: PGMembership
    package let directory: ClusterDirectory
    let roleChange: @Sendable (RoleChange) -> Void
    package let listenSocket: Int32?
    /// Set once, before the application is built.
    package var epoch: Int64 = 0
    private let changed = Locking.Lock(false)
    private let background = BackgroundServices()
    fileprivate let advertised = Locking.Lock("")

    package init(membership: PGMembership, directory: ClusterDirectory, roleChange: @escaping @Sendable (RoleChange) -> Void, listenSocket: Int32?) {
        self.membership = membership
        self.directory = directory
        self.roleChange = roleChange
        self.listenSocket = listenSocket
    }

    /// Calls `roleChange` at most once per image.
    package func change(_ to: RoleChange) {
        let first = changed.withLock { c -> Bool in
            defer { c = true }
            return !c
        }
        if first { roleChange(to) }
    }

    /// True once a role change was asked for (the ownership is gone or going).
    package var isLeaving: Bool { changed.withLock { $0 } }

    /// True while this instance may act as the owner: no role change is under way, and the
    /// lease it last renewed cannot have run out yet (monotonic clock) or no other instance
    /// was alive at the last read (nobody to take over). Kinds start only then.
    package var mayAct: Bool { !isLeaving && (membership.ownsNow || !directory.othersAlive) }

    /// How often the lease is renewed (and a follower looks for an expired one): a third of it,
    /// at most every second.
    var period: Double { min(1, membership.leaseSeconds / 3) }

    /// Every period: renews the lease and refreshes the directory. A renewal that finds another
    /// epoch means another instance took the queues over (this one was stopped or cut off past
    /// its lease): this one gives the role up. So does an owner whose renewals failed until the
    /// lease it last renewed may have run out (PostgreSQL unreachable), unless it was alone; and
    /// a start refused because `mayAct` turned false makes it give the role up too.
    package func startRenewing(logger: Logger) {
        let renew = PeriodicService("lease", every: period, on: DispatchQueue(label: "opqd.owner.lease")) { [self] in
            do {
                if try !membership.renew(epoch: epoch) {
                    logger.warning("another instance owns the queues now (this one's lease ran out); dropping them")
                    change(.becomeFollower)
                    return
                }
            } catch {
                // Past the local deadline another instance may own the queues any moment: give
                // the role up (the next image waits for PostgreSQL, then follows or takes over),
                // killing what runs here, rather than run on beside the next owner.
                // An instance alone in the cluster (as last read) keeps its queues and its
                // waiting answers: nobody is there to take over.
                if !membership.ownsNow && directory.othersAlive {
                    logger.warning(
                        "the ownership lease may have run out while PostgreSQL could not be reached; dropping the queues", metadata: ["error": "\(error)"])
                    change(.becomeFollower)
                    return
                }
                logger.warning("cannot renew the ownership lease", metadata: ["error": "\(error)"])
            }
            directory.refresh()
        }
        background.start([renew])
    }

    func stopRenewing() { background.stopAll() }
}

/// The one owner's placement (`--ownership one`): it serves every queue while it holds the
/// lease; its followers are another service (`FollowerService`).
extension OwnerCluster: QueuePlacement {
    package var selfID: String { directory.selfID }
    package var selfURL: String { advertised.withLock { $0 } }
    package func serves(queue name: String) -> Bool { true }
    package func holder(ofQueue name: String) -> PlacementHolder? { nil }
    /// While the lease is held: then its clean stop is the store's to record.
    package var servesEveryQueue: Bool { membership.ownsNow }
    package var startsAfterCommit: Bool { true }
    /// It serves every queue from the start (it loaded them all before listening).
    package var unready: String? { nil }

    package func mayStart() -> Bool {
        if mayAct { return true }
        // Not started here, and not to be forgotten: giving the role up re-executes the
        // process, and whoever owns next restarts the operation (restart rules).
        change(.becomeFollower)
        return false
    }

    package func clusterView(ownQueues: [String]) throws -> ClusterView { try directory.clusterView(ownQueues: ownQueues) }
    package func writeMetrics(to out: inout Exposition) { directory.writeOwnerMetrics(to: &out) }
    package func onChange(_ body: @escaping @Sendable (PlacementChange) -> Void) {}

    /// Once it listens: registers this instance (its URL is known now) and reads the directory;
    /// the lease is renewed since it was won.
    package func start(engine: QueueEngine, advertise: String) throws {
        advertised.withLock { $0 = advertise }
        try membership.register(advertise: advertise)
        directory.refresh()
    }

    /// After the store closed (everything is committed): the next owner may start at once.
    package func stop() {
        stopRenewing()
        membership.release(epoch: epoch)
        membership.close()
    }

    package func abandon() { stopRenewing() }
}

/// The cluster as this instance last read it from PostgreSQL, refreshed by its timer; what
/// `GET /v1/cluster` answers and where a follower forwards to.
package final class ClusterDirectory: Sendable {
    let membership: PGMembership
    package let selfID: String
    let logger: Logger
    private let state = Locking.Lock<(view: PGClusterView?, error: String?, queues: [String])>((nil, nil, []))

    package init(membership: PGMembership, selfID: String, logger: Logger) {
        self.membership = membership
        self.selfID = selfID
        self.logger = logger
    }

    /// Heartbeat and a fresh view. Instances silent for 3 leases (at least 5 s) are not shown.
    package func refresh() {
        do {
            try membership.beat()
            let view = try membership.view(stale: max(5, membership.leaseSeconds * 3))
            // The owner's queues as a follower shows them: read here, not on a server thread.
            let others = view.owner != nil && view.owner?.id != selfID
            let queues = others ? ((try? membership.queueNames()) ?? state.withLock { $0.queues }) : []
            state.withLock { $0 = (view, nil, queues) }
        } catch {
            let message = "\(error)"
            let was = state.withLock { s -> String? in
                defer { s.error = message }
                return s.error
            }
            if was == nil { logger.warning("cannot reach PostgreSQL for the cluster's state", metadata: ["error": "\(message)"]) }
        }
    }

    var view: PGClusterView? { state.withLock { $0.view } }
    /// Whether the last read showed another live instance.
    var othersAlive: Bool { view?.instances.contains { $0.id != selfID } ?? false }
    /// Why the last refresh failed (nil when it worked).
    var unavailable: String? { state.withLock { $0.error } }
    /// The owner's URL, unless it is this instance or unknown.
    var ownerURL: String? {
        guard let o = view?.owner, o.id != selfID, !o.url.isEmpty else { return nil }
        return o.url
    }

    /// The owner's `/metrics` families about the cluster (a follower has its own: `ForwardCounts`).
    func writeOwnerMetrics(to out: inout Exposition) {
        let epoch = view?.owner.flatMap { $0.id == selfID ? $0.epoch : nil } ?? 0
        Self.writeOwnerGauge(true, to: &out)
        out.family("opqd_cluster_epoch", .gauge, "The ownership epoch this instance holds (one more at every takeover).")
        out.sample("opqd_cluster_epoch", "", epoch)
    }

    /// `opqd_cluster_owner`, which the owner, the followers and the partition holders report.
    static func writeOwnerGauge(_ owns: Bool, to out: inout Exposition) {
        out.family("opqd_cluster_owner", .gauge, "Whether this instance owns the queues (1) or forwards to the owner (0).")
        out.sample("opqd_cluster_owner", "", owns ? 1 : 0)
    }

    /// `GET /v1/cluster` in cluster mode. `ownQueues`: the queues when this instance owns them
    /// (from its engine); otherwise the owner's are read from PostgreSQL.
    func clusterView(ownQueues: [String]?) throws -> ClusterView {
        guard let view else {
            throw ClusterUnavailable(detail: unavailable ?? "the cluster's state has not been read yet")
        }
        let ownerQueues = ownQueues ?? state.withLock { $0.queues }
        return ClusterView(
            mode: "cluster", store: "postgres",
            instances: view.instances.map { i in
                Self.instance(
                    i, selfID: selfID, owner: i.isOwner, epoch: i.isOwner ? view.owner?.epoch : nil, queues: i.isOwner ? ownerQueues : [])
            })
    }

    /// An instance as `GET /v1/cluster` shows it in both ownership modes.
    static func instance(
        _ i: PGInstance, selfID: String, owner: Bool, epoch: Int64? = nil, partitions: [Int]? = nil, queues: [String]
    ) -> ClusterView.Instance {
        ClusterView.Instance(
            id: i.id, url: i.url, isSelf: i.id == selfID, startedAt: time(i.startedAt), heartbeatAt: time(i.heartbeatAt), owner: owner,
            epoch: epoch, partitions: partitions, queues: queues)
    }

    /// Microseconds from the database as a timestamp, saturating.
    static func time(_ micros: Int64) -> Timestamp {
        let (n, overflow) = micros.multipliedReportingOverflow(by: 1000)
        return Timestamp(nanoseconds: overflow ? (micros < 0 ? .min : .max) : n)
    }
}

/// The cluster's state could not be read from PostgreSQL: 503.
struct ClusterUnavailable: Error, ProblemConvertible {
    let detail: String
    var problem: Problem {
        Problem(
            503, "cluster-unavailable", "Cluster state unavailable", "cannot read the cluster's state from PostgreSQL: \(detail)",
            headers: [("Retry-After", "1")])
    }
}

/// A cluster instance that does not own the queues: it answers `/healthz`, `/readyz`,
/// `/metrics`, `GET /v1/cluster`, the dashboard page and the change feed (long polls and SSE,
/// from PostgreSQL: the owner's commits are read back in `seq` order), an operation's status
/// and history and the queues' statuses (from PostgreSQL, `FollowerReads`) itself, and forwards every other request to
/// the owner, relaying its answer unchanged. Every period it heartbeats
/// and, when the owner's lease has run out, tries to take the ownership: if it wins, it asks to
/// become the owner (`RoleChange.becomeOwner`).
package final class FollowerService: OpqdService {
    let configuration: OpqdConfiguration
    let logger: Logger
    let cluster: OwnerCluster
    let server: HTTPServer
    let events: EventLog
    let forwarder: Forwarder
    let lifecycle = Lifecycle()
    private let background = BackgroundServices()
    private let forwarded = ForwardCounts()
    private let listener = Locking.Lock<PGListener?>(nil)

    package init(configuration: OpqdConfiguration, logger: Logger, cluster: OwnerCluster) throws {
        self.configuration = configuration
        self.logger = logger
        self.cluster = cluster
        let limits = configuration.limits
        let membership = cluster.membership
        let lastSeq = try membership.lastSeq()
        // All the newest kept events, gaps (deleted queues, purged operations) included: the
        // feed bisects, so a gap only means those events are not shown.
        let kept = try membership.recentEvents(limit: configuration.eventCapacity)
        let events = EventLog(
            capacity: configuration.eventCapacity, startingAfter: (kept.first?.seq ?? (lastSeq + 1)) - 1, maxBacklog: limits.sseBacklog,
            sharedSeqs: true)
        events.append(kept)
        self.events = events
        let forwarder = Forwarder(
            selfID: cluster.directory.selfID, maxResponseBytes: max(64 << 20, configuration.maxBody * 4), maxWaitSeconds: OperationsController.maxWaitSeconds)
        self.forwarder = forwarder

        let access = Access(token: configuration.token, readToken: configuration.readToken)
        var router = Router()
        let (directory, lifecycle, forwarded) = (cluster.directory, self.lifecycle, self.forwarded)
        ServiceController.addProbes(to: &router, lifecycle: lifecycle, store: "postgres") {
            if let problem = directory.unavailable { return "cannot reach PostgreSQL: \(problem)" }
            if directory.ownerURL == nil { return "no instance owns the queues right now" }
            return nil
        }
        router.add("GET", "/metrics", scope: .instance) { _, _ in
            .response(
                HTTPResponse(
                    status: 200, headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")],
                    body: forwarded.render(streams: events.streamCount)))
        }
        router.add("GET", "/v1/cluster", scope: .instance) { req, _ in
            _ = try Query(req, allowed: [])
            return .response(json(200, try directory.clusterView(ownQueues: nil).json))
        }
        EventsController(events: events, scheduler: DispatchScheduler(), limits: limits).addRoutes(to: &router)
        DashboardController(access: access).addRoutes(to: &router)
        let pool = PGReadPool(url: configuration.store)
        FollowerReads(reads: PostgresOperationReads(pool: pool), queues: PostgresQueueReads(pool: pool), limits: limits).addRoutes(to: &router)
        let dispatcher = APIDispatcher(router: router, access: access, log: APIDispatcher.logFailures(logger))
        let local = router
        server = HTTPServer(
            configuration: HTTPServerConfiguration(
                host: configuration.host, port: configuration.port, threads: configuration.threads,
                maxBodyBytes: configuration.maxBody, connectionTimeout: configuration.connectionTimeout,
                connectionLimit: configuration.connectionLimit, listenBacklog: 1024, maxHeaderBytes: limits.headerBytes,
                listenSocket: cluster.listenSocket, reusePort: true),
            handler: { request in
                if case .found = local.match(method: request.method, path: request.path) { return dispatcher.handle(request) }
                // The owner checks tokens too, but a follower must not read and relay bodies for
                // callers without one: the token rules of a route by its method (GET/HEAD: the
                // read token; anything else: the full token).
                if let refused = access.refusal(request, match: .notFound) { return .routed(Router.unmatched, .response(refused.response)) }
                // Never forwarded twice: a forwarded request reaching a follower means the
                // owner changed in between; the client retries.
                guard !Forwarder.wasForwarded(request), let owner = directory.ownerURL else {
                    forwarded.count(relayed: false)
                    return .routed(
                        Router.unmatched,
                        .response(
                            Problem.noOwner(
                                "no instance owns the queues right now (a takeover is under way); retry shortly, with an Idempotency-Key for changes"
                            ).response))
                }
                forwarded.count(relayed: true)
                return .routed("forwarded", forwarder.forward(request, to: owner))
            },
            log: { [logger] level, message in
                logger.log(level: Logger.Level(rawValue: level) ?? .error, "\(message)", metadata: ["component": "http"])
            },
            headCheck: { head in
                guard case .found = local.match(method: head.method, path: head.path) else {
                    return access.refusal(head, match: .notFound).map { HeadRefusal($0.response, route: Router.unmatched) }
                }
                return dispatcher.refusal(head)
            })
    }

    package var port: Int { server.port }

    package func start() throws {
        let directory = cluster.directory
        directory.refresh()
        try server.start()
        let advertise = configuration.advertise ?? "http://\(configuration.host):\(port)"
        try cluster.membership.register(advertise: advertise)
        directory.refresh()

        // The feed: what the owner committed, read back in seq order (see `FeedTail`).
        let membership = cluster.membership
        let feed = FeedTail(
            logger: logger, read: { after, limit in try membership.events(after: after, limit: limit) }, lastSeq: { [events] in events.lastSeq }
        ) { [events] in events.append($0) }
        self.listener.withLock { $0 = feed.listen(notifiedAt: configuration.store) }

        let (cluster, logger) = (self.cluster, self.logger)
        let beat = PeriodicService("membership", every: cluster.period, on: DispatchQueue(label: "opqd.follower.membership")) { [events] in
            directory.refresh()
            events.cutOffStalled()
            guard let view = directory.view, view.owner == nil else { return }
            do {
                if let won = try cluster.membership.tryAcquire() {
                    logger.info("took over the queues", metadata: ["epoch": "\(won.epoch)"])
                    // Renewed through the handover and the re-execution (which may take longer
                    // than the lease): the next image confirms the epoch with the token.
                    cluster.epoch = won.epoch
                    cluster.startRenewing(logger: logger)
                    cluster.change(.becomeOwner(epoch: won.epoch, token: won.token))
                }
            } catch {
                logger.warning("cannot take over the queues", metadata: ["error": "\(error)"])
            }
        }
        background.start([feed.service, beat])
        logger.info("opqd serving as a follower", metadata: ["host": "\(configuration.host)", "port": "\(port)"])
    }

    package func shutdown() {
        guard !lifecycle.stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
        background.stopAll()
        listener.withLock { $0?.stop() }
        events.closeStreams()
        server.shutdown(timeout: .seconds(8))
        cluster.membership.release(epoch: nil)
        cluster.membership.close()
        logger.info("opqd stopped")
    }

    package func handOver() -> Int32? {
        guard !lifecycle.stopping.exchange(true, ordering: .acquiringAndReleasing) else { return nil }
        let fd = server.openSpareListener()
        background.stopAll()
        listener.withLock { $0?.stop() }
        events.closeStreams()
        // This instance won the queues because their owner stopped renewing: requests relayed
        // to it are not coming back. Their clients get 503 with Retry-After at once rather than
        // delaying the takeover (their changes may or may not have happened, as with any 503).
        server.shutdown(timeout: .milliseconds(300))
        return fd
    }
}

/// A follower's counts for `/metrics`.
final class ForwardCounts: Sendable {
    private let counts = Locking.Lock<(relayed: Int, refused: Int)>((0, 0))
    func count(relayed: Bool) {
        counts.withLock { c in
            if relayed { c.relayed &+= 1 } else { c.refused &+= 1 }
        }
    }
    func render(streams: Int) -> [UInt8] {
        let c = counts.withLock { $0 }
        var out = Exposition(capacity: 1024)
        ClusterDirectory.writeOwnerGauge(false, to: &out)
        out.family(
            "opqd_forwarded_requests_total", .counter, "Requests this follower forwarded to the owner, or refused for want of one.")
        out.sample("opqd_forwarded_requests_total", #"outcome="forwarded""#, c.relayed)
        out.sample("opqd_forwarded_requests_total", #"outcome="no_owner""#, c.refused)
        out.family("opqd_sse_streams", .gauge, "Open Server-Sent Events streams (GET /v1/events/stream).")
        out.sample("opqd_sse_streams", "", streams)
        return out.bytes
    }
}
