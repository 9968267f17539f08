import MicroHTTP
import PostgresStore
import QueueEngine

/// The reads a cluster follower answers from PostgreSQL itself instead of relaying them to the
/// owner (CLUSTER.md: "Reads that need no owner … may be served from PostgreSQL by any
/// instance"): an operation's status and its history. They keep answering while no instance
/// owns the queues (a takeover) and cost the owner nothing. The route code is the owner's
/// (`OperationsController.status`/`history`), so validation, errors and JSON are the same bytes;
/// only where the operation is read from differs. The owner answers a change only after its
/// commit, so a client that got a 2xx reads its change here too.
///
/// `GET /v1/queues` and `GET /v1/queues/{name}` stay relayed: a queue's `revision` moves with
/// every change of its operations in the owner's memory but is stored only when the queue itself
/// changes, and its `ETag` names the owner's process, so neither can be read from the tables.
struct FollowerReads: Sendable {
    let reads: PostgresOperationReads
    let limits: OpqdConfiguration.Limits

    func addRoutes(to r: inout Router) {
        let (reads, limits) = (self.reads, self.limits)
        r.add("GET", "/v1/operations/{id}") { req, p in try OperationsController.status(req, p[0], from: reads) }
        r.add("GET", "/v1/operations/{id}/events") { req, p in try OperationsController.history(req, p[0], from: reads, limits: limits) }
    }
}

/// Operations as PostgreSQL holds them: what the owner committed.
struct PostgresOperationReads: OperationReads {
    let pool: PGReadPool

    func revision(of id: OperationID) throws -> UInt64 {
        guard let revision = try read({ try pool.revision(of: id) }) else { throw EngineError.operationNotFound(id.description) }
        return revision
    }

    func operation(_ id: OperationID) throws -> OperationSnapshot {
        guard let op = try read({ try pool.operation(id) }) else { throw EngineError.operationNotFound(id.description) }
        return op
    }

    func history(of id: OperationID, after: UInt64, limit: Int) throws -> [(seq: UInt64, json: [UInt8])] {
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

/// PostgreSQL could not be read (a follower's reads, an owner's history): 503, retry shortly.
struct StoreReadUnavailable: Error, ProblemConvertible {
    let detail: String
    var problem: Problem {
        Problem(503, "store-unavailable", "Store unavailable", "cannot read from PostgreSQL: \(detail)", headers: [("Retry-After", "1")])
    }
}
