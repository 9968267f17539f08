import Dispatch
import Locking
import QueueEngine
import StoreKit

/// A read from PostgreSQL failed: the server cannot be reached (or every read connection stayed
/// busy too long). The caller answers 503 and the client retries.
public struct PGReadUnavailable: Error, CustomStringConvertible {
    public let description: String
    /// PostgreSQL could not be reached (not merely busy, or a statement that failed): reads
    /// fail at once for a moment after it.
    var unreachable = false
}

/// A row read back is not one opqd could have written (a database edited by hand): not the
/// client's fault and not a retry's cure.
public struct PGReadDamaged: Error, CustomStringConvertible {
    public let description: String
}

/// A few read connections shared by a follower's server threads, so that reads answered from
/// PostgreSQL (an operation's status, its history, queue statuses) run side by side instead of queueing on one
/// connection. Connections open lazily, at most `size`; each is a `PGReader`, which replaces a
/// broken connection on its next read (one retry per read). A thread that finds every connection
/// busy waits up to `waitSeconds`, then gets `PGReadUnavailable`.
public final class PGReadPool: @unchecked Sendable {  // `idle` is only touched under its lock
    public static let defaultSize = 4
    /// Seconds a read waits for a free connection before it gives up (503).
    static let waitSeconds = 1.0

    private let url: String
    private let slots: DispatchSemaphore
    private let idle = Lock<(readers: [PGReader], closed: Bool)>(([], false))
    /// When the last read failed for want of PostgreSQL (monotonic ns), and why.
    private let failed = Lock<(at: Int, reason: String)?>(nil)
    /// For this long after a failed read, reads fail at once (0.5 s; clients retry after 1 s).
    static let failFastNanos = 500_000_000

    public init(url: String, size: Int = PGReadPool.defaultSize) {
        self.url = url
        slots = DispatchSemaphore(value: max(1, size))
    }

    /// Runs `body` on a reader of its own: an idle one, or a new one while fewer than `size` exist.
    private func withReader<T>(_ body: (PGReader) throws(PGFailure) -> T) throws(PGReadUnavailable) -> T {
        // Just failed: fail at once rather than have every server thread wait for a connect
        // timeout of its own while PostgreSQL is away.
        if let recent = failed.withLock({ $0 }), PGMembership.monotonicNanos() &- recent.at < Self.failFastNanos {
            throw PGReadUnavailable(description: recent.reason)
        }
        do throws(PGReadUnavailable) {
            let value = try read(body)
            failed.withLock { $0 = nil }
            return value
        } catch {
            if error.unreachable {
                let at = PGMembership.monotonicNanos()
                failed.withLock { $0 = (at, error.description) }
            }
            throw error
        }
    }

    private func read<T>(_ body: (PGReader) throws(PGFailure) -> T) throws(PGReadUnavailable) -> T {
        guard slots.wait(timeout: .now() + Self.waitSeconds) == .success else {
            throw PGReadUnavailable(description: "every read connection to PostgreSQL stayed busy for \(Int(Self.waitSeconds)) s")
        }
        defer { slots.signal() }
        let taken = idle.withLock { s -> (reader: PGReader?, closed: Bool) in (s.readers.popLast(), s.closed) }
        if taken.closed { throw PGReadUnavailable(description: "the server is shutting down") }
        // A new reader connects on its first read (a failure to connect is a lost connection:
        // `unreachable`). Back to the idle list whatever happened: a reader whose connection
        // broke reconnects on its next read.
        let reader = taken.reader ?? PGReader(url: url, connection: nil, bounded: true)
        defer {
            let closed = idle.withLock { s -> Bool in
                if !s.closed { s.readers.append(reader) }
                return s.closed
            }
            if closed { reader.close() }
        }
        do { return try body(reader) } catch { throw PGReadUnavailable(description: error.description, unreachable: error.connectionLost) }
    }

    /// The id as the `bigint` it is stored as; nil for one no operation can have.
    private static func key(_ id: OperationID) -> Int64? {
        guard id.raw > 0, id.raw <= RecordLimits.maxID else { return nil }
        return Int64(exactly: id.raw)
    }

    /// The committed row of operation `id`, or nil when there is none.
    public func operation(_ id: OperationID) throws -> OperationSnapshot? {
        guard let key = Self.key(id) else { return nil }
        let r = try withReader { reader throws(PGFailure) in
            try reader.withConnection { c throws(PGFailure) in
                try c.execPrepared("opqd_read_operation", Self.operationQuery, [PGParameter(key)])
            }
        }
        guard r.rows > 0 else { return nil }
        do { return try PGRecordDecoder.operation(r, 0) } catch { throw PGReadDamaged(description: error.detail) }
    }

    static let operationQuery = "SELECT \(PGSchema.operationColumns) FROM opqd.operations WHERE id = $1::bigint"

    /// The committed revision of operation `id`, or nil when there is none.
    public func revision(of id: OperationID) throws -> UInt64? {
        guard let key = Self.key(id) else { return nil }
        let r = try withReader { reader throws(PGFailure) in
            try reader.withConnection { c throws(PGFailure) in
                try c.execPrepared("opqd_read_revision", "SELECT revision FROM opqd.operations WHERE id = $1::bigint", [PGParameter(key)])
            }
        }
        guard r.rows > 0 else { return nil }
        guard let n = r.int64(0, 0), let revision = UInt64(exactly: n) else {
            throw PGReadDamaged(description: "operations row \(key): column revision is \(r.text(0, 0) ?? "NULL")")
        }
        return revision
    }

