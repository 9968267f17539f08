import Dispatch
import Logging
import MicroHTTP
import PostgresStore
import QueueAPI
import QueueCluster
import QueueEngine
import QueueKinds
import SQLiteStore
import StoreKit

/// Builds a single instance (SQLite or memory) from its configuration; `opqd` and the tests
/// both call this. A `postgres://` store takes part in a cluster: `buildService` builds it.
public func buildApplication(configuration: OpqdConfiguration, logger: Logger? = nil) throws -> OpqdApplication {
    try buildApplication(configuration: configuration, logger: logger, role: .single)
}

/// How this instance takes part: alone, or in a cluster on PostgreSQL.
enum Role: Sendable {
    /// One opqd serving its store alone (SQLite or memory).
    case single
    /// The owner of every queue (`--ownership one`) at `cluster.epoch`: its commits are fenced
    /// by that epoch.
    case oneOwner(OwnerCluster)
    /// A holder of a share of the partitions (`--ownership partitions`): its commits are fenced
    /// by the epochs of the partitions it writes to.
    case partitioned(PartitionedSetup)
}

/// What the one switch (`compose`) picks for a role: the store and the placement, and what
/// follows from them for the feed and the front.
struct Composition {
    let store: any DurableStore
    /// nil: a single instance (`SingleInstance`, built once the instance is known).
    let placement: (any QueuePlacement)?
    /// On PostgreSQL: where committed events come from (with the seqs it gave them).
    let postgres: PostgresStore?
    /// Whether what the last run left is loaded now; a partition holder loads its queues as it
    /// takes them.
    let loadsAtStart: Bool
    /// True once the role is going (the one owner lost its lease while loading).
    let leaving: @Sendable () -> Bool
    let listenSocket: Int32?
    /// The partitioned front: requests for queues held elsewhere are relayed (`ClusterFront`).
    let front: (@Sendable (Router, QueueEngine, Access) -> ClusterFront)?
    /// Several writers (partitions): the feed wakes on their NOTIFY (not this instance's own)
    /// and reads the gaps between its commits back.
    let othersCommit: Bool
    let published: (@Sendable ([ChangeEvent]) -> Void)?
}

/// The one place that chooses the store and the placement.
func compose(_ role: Role, configuration: OpqdConfiguration, logger: Logger) throws -> Composition {
    switch role {
    case .single:
        guard !OpqdConfiguration.isPostgresURL(configuration.store) else {
            throw ConfigurationError("a postgres:// store takes part in a cluster: build it with buildService")
        }
        let store: any DurableStore =
            configuration.store == "sqlite"
            ? try SQLiteStore(directory: configuration.data, sync: SyncMode(rawValue: configuration.sync) ?? .full) : MemoryStore()
        return Composition(
            store: store, placement: nil, postgres: nil, loadsAtStart: true, leaving: { false }, listenSocket: nil, front: nil,
            othersCommit: false, published: nil)
    case let .oneOwner(cluster):
        let pg = try PostgresStore(
            url: configuration.store,
            fence: PGFence(instance: cluster.directory.selfID, epoch: cluster.epoch, leaseSeconds: configuration.lease),
            onFenced: { [logger] in
                logger.warning("another instance took over the queues: this one's commits are refused from now on; dropping them")
                cluster.change(.becomeFollower)
            })
        return Composition(
            store: pg, placement: cluster, postgres: pg, loadsAtStart: true, leaving: { cluster.isLeaving }, listenSocket: cluster.listenSocket,
            front: nil, othersCommit: false, published: nil)
    case let .partitioned(setup):
        // Nothing is loaded now: the partitions this instance wins are, once it listens.
        let pg = try PostgresStore(
            url: configuration.store,
            fence: PGFence(
                instance: setup.membership.instanceID, epoch: 0, leaseSeconds: configuration.lease, partitions: setup.held),
            onFenced: { setup.lost("a commit was refused: another instance holds one of its partitions now") })
        let owner = PartitionOwner(
            membership: setup.membership, store: pg, held: setup.held, token: setup.token, logger: logger, lost: setup.lost)
        let (url, limits, maxBody) = (configuration.store, configuration.limits, configuration.maxBody)
        return Composition(
            store: pg, placement: owner, postgres: pg, loadsAtStart: false, leaving: { false }, listenSocket: setup.listenSocket,
            front: { router, engine, access in
                .partitioned(
                    owner: owner, router: router, postgres: pg, storeURL: url, engine: engine, access: access, limits: limits,
                    maxBody: maxBody, logger: logger)
            },
            othersCommit: true, published: { owner.eventsPublished($0) })
    }
}

