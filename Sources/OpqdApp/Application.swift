import Dispatch
import Locking
import Logging
import MicroHTTP
import PostgresStore
import QueueAPI
import QueueCluster
import QueueEngine
import StoreKit

/// The running service: what `buildApplication` assembled, plus its lifecycle (start, the
/// background timers, graceful shutdown).
public final class OpqdApplication: OpqdService {
    public let configuration: OpqdConfiguration
    public let engine: QueueEngine
    let server: HTTPServer
    let events: EventLog
    let webhooks: Webhooks
    let store: any DurableStore
    let lifecycle: Lifecycle
    let logger: Logger
    let instance: InstanceInfo
    /// Where the queues live: this instance alone, or its part of a cluster.
    let placement: any QueuePlacement
    /// Run when this owner gives its role up, before the process re-executes.
    let beforeHandover: @Sendable () -> Void
    /// Run once nothing starts any more (a clean stop, a role change): a cluster instance gives
    /// its limiter leases back.
    let afterServing: @Sendable () -> Void
    /// On PostgreSQL: the feed of the commits as numbered there, and what lies between them
    /// read back (`OwnerFeed`); with other writers, woken by their NOTIFY (`listenFeed`).
    let feed: FeedTail?
    let listenFeed: (@Sendable () -> PGListener)?
    private let background = BackgroundServices()
    private let listener = Locking.Lock<PGListener?>(nil)

    init(
        configuration: OpqdConfiguration, engine: QueueEngine, server: HTTPServer, events: EventLog, webhooks: Webhooks,
        store: any DurableStore, lifecycle: Lifecycle, logger: Logger, instance: InstanceInfo, placement: any QueuePlacement,
        feed: FeedTail?, listenFeed: (@Sendable () -> PGListener)?, beforeHandover: @escaping @Sendable () -> Void = {},
        afterServing: @escaping @Sendable () -> Void = {}
    ) {
        self.afterServing = afterServing
        self.feed = feed
        self.listenFeed = listenFeed
        self.placement = placement
        self.beforeHandover = beforeHandover
        self.instance = instance
        self.configuration = configuration
        self.engine = engine
        self.server = server
        self.events = events
        self.webhooks = webhooks
        self.store = store
        self.lifecycle = lifecycle
        self.logger = logger
    }

    /// The bound port (after `start`).
    public var port: Int { server.port }

    /// Its background work, in the order it starts.
    var services: [PeriodicService] {
        let (engine, retain, store, webhooks, placement) = (self.engine, configuration.retain, self.store, self.webhooks, self.placement)
        let (events, instance) = (self.events, self.instance)
        let ticks = Locking.Lock<Int>(0)
        var list = [
            PeriodicService("retention", every: 5) {
                // Small batches, so neither the engine's lock nor the writer is held for long.
                let cutoff = SystemClock().now().adding(seconds: -retain)
                while engine.purgeFinished(before: cutoff, limit: 1000) == 1000 {}
                // In a partitioned cluster an observer of a queue held by another instance is not an
                // orphan: its owner removes it.
                if webhooks.count > 0 && placement.servesEveryQueue {
                    webhooks.removeOrphans(
                        operationExists: { id in (try? engine.revision(of: id)) != nil },
                        queueExists: { name in (try? engine.queue(named: name)) != nil })
                }
                while store.purge(finishedBefore: cutoff, limit: 1000) == 1000 {}
                _ = store.purgeIdempotency(before: cutoff)
            },
            PeriodicService("heartbeat", every: 1) {
                instance.beat(SystemClock().now())
                events.cutOffStalled()
                webhooks.persistCursors()
                let tick = ticks.withLock { t in
                    t += 1; return t
                }
                if tick % 15 == 0 { events.heartbeat() }
            },
        ]
        if let feed { list.append(feed.service) }
        return list
    }

    /// Binds and serves.
    public func start() throws {
        try server.start()
        instance.listening(at: configuration.advertise ?? "http://\(configuration.host):\(port)")
        background.start(services)
        if let listenFeed { listener.withLock { $0 = listenFeed() } }
        try placement.start(engine: engine, advertise: instance.url)
        webhooks.start()
        if configuration.token == nil && !Access.isLoopback(configuration.host) {
            logger.warning(
                "listening on a non-loopback address without a token: anyone who can reach \(configuration.host):\(port) can create, cancel and delete queues and operations, and run what --allow-command allows; set --token (OPQD_TOKEN)"
            )
        }
        logger.info("opqd serving", metadata: ["host": "\(configuration.host)", "port": "\(port)", "threads": "\(configuration.threads)"])
    }

    /// Graceful stop: readiness turns 503; a cluster instance hands its queues to the others
    /// while it still answers (forwarding), up to 5 s; long polls and streams are answered and
    /// closed, new requests get 503 while in-flight ones (and answers waiting for a commit)
    /// finish, up to 8 s; then the store records a clean stop and closes.
    public func shutdown() {
        guard !lifecycle.stopping.exchange(true, ordering: .acquiringAndReleasing) else { return }
        logger.info("opqd stopping")
        // Handed over: this instance holds nothing, and relays every request for a moment more,
        // while load balancers notice its /readyz 503 and stop sending (--shutdown-delay).
        if placement.handOver(within: 5) && configuration.shutdownDelay > 0 {
            logger.info("relaying requests a moment more before stopping", metadata: ["seconds": "\(configuration.shutdownDelay)"])
            _ = DispatchSemaphore(value: 0).wait(timeout: .now() + configuration.shutdownDelay)
        }
        background.stopAll()
        events.closeStreams()
        server.shutdown(timeout: .seconds(8))
        afterServing()
        webhooks.stop()
        // A cluster's counts are in the shared database: an instance's clean stop says nothing of
        // the operations others run (a partitioned instance's takers count per partition, see
        // PartitionOwner.countCrashes; in one-owner mode only the owner counts).
        if store.isDurable && placement.servesEveryQueue {
            // A clean stop: operations executing now were not part of a crash. One job, so the
            // counts never go without the marker that explains why.
            var writes: [(key: String, value: String?)] = store.meta(prefix: "crashes:").map { ($0.key, nil) }
            writes.append(("clean_stop", "1"))
            store.setMeta(writes, then: nil)
        }
        listener.withLock { $0?.stop() }
        store.close()
        // Everything is committed: the next owners may take the queues at once.
        placement.stop()
        logger.info("opqd stopped")
    }

    /// Stops serving for a role change (this instance lost the queues), keeping the listening
    /// socket for the next image: pending answers get 503 (the change they wait for may or may
    /// not have been committed before the fence), streams close. Nothing is committed any more.
    public func handOver() -> Int32? {
        guard !lifecycle.stopping.exchange(true, ordering: .acquiringAndReleasing) else { return nil }
        // Children of `command` operations first: the next owner starts them again.
        beforeHandover()
        let fd = server.openSpareListener()
        background.stopAll()
        placement.abandon()
        listener.withLock { $0?.stop() }
        events.closeStreams()
        server.shutdown(timeout: .seconds(1))
        afterServing()
        webhooks.stop()
        return fd
    }
}