    /// The kept events of operation `id` with seq > `after`, oldest first, at most `limit` (as
    /// the owner's store reads them); nil when there is no such operation.
    public func history(of id: OperationID, after: UInt64, limit: Int) throws -> [ChangeEvent]? {
        guard let key = Self.key(id) else { return nil }
        let r = try withReader { reader throws(PGFailure) in
            try reader.withConnection { c throws(PGFailure) in
                try c.execPrepared("opqd_read_history", Self.historyQuery, [PGParameter(key), PGParameter(Int64(clamping: after)), PGParameter(max(0, limit))])
            }
        }
        // No row: no such operation. One row of NULLs: an operation without events (after
        // `after`). Rows that do not decode are skipped, as the owner's store skips them.
        guard r.rows > 0 else { return nil }
        var out: [ChangeEvent] = []
        out.reserveCapacity(r.rows)
        for i in 0..<r.rows where !r.isNull(i, 0) {
            if let e = try? PGRecordDecoder.event(r, i) { out.append(e) }
        }
        return out
    }

    /// The operation's row joined with its events in one round trip: the existence check and the
    /// page cannot disagree, and a read costs one statement.
    static let historyQuery = """
        SELECT \(PGSchema.eventColumns.split(separator: ",").map { "e." + $0.trimmingCharacters() }.joined(separator: ", ")) \
        FROM opqd.operations o LEFT JOIN LATERAL (SELECT \(PGSchema.eventColumns) FROM opqd.events \
        WHERE operation = o.id AND seq > $2::bigint ORDER BY seq LIMIT $3::bigint) e ON true WHERE o.id = $1::bigint ORDER BY e.seq
        """

    /// The committed status of queue `name` (its row, as its owner last wrote it), or nil when
    /// there is none. The caller passes only names a queue can have.
    public func queue(named name: String) throws -> QueueSnapshot? {
        let r = try withReader { reader throws(PGFailure) in
            try reader.withConnection { c throws(PGFailure) in
                try c.execPrepared("opqd_read_queue", PGSchema.selectQueue, [PGParameter(name)])
            }
        }
        guard r.rows > 0 else { return nil }
        do { return try PGRecordDecoder.queue(r, 0) } catch { throw PGReadDamaged(description: error.detail) }
    }

    /// Every queue's committed status, sorted by name as the engine lists them.
    public func queues() throws -> [QueueSnapshot] {
        let r = try withReader { reader throws(PGFailure) in
            try reader.withConnection { c throws(PGFailure) in
                try c.execPrepared("opqd_read_queues", PGSchema.selectQueues, [])
            }
        }
        var out: [QueueSnapshot] = []
        out.reserveCapacity(r.rows)
        for i in 0..<r.rows {
            do { out.append(try PGRecordDecoder.queue(r, i)) } catch { throw PGReadDamaged(description: error.detail) }
        }
        return out
    }

    /// The committed limiter `name`, or nil when there is none (a cluster's instances learn of a
    /// limiter another one made from here).
    public func limiter(named name: String) throws -> LimiterSnapshot? {
        let r = try withReader { reader throws(PGFailure) in
            try reader.withConnection { c throws(PGFailure) in
                try c.execPrepared("opqd_read_limiter", "SELECT \(PGSchema.limiterColumns) FROM opqd.limiters WHERE name = $1", [PGParameter(name)])
            }
        }
        guard r.rows > 0 else { return nil }
        do { return try PGRecordDecoder.limiter(r, 0) } catch { throw PGReadDamaged(description: error.detail) }
    }

    /// The committed state of host `host` (another instance changed it); nil when none is stored.
    public func host(named host: String) throws -> HostSnapshot? {
        let r = try withReader { reader throws(PGFailure) in
            try reader.withConnection { c throws(PGFailure) in
                try c.execPrepared("opqd_read_host", "SELECT \(PGSchema.hostColumns) FROM opqd.hosts WHERE host = $1", [PGParameter(host)])
            }
        }
        guard r.rows > 0 else { return nil }
        do { return try PGRecordDecoder.host(r, 0) } catch { throw PGReadDamaged(description: error.detail) }
    }

    /// Every committed limiter, sorted by name.
    public func limiters() throws -> [LimiterSnapshot] {
        let r = try withReader { reader throws(PGFailure) in
            try reader.withConnection { c throws(PGFailure) in try c.execPrepared("opqd_read_limiters", PGSchema.selectLimiters, []) }
        }
        do { return try PGReader.limiters(r) } catch { throw PGReadDamaged(description: error.detail) }
    }

    /// How many committed unfinished operations name limiter `name`, on any instance, counted up
    /// to 1,000 (a delete is refused while any does). The limits column is written by one
    /// encoder (`FlowText.writeLimits`), so the literal `"limiter":"<name>"` finds them.
    public func operationsNaming(limiter name: String) throws -> Int {
        var needle: [UInt8] = Array(#""limiter":"#.utf8)
        JSONWriter.string(name, to: &needle)
        let r = try withReader { reader throws(PGFailure) in
            try reader.withConnection { c throws(PGFailure) in
                try c.execPrepared(
                    "opqd_read_limiter_users",
                    "SELECT count(*) FROM (SELECT 1 FROM opqd.operations WHERE state <> 'finished' AND limits IS NOT NULL AND strpos(limits, $1) > 0 LIMIT 1000) x",
                    [PGParameter(String(decoding: needle, as: UTF8.self))])
            }
        }
        return Int(r.int64(0, 0) ?? 0)
    }

    /// Closes the idle connections; a read under way closes its own when it ends.
    public func close() {
        let readers = idle.withLock { s -> [PGReader] in
            s.closed = true
            defer { s.readers = [] }
            return s.readers
        }
        for r in readers { r.close() }
    }
}