/// The store and the engine come first, then what feeds clients, then the router (every
/// controller with just the dependencies it uses), then the server around it; nothing refers
/// back to the application.
func buildApplication(configuration: OpqdConfiguration, logger: Logger?, role: Role) throws -> OpqdApplication {
    var logger = logger ?? Logger(label: "opqd")
    logger.logLevel = configuration.logLevel
    let limits = configuration.limits

    let composition = try compose(role, configuration: configuration, logger: logger)
    let store = composition.store
    var recovered = composition.loadsAtStart ? try store.recoverState() : nil
    if var r = recovered {
        (r.poisoned, r.generation) = try countUncleanStops(store, r, logger: logger, abandon: composition.leaving)
        recovered = r
    }
    let serverID = serverIdentity(store)
    let instance = InstanceInfo(id: composition.placement?.selfID ?? serverID, store: store.name, now: SystemClock().now())
    let placement: any QueuePlacement = composition.placement ?? SingleInstance(instance: instance)

    let external = ExternalKind()
    let kinds = standardKinds(KindsConfiguration(allowCommands: configuration.allowCommands, maxCommands: limits.commands), external: external)
    let commands = kinds["command"] as? CommandKind
    let mayStart: (@Sendable () -> Bool)? = placement.startsAfterCommit ? { @Sendable in placement.mayStart() } : nil
    var engineConfiguration = EngineConfiguration(
        defaultMaxConcurrentOperationCount: configuration.defaultMaxConcurrent,
        maxUnfinishedOperations: limits.unfinished, maxQueues: limits.queues,
        maxUnfinishedPerQueue: limits.unfinishedPerQueue, maxDependencies: limits.dependencies,
        startAfterCommit: placement.startsAfterCommit, mayStart: mayStart)
    engineConfiguration.maxLimiters = limits.limiters
    engineConfiguration.maxLimiterKeys = limits.limiterKeys
    engineConfiguration.breaker = limits.breaker
    engineConfiguration.maxSchedules = limits.schedules
    let engine = QueueEngine(kinds: kinds, store: store.engineStore, configuration: engineConfiguration)
    // A cluster's partition holders share every limiter: its row in PostgreSQL, and one budget
    // kept there, leased in small batches (README, "Limiters and a cluster").
    var leasing: LimiterLeasing?
    // A host's state changed by another instance reaches this one through the feed; its row
    // is read then (API.md "Hosts": one host, one state).
    var adoptHosts: (@Sendable ([ChangeEvent]) -> Void)?
    if case let .partitioned(setup) = role {
        let pool = PGReadPool(url: configuration.store, size: 2)
        engine.setLimiterDirectory(PostgresLimiterDirectory(pool: pool))
        adoptHosts = HostAdoption(pool: pool, engine: engine, logger: logger).adopt
        let exchange = PostgresLeaseExchange(
            PGLimiterLeases(url: configuration.store, instance: setup.membership.instanceID, leaseSeconds: configuration.lease))
        let l = LimiterLeasing(store: exchange, leaseSeconds: configuration.lease, logger: logger)
        l.attach(to: engine)
        leasing = l
    }

    let lastSeq = recovered?.lastSeq ?? 0
    // PostgreSQL numbers events in the commit, and a commit that failed leaves its seqs unused:
    // gaps are normal there, and the feed bisects over them.
    let recent = store.recentEvents(limit: configuration.eventCapacity)
    let kept = composition.postgres != nil ? recent : contiguousTail(recent, lastSeq: lastSeq)
    let events = EventLog(
        capacity: configuration.eventCapacity, startingAfter: (kept.first?.seq ?? (lastSeq + 1)) - 1,
        maxBacklog: limits.sseBacklog, sharedSeqs: composition.postgres != nil)
    events.append(kept)
    let idempotency = IdempotencyCache(maxKeys: limits.idempotencyKeys, maxBytes: limits.idempotencyBytes)
    // The answers kept for Idempotency-Keys: all of them when this instance serves every
    // queue; a partition holder, those of the partitions it takes, as it takes them.
    let preloadIdempotency: @Sendable ([Int]?) -> Void = { partitions in
        idempotency.preload(
            (partitions.map { store.loadIdempotency(partitions: $0) } ?? store.loadIdempotency()).map {
                ($0.scope, $0.bodyHash, HTTPResponse(status: $0.status, headers: $0.headers, body: $0.body), $0.createdAt)
            })
    }
    if composition.loadsAtStart { preloadIdempotency(nil) }
    // Only a partition holder's observers are filtered: the others' queues are loaded by their owner.
    let servesQueue: (@Sendable (String) -> Bool)? = placement.servesEveryQueue ? nil : { @Sendable name in placement.serves(queue: name) }
    let webhooks = Webhooks(
        logger: logger, transport: OutboundWebhookTransport(), scheduler: engine.scheduler, secret: configuration.webhookSecret, store: store,
        limits: .init(perOperation: limits.observersPerOperation, perQueue: limits.observersPerQueue, total: limits.observers),
        policy: DeliveryPolicy(
            timeout: configuration.webhookTimeout, backoff: configuration.webhookBackoff,
            maxBackoff: max(configuration.webhookBackoff, configuration.webhookMaxBackoff), maxBuffered: configuration.webhookBuffer),
        newestSeq: { events.lastSeq }, serves: servesQueue)
    placement.onChange { change in
        switch change {
        case let .released(queue):
            webhooks.forget(queues: queue)
            // Claims waiting here for a queue that left are answered now: claimed again where it is.
            external.dropWaiters(where: queue)
        case let .adopted(partitions):
            webhooks.load()
            preloadIdempotency(partitions)
        }
    }
    let lifecycle = Lifecycle()
    let durability = Durability(engine: engine, idempotency: idempotency, store: store, retain: configuration.retain)

    let metrics = Metrics()
    let access = Access(token: configuration.token, readToken: configuration.readToken)
    let router = buildRouter(
        engine: engine, events: events, metrics: metrics, webhooks: webhooks, external: external, durability: durability,
        store: store, lifecycle: lifecycle, limits: limits, access: access, maxBody: configuration.maxBody, instance: instance,
        serverID: serverID, placement: placement)
    let dispatcher = APIDispatcher(router: router, access: access, log: APIDispatcher.logFailures(logger))
    var routing = composition.front?(router, engine, access)
    // A request held through a handover may turn out to be this instance's to answer.
    routing?.local = { request in dispatcher.handle(request) }
    routing?.answered = { route, status, duration in metrics.answered(route: route, status: status, duration: duration) }
    let front = routing
    let server = HTTPServer(
        configuration: HTTPServerConfiguration(
            host: configuration.host, port: configuration.port, threads: configuration.threads,
            maxBodyBytes: configuration.maxBody, connectionTimeout: configuration.connectionTimeout,
            connectionLimit: configuration.connectionLimit, listenBacklog: 1024, maxHeaderBytes: limits.headerBytes,
            listenSocket: composition.listenSocket, reusePort: composition.postgres != nil),
        handler: { request in front?.route(request) ?? dispatcher.handle(request) },
        log: { [logger] level, message in
            logger.log(level: Logger.Level(rawValue: level) ?? .error, "\(message)", metadata: ["component": "http"])
        },
        responseObserver: { route, status, duration in metrics.answered(route: route, status: status, duration: duration) },
        headCheck: { head in dispatcher.refusal(head) })
    // Weak: the server's handler holds the router, which holds `metrics`.
    metrics.readServer { [weak server] in (server?.openConnections ?? 0, server?.requestsInFlight ?? 0) }

    _ = engine.observeAll { batch in metrics.observe(batch) }
    // Clients are shown only committed changes: a seq once shown always names the same event.
    // On PostgreSQL they are shown with the seqs it gave them in the commit (global, the same
    // in every instance's feed), not the engine's.
    var feed: FeedTail?
    var listen: (@Sendable () -> PGListener)?
    if let postgres = composition.postgres {
        let othersCommit = composition.othersCommit
        let owner = OwnerFeed(
            events: events, webhooks: webhooks, logger: logger,
            read: { after, limit in try postgres.events(after: after, limit: limit) },
            published: { [published = composition.published, adoptHosts] batch in
                published?(batch)
                adoptHosts?(batch)
            },
            delivers: { queue in placement.serves(queue: queue) }, readsGaps: !othersCommit)
        postgres.onCommittedEvents { owner.committed($0) }
        // Its own commits reach the feed from its writer; the timer is the safety net. (No
        // NOTIFY with one writer: it would wake on its own commits.) Partition holders read the
        // others' commits too, woken by their NOTIFY.
        let (url, tail) = (configuration.store, owner.tail)
        feed = tail
        if othersCommit { listen = { tail.listen(notifiedAt: url, ignoring: placement.selfID) } }
    } else {
        engine.observeDurable { batch in
            events.append(batch)
            webhooks.deliver(batch)
        }
    }
    if let recovered {
        engine.restore(recovered)
        logger.info(
            "store recovered",
            metadata: [
                "path": "\(store.path)", "queues": "\(recovered.queues.count)",
                "operations": "\(recovered.operations.count)", "lastSeq": "\(recovered.lastSeq)",
                "poisoned": "\(recovered.poisoned.count)",
            ])
        // Observers whose queue or operation went in a crash before their own removal was
        // committed go now, before a queue of the same name can be created again.
        webhooks.removeOrphans(
            operationExists: { id in (try? engine.revision(of: id)) != nil }, queueExists: { name in (try? engine.queue(named: name)) != nil })
    }
    return OpqdApplication(
        configuration: configuration, engine: engine, server: server, events: events, webhooks: webhooks,
        store: store, lifecycle: lifecycle, logger: logger, instance: instance, placement: placement, feed: feed, listenFeed: listen,
        beforeHandover: { commands?.killAllForHandover() }, afterServing: { [leasing] in leasing?.stop() })
}

