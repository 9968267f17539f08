import Logging
import PostgresStore
import QueueAPI
import QueueEngine

extension ClusterFront {
    /// A partitioned instance's front: its forwarder, and the reads it answers from PostgreSQL
    /// for queues and operations other instances hold (`FollowerReads`).
    package static func partitioned(
        owner: PartitionOwner, router: Router, postgres: PostgresStore, storeURL: String, engine: QueueEngine, access: Access, limits: APILimits,
        maxBody: Int, logger: Logger
    ) -> ClusterFront {
        let pool = PGReadPool(url: storeURL)
        var readRoutes = Router()
        FollowerReads(reads: PostgresOperationReads(pool: pool), queues: PostgresQueueReads(pool: pool), limits: limits).addRoutes(to: &readRoutes)
        let forwarder = Forwarder(
            selfID: owner.selfID, maxResponseBytes: max(64 << 20, maxBody * 4), maxWaitSeconds: OperationsController.maxWaitSeconds,
            maxGatheredBytes: limits.pageBytes * 2 + (64 << 10), relayBytes: maxBody)
        var front = ClusterFront(
            placement: owner, router: router, engine: engine, forwarder: forwarder,
            access: access, queues: OperationQueues(read: { id in try postgres.queue(of: id) }, readMany: { ids in try postgres.queues(of: ids) }),
            reads: APIDispatcher(router: readRoutes, access: access, log: APIDispatcher.logFailures(logger)))
        let batches = BatchAcross(
            engine: engine, store: postgres, parser: BatchParser(engine: engine, limits: limits), owner: owner, forwarder: forwarder, access: access,
            logger: logger)
        owner.onTake { parts in try batches.pending(parts) }
        front.batches = batches
        return front
    }
}
