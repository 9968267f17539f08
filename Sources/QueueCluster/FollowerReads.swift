import MicroHTTP
import PostgresStore
import QueueAPI
import QueueEngine

/// The reads a cluster follower answers from PostgreSQL itself instead of relaying them to the
/// owner (CLUSTER.md: "Reads that need no owner … may be served from PostgreSQL by any
/// instance"): an operation's status and its history. They keep answering while no instance
/// owns the queues (a takeover) and cost the owner nothing. The route code is the owner's
/// (`OperationsController.status`/`history`), so validation, errors and JSON are the same bytes;
/// only where the operation is read from differs. The owner answers a change only after its
/// commit, so a client that got a 2xx reads its change here too.
///
/// Queue statuses too (`GET /v1/queues`, `GET /v1/queues/{name}`, `QueuesController.list`/`get`):
/// every commit of the owner that moves a queue's revision writes the queue's row with its
/// status (counts, operationCount, the generation that made the revision), and queue ETags are
/// made from those columns alone, so a follower answers them as the owner would. The rest of
/// `/v1/queues/{name}/…` (changes, long polls, listings of operations) stays relayed.
package struct FollowerReads: Sendable {
    let reads: PostgresOperationReads
    let queues: PostgresQueueReads
    let limits: APILimits

    package func addRoutes(to r: inout Router) {
        let (reads, queues, limits) = (self.reads, self.queues, self.limits)
        r.add("GET", "/v1/operations/{id}", scope: .operation(param: 0, reads: .fromStore)) { req, p in try OperationsController.status(req, p[0], from: reads)
        }
        r.add("GET", "/v1/operations/{id}/events", scope: .operation(param: 0, reads: .fromStore)) { req, p in
            try OperationsController.history(req, p[0], from: reads, limits: limits)
        }
        r.add("GET", "/v1/queues", scope: .everyQueue) { req, _ in try QueuesController.list(req, from: queues, limits: limits) }
        r.add("GET", "/v1/queues/{name}", scope: .queue(param: 0, reads: .fromStore)) { req, p in try QueuesController.get(req, p[0], from: queues) }
    }
}

/// Queues as PostgreSQL holds them: what the owner committed.
package struct PostgresQueueReads: QueueReads {
    let pool: PGReadPool

    package func queue(named name: String) throws -> QueueSnapshot {
        // A name no queue can have is not looked up (PostgreSQL's text cannot even hold some).
        guard Self.canName(name), let q = try read({ try pool.queue(named: name) }) else { throw EngineError.queueNotFound(name) }
        return q
    }

    package func queues() throws -> [QueueSnapshot] { try read { try pool.queues() } }

    /// `[A-Za-z0-9._-]{1,64}`, as the engine checks at creation.
    static func canName(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.count <= 64
            && name.utf8.allSatisfy { c in
                (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c == 46 || c == 95 || c == 45
            }
    }

    private func read<T>(_ body: () throws -> T) throws -> T {
        do { return try body() } catch let error as PGReadUnavailable { throw StoreReadUnavailable(detail: error.description) }
    }
}

/// Operations as PostgreSQL holds them: what the owner committed.
package struct PostgresOperationReads: OperationReads {
    let pool: PGReadPool

    package func revision(of id: OperationID) throws -> UInt64 {
        guard let revision = try read({ try pool.revision(of: id) }) else { throw EngineError.operationNotFound(id.description) }
        return revision
    }

    package func operation(_ id: OperationID) throws -> OperationSnapshot {
        guard let op = try read({ try pool.operation(id) }) else { throw EngineError.operationNotFound(id.description) }
        return op
    }

    package func history(of id: OperationID, after: UInt64, limit: Int) throws -> [(seq: UInt64, json: [UInt8])] {
        guard let list = try read({ try pool.history(of: id, after: after, limit: limit) }) else {
            throw EngineError.operationNotFound(id.description)
        }
        return list.map { ($0.seq, $0.json) }
    }

    /// PostgreSQL out of reach becomes 503 with `Retry-After`; a damaged row stays an internal
    /// error (logged, a generic 500).
    private func read<T>(_ body: () throws -> T) throws -> T {
        do { return try body() } catch let error as PGReadUnavailable { throw StoreReadUnavailable(detail: error.description) }
    }
}