/// This server's identity: a random id kept in the store's meta table from its first start
/// (per process with `--store memory`). Archives carry it (`exportedFrom`).
func serverIdentity(_ store: any DurableStore) -> String {
    if let kept = store.meta(prefix: "server-id").first(where: { $0.key == "server-id" })?.value, !kept.isEmpty { return kept }
    var g = SystemRandomNumberGenerator()
    let id = String(g.next(), radix: 16) + String(g.next(), radix: 16)
    store.setMeta([("server-id", id)], then: nil)
    return id
}

/// The stored events the feed starts with: the newest run of consecutive seqs ending at the
/// last seq ever given out. The feed finds events by their offset in one gap-free run, and
/// events of purged operations or deleted queues leave gaps in the store: a cursor before a
/// gap gets 410, which is true (events after it are no longer all kept).
func contiguousTail(_ events: [ChangeEvent], lastSeq: UInt64) -> [ChangeEvent] {
    guard let last = events.last, last.seq == lastSeq else { return [] }
    var i = events.count - 1
    while i > 0 && events[i - 1].seq &+ 1 == events[i].seq { i -= 1 }
    return Array(events[i...])
}

/// Poison operations (API.md "Crashes"): counts, per operation, the unclean stops in a row
/// it was executing during, durably before anything runs again. A clean stop (`shutdown`)
/// leaves a marker and clears the counts. Returns those that reached 3, and this run's
/// generation (`RecoveredState.generation`): one more than the last run's, committed in the same
/// write, so durable before anything is served. (A cluster owner's write is fenced: only the one
/// owner at a time counts, and each takeover sees its predecessor's count.)
/// `abandon`: a cluster owner that lost the ownership while starting stops waiting for a
/// commit that will never come (`OwnershipLostDuringStart`).
func countUncleanStops(
    _ store: any DurableStore, _ recovered: RecoveredState, logger: Logger, abandon: () -> Bool = { false }
) throws -> (poisoned: Set<OperationID>, generation: UInt64) {
    let clean = store.meta(prefix: "clean_stop").contains { $0.key == "clean_stop" && $0.value == "1" }
    var counts: [String: Int] = [:]
    for (key, value) in store.meta(prefix: "crashes:") { counts[key] = Int(value) ?? 0 }
    // Saturating, far below what the stores' counter columns hold (a damaged value counts as 0:
    // the revision still moves past the stored one, only an ETag's generation could repeat).
    let last = store.meta(prefix: "generation").first { $0.key == "generation" }.flatMap { UInt64($0.value) } ?? 0
    let generation = min(last, 1 << 40) + 1
    var writes: [(key: String, value: String?)] = [("clean_stop", nil), ("generation", String(generation))]
    var poisoned: Set<OperationID> = []
    if !clean {
        let counted = CrashCounts.next(operations: recovered.operations, counts: counts, clearOthers: true) { _ in true }
        writes += counted.writes
        poisoned = counted.poisoned
        let executing = recovered.operations.count { $0.state == .executing }
        if executing > 0 { logger.warning("the last stop was not clean", metadata: ["executing": "\(executing)"]) }
    }
    let committed = DispatchSemaphore(value: 0)
    if store.setMeta(writes, then: { committed.signal() }) {
        while committed.wait(timeout: .now() + 0.1) == .timedOut {
            if abandon() { throw OwnershipLostDuringStart() }
        }
    }
    return (poisoned, generation)
}
