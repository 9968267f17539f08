import QueueEngine
import StoreKit

/// The read connection; lives under `PostgresStore.reader`'s lock. A broken connection is
/// replaced on the next read (one retry per read), so the feed's readers recover with the server.
final class PGReader {
    private let url: String
    private var connection: PGConnection?
    private var closed = false
    /// Connects as `PGConnection(boundedReads:)` (the read pool's and the owner's feed readers).
    private let bounded: Bool
    /// Connections made so far: a caller that sets session state tells a new one by it.
    private(set) var connections = 0

    /// `connection` nil: opened on the first read.
    init(url: String, connection: PGConnection?, bounded: Bool = false) {
        self.url = url
        self.connection = connection
        self.bounded = bounded
    }

    func close() {
        closed = true
        connection?.close()
        connection = nil
    }

    /// Runs `body` on a usable connection, reconnecting once if the connection was lost.
    func withConnection<T>(_ body: (PGConnection) throws(PGFailure) -> T) throws(PGFailure) -> T {
        if closed { throw PGFailure(message: "the store is closed", sqlState: nil, connectionLost: false) }
        var retried = false
        while true {
            let c: PGConnection
            if let existing = connection, existing.isUsable {
                c = existing
            } else {
                connection?.close()
                connection = nil
                c = bounded ? try PGConnection(url: url, connectTimeoutSeconds: 2, boundedReads: true) : try PGConnection(url: url)
                connection = c
                connections += 1
            }
            do throws(PGFailure) {
                return try body(c)
            } catch {
                if error.connectionLost && !retried {
                    retried = true
                    continue
                }
                throw error
            }
        }
    }

    /// Every row of `result`, decoded; rows that do not decode are skipped.
    private func rows<T>(_ result: PGResult, _ decode: (PGResult, Int) throws(DecodeFailure) -> T) -> [T] {
        var out: [T] = []
        out.reserveCapacity(result.rows)
        for i in 0..<result.rows {
            if let v = try? decode(result, i) { out.append(v) }
        }
        return out
    }

    func recentEvents(limit: Int) throws(PGFailure) -> [ChangeEvent] {
        let r = try withConnection { c throws(PGFailure) in
            try c.exec("SELECT \(PGSchema.eventColumns) FROM opqd.events ORDER BY seq DESC LIMIT $1::bigint", [PGParameter(limit)])
        }
        return rows(r, PGRecordDecoder.event).reversed()
    }

    /// Events after `seq`, oldest first: what a follower's feed takes in. Prepared: every
    /// instance runs it on every other instance's commit.
    func events(after seq: UInt64, limit: Int) throws(PGFailure) -> [ChangeEvent] {
        let r = try withConnection { c throws(PGFailure) in
            try c.execPrepared(
                "opqd_feed_after", Self.eventsAfter, [PGParameter(Int64(clamping: seq)), PGParameter(Int64.max), PGParameter(limit)])
        }
        return rows(r, PGRecordDecoder.event)
    }

    /// The feed's read. The upper bound (`$2`, always the largest bigint) changes no result; it
    /// is there for the planner. Without statistics on `opqd.events` (a young database, before
    /// autovacuum's first ANALYZE) `seq > $1` alone is estimated at a third of the table, and
    /// the plan was a sequential scan and a sort of every event on every read: in a 12 s
    /// `opqd-bench cluster` run of 3 instances, 2.2 million rows scanned per 1,000 creates and
    /// a third of PostgreSQL's CPU. Bounded on both sides, it is estimated as a narrow range,
    /// read from the primary key, with or without statistics, and its generic plan (prepared)
    /// is that one too.
    static let eventsAfter =
        "SELECT \(PGSchema.eventColumns) FROM opqd.events WHERE seq > $1::bigint AND seq <= $2::bigint ORDER BY seq LIMIT $3::bigint"

    func events(of id: OperationID, after: UInt64, limit: Int) throws(PGFailure) -> [ChangeEvent] {
        let r = try withConnection { c throws(PGFailure) in
            try c.exec(
                "SELECT \(PGSchema.eventColumns) FROM opqd.events WHERE operation = $1::bigint AND seq > $2::bigint ORDER BY seq LIMIT $3::bigint",
                [PGParameter(Int64(clamping: id.raw)), PGParameter(Int64(clamping: after)), PGParameter(limit)])
        }
        return rows(r, PGRecordDecoder.event)
    }

    /// As `StoreReader.eventWindow`: the rows read, decodable or not, and the last seq read.
    func eventWindow(queue: String?, operation: OperationID?, after: UInt64, through: UInt64, limit: Int) throws(PGFailure) -> EventWindow {
        // Text parameters are C strings: a name with U+0000 would be cut short and match
        // another queue. No queue has one (names are [A-Za-z0-9._-]).
        if operation == nil, queue?.utf8.contains(0) == true { return EventWindow(events: [], rows: 0, lastSeq: after) }
        let r = try withConnection { c throws(PGFailure) in
            if let operation {
                return try c.exec(
                    """
                    SELECT \(PGSchema.eventColumns) FROM opqd.events WHERE operation = $1::bigint AND seq > $2::bigint AND seq <= $3::bigint \
                    ORDER BY seq LIMIT $4::bigint
                    """,
                    [
                        PGParameter(Int64(clamping: operation.raw)), PGParameter(Int64(clamping: after)), PGParameter(Int64(clamping: through)),
                        PGParameter(limit),
                    ])
            }
            // A window of seqs (the primary key), as the SQLite store reads it: a queue with few
            // events among many costs a bounded scan per call, and no index on queue is kept up
            // on every insert for it.
            return try c.exec(
                "SELECT \(PGSchema.eventColumns) FROM opqd.events WHERE queue = $1 AND seq > $2::bigint AND seq <= $3::bigint ORDER BY seq LIMIT $4::bigint",
                [PGParameter(queue ?? ""), PGParameter(Int64(clamping: after)), PGParameter(Int64(clamping: through)), PGParameter(limit)])
        }
        var window = EventWindow(events: [], rows: 0, lastSeq: after)
        for i in 0..<r.rows {
            // A row whose seq is unreadable still counts as read; the window resumes after the
            // last seq it could read.
            window.rows += 1
            if let seq = PGRecordDecoder.seq(r, i), seq > window.lastSeq { window.lastSeq = seq }
            if let e = try? PGRecordDecoder.event(r, i) { window.events.append(e) }
        }
        return window
    }

    func oldestSeq() throws(PGFailure) -> UInt64? {
        let r = try withConnection { c throws(PGFailure) in try c.exec("SELECT min(seq) FROM opqd.events WHERE seq > 0") }
        guard let n = r.int64(0, 0) else { return nil }
        return UInt64(exactly: n)
    }

    func meta(prefix: String) throws(PGFailure) -> [(key: String, value: String)] {
        let r = try withConnection { c throws(PGFailure) in try c.exec(PGSchema.selectMetaPrefix, [PGParameter(bytea: prefix.utf8)]) }
        var out: [(key: String, value: String)] = []
        for i in 0..<r.rows {
            if let k = r.bytea(i, 0), let v = r.bytea(i, 1) {
                out.append((String(decoding: k, as: UTF8.self), String(decoding: v, as: UTF8.self)))
            }
        }
        return out
    }

    /// `partitions`: only the answers kept with changes to their queues (and those kept with
    /// none); nil: all.
    func idempotency(partitions: [Int]? = nil) throws(PGFailure) -> [IdempotencyRecord] {
        let r = try withConnection { c throws(PGFailure) in
            if let partitions {
                var a = ArrayColumn()
                for p in partitions { a.int(Int64(p)) }
                return try c.exec(
                    "SELECT \(PGSchema.idempotencyColumns) FROM opqd.idempotency WHERE part = ANY($1::integer[]) OR part IS NULL ORDER BY created_at, scope",
                    [a.parameter])
            }
            return try c.exec("SELECT \(PGSchema.idempotencyColumns) FROM opqd.idempotency ORDER BY created_at, scope")
        }
        return rows(r, PGRecordDecoder.idempotency)
    }

    /// One repeatable-read transaction, so limiters, queues, operations and the seq are one
    /// consistent snapshot. Unlike the feed's readers, a row that does not decode fails the whole load.
    func load(lastSeq known: UInt64) throws -> RecoveredState {
        let (ls, hs, ss, hr, qs, os, seqs) = try withConnection { c throws(PGFailure) in
            try c.exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            do throws(PGFailure) {
                let ls = try c.exec(PGSchema.selectLimiters)
                let hs = try c.exec(PGSchema.selectHosts)
                let ss = try c.exec("SELECT \(PGSchema.scheduleColumns) FROM opqd.schedules ORDER BY queue, name")
                let hr = try c.exec("SELECT \(PGSchema.historyColumns) FROM opqd.history ORDER BY queue, step, start")
                let qs = try c.exec("SELECT \(PGSchema.queueColumns) FROM opqd.queues ORDER BY name")
                let os = try c.exec("SELECT \(PGSchema.operationColumns) FROM opqd.operations ORDER BY id")
                let seqs = try c.exec(PGSchema.lastSeq)
                try c.exec("COMMIT")
                return (ls, hs, ss, hr, qs, os, seqs)
            } catch {
                _ = try? c.exec("ROLLBACK")
                throw error
            }
        }
        let (queues, operations) = try Self.decode(qs, os)
        let stored = try Self.lastSeq(seqs)
        var state = RecoveredState(
            queues: queues, operations: operations, lastSeq: max(stored, known), limiters: try Self.limiters(ls), hosts: try Self.hosts(hs))
        state.schedules = try Self.schedules(ss)
        state.history = try Self.history(hr)
        return state
    }

    /// The queues named (those that exist) with their operations, and for every dependency of
    /// theirs outside them whether it exists and is finished (and whether a cascade cancelled
    /// it): what a cluster instance adopts when it becomes the owner of more partitions. Every
    /// limiter comes too, whoever wrote it: limiters belong to no partition, and the operations
    /// taken in may name any of them (the engine keeps those it has). One repeatable-read snapshot.
    func load(queues names: [String]) throws -> (RecoveredState, RemoteStates) {
        var list = ArrayColumn()
        for n in names { list.text(n) }
        let (ls, hs, ss, hr, qs, os, deps) = try withConnection { c throws(PGFailure) in
            try c.exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            do throws(PGFailure) {
                let ls = try c.exec(PGSchema.selectLimiters)
                let hs = try c.exec(PGSchema.selectHosts)
                let ss = try c.exec(
                    "SELECT \(PGSchema.scheduleColumns) FROM opqd.schedules WHERE queue = ANY($1::text[]) ORDER BY queue, name", [list.parameter])
                let hr = try c.exec(
                    "SELECT \(PGSchema.historyColumns) FROM opqd.history WHERE queue = ANY($1::text[]) ORDER BY queue, step, start", [list.parameter])
                let qs = try c.exec("SELECT \(PGSchema.queueColumns) FROM opqd.queues WHERE name = ANY($1::text[]) ORDER BY name", [list.parameter])
                let os = try c.exec(
                    "SELECT \(PGSchema.operationColumns) FROM opqd.operations WHERE queue = ANY($1::text[]) ORDER BY id", [list.parameter])
                // The dependencies of their unfinished operations that are in other queues, and
                // those of a committed batch across instances not added yet by their owner
                // (not finished: `operationStates`).
                let deps = try c.exec(
                    """
                    WITH wanted AS (SELECT DISTINCT unnest(d.dependencies) AS id FROM opqd.operations d \
                    WHERE d.queue = ANY($1::text[]) AND d.state <> 'finished') \
                    SELECT o.id, o.state = 'finished', o.cascade_at FROM opqd.operations o JOIN wanted w ON o.id = w.id \
                    WHERE NOT (o.queue = ANY($1::text[])) \
                    UNION ALL SELECT w.id, false, NULL FROM wanted w WHERE NOT EXISTS (SELECT 1 FROM opqd.operations o WHERE o.id = w.id) \
                    AND EXISTS (SELECT 1 FROM opqd.batch_parts p WHERE w.id = ANY(p.ids))
                    """, [list.parameter])
                try c.exec("COMMIT")
                return (ls, hs, ss, hr, qs, os, deps)
            } catch {
                _ = try? c.exec("ROLLBACK")
                throw error
            }
        }
        let (queues, operations) = try Self.decode(qs, os)
        var state = RecoveredState(queues: queues, operations: operations, lastSeq: 0, limiters: try Self.limiters(ls), hosts: try Self.hosts(hs))
        state.schedules = try Self.schedules(ss)
        state.history = try Self.history(hr)
        return (state, Self.states(deps))
    }

    /// The queue of operation `id`, nil when there is none.
    func queue(of id: OperationID) throws(PGFailure) -> String? {
        let r = try withConnection { c throws(PGFailure) in
            try c.exec("SELECT queue FROM opqd.operations WHERE id = $1::bigint", [PGParameter(Int64(clamping: id.raw))])
        }
        return r.rows == 1 ? r.text(0, 0) : nil
    }

    /// Whether each of `ids` exists and is finished, and which a cascade cancelled (ids of no
    /// operation are left out).
    func operationStates(_ ids: [OperationID]) throws(PGFailure) -> RemoteStates {
        var list = ArrayColumn()
        for id in ids { list.int(Int64(clamping: id.raw)) }
        let r = try withConnection { c throws(PGFailure) in
            // One statement, one snapshot: an operation of a committed batch across instances
            // that its owner has not added yet (its part still in `batch_parts`) exists and is
            // not finished; its part's row goes only after the operation's row is committed.
            try c.exec(
                """
                SELECT id, state = 'finished', cascade_at FROM opqd.operations WHERE id = ANY($1::bigint[]) \
                UNION ALL SELECT x, false, NULL FROM unnest($1::bigint[]) AS x \
                WHERE NOT EXISTS (SELECT 1 FROM opqd.operations o WHERE o.id = x) AND EXISTS (SELECT 1 FROM opqd.batch_parts p WHERE x = ANY(p.ids))
                """, [list.parameter])
        }
        return Self.states(r)
    }

    /// The queue of each of `ids` that names an operation.
    func queues(of ids: [OperationID]) throws(PGFailure) -> [OperationID: String] {
        var list = ArrayColumn()
        for id in ids { list.int(Int64(clamping: id.raw)) }
        let r = try withConnection { c throws(PGFailure) in
            try c.exec("SELECT id, queue FROM opqd.operations WHERE id = ANY($1::bigint[])", [list.parameter])
        }
        var out: [OperationID: String] = [:]
        for i in 0..<r.rows {
            guard let id = r.int64(i, 0), let raw = UInt64(exactly: id), let queue = r.text(i, 1) else { continue }
            out[OperationID(raw: raw)] = queue
        }
        return out
    }

    /// The row of operation `id`, decoded; nil when there is none.
    func operation(_ id: OperationID) throws -> OperationSnapshot? {
        let r = try withConnection { c throws(PGFailure) in
            try c.exec("SELECT \(PGSchema.operationColumns) FROM opqd.operations WHERE id = $1::bigint", [PGParameter(Int64(clamping: id.raw))])
        }
        return r.rows == 1 ? try PGRecordDecoder.operation(r, 0) : nil
    }

    /// Whether `target` is reachable from `ids` along the dependencies of unfinished operations
    /// (a dependency change that would close a cycle through several instances' queues).
    func reaches(_ target: OperationID, from ids: [OperationID]) throws(PGFailure) -> Bool {
        var list = ArrayColumn()
        for id in ids { list.int(Int64(clamping: id.raw)) }
        let r = try withConnection { c throws(PGFailure) in
            try c.exec(
                """
                WITH RECURSIVE r(id) AS (SELECT unnest($1::bigint[]) UNION \
                SELECT unnest(o.dependencies) FROM opqd.operations o JOIN r ON o.id = r.id WHERE o.state <> 'finished') \
                SELECT EXISTS (SELECT 1 FROM r WHERE id = $2::bigint)
                """, [list.parameter, PGParameter(Int64(clamping: target.raw))])
        }
        return r.rows == 1 && r.bool(0, 0) == true
    }

    /// Rows of (id, finished, cascade_at). A cascade counts once the operation is finished.
    static func states(_ r: PGResult) -> RemoteStates {
        var out = RemoteStates()
        for i in 0..<r.rows {
            guard let id = r.int64(i, 0), let raw = UInt64(exactly: id), let finished = r.bool(i, 1) else { continue }
            let opID = OperationID(raw: raw)
            out.finished[opID] = finished
            if finished, let at = r.int64(i, 2) { out.cascades[opID] = Timestamp(nanoseconds: at) }
        }
        return out
    }

    /// Decoded queue and operation rows, each queue's counts counted from its operations (as
    /// the engine does when it restores them: a stored count, even a damaged one, is not added
    /// to). A row that does not decode fails the whole read.
    static func decode(_ qs: PGResult, _ os: PGResult) throws -> ([QueueSnapshot], [OperationSnapshot]) {
        var queues: [QueueSnapshot] = []
        var index: [String: Int] = [:]
        for i in 0..<qs.rows {
            var q = try PGRecordDecoder.queue(qs, i)
            q.operationCount = 0
            for s in OperationState.allCases { q.counts[s] = 0 }
            index[q.name] = queues.count
            queues.append(q)
        }
        var operations: [OperationSnapshot] = []
        operations.reserveCapacity(os.rows)
        for i in 0..<os.rows {
            let op = try PGRecordDecoder.operation(os, i)
            if let i = index[op.queue] {
                queues[i].counts[op.state, default: 0] += 1
                if op.state != .finished { queues[i].operationCount += 1 }
            }
            operations.append(op)
        }
        return (queues, operations)
    }

    /// Decoded limiter rows; a row that does not decode fails the whole read.
    static func limiters(_ r: PGResult) throws(DecodeFailure) -> [LimiterSnapshot] {
        var out: [LimiterSnapshot] = []
        out.reserveCapacity(r.rows)
        for i in 0..<r.rows { out.append(try PGRecordDecoder.limiter(r, i)) }
        return out
    }

    static func history(_ r: PGResult) throws(DecodeFailure) -> [HistoryRow] {
        var out: [HistoryRow] = []
        out.reserveCapacity(r.rows)
        for i in 0..<r.rows {
            out.append(try HistoryText.row(queue: r.text(i, 0) ?? "", step: r.int64(i, 1) ?? 0, start: r.int64(i, 2) ?? -1, data: r.text(i, 3)).get())
        }
        return out
    }

    static func schedules(_ r: PGResult) throws(DecodeFailure) -> [ScheduleSnapshot] {
        var out: [ScheduleSnapshot] = []
        for i in 0..<r.rows { out.append(try PGRecordDecoder.schedule(r, i)) }
        return out
    }

    static func hosts(_ r: PGResult) throws(DecodeFailure) -> [HostSnapshot] {
        var out: [HostSnapshot] = []
        out.reserveCapacity(r.rows)
        for i in 0..<r.rows { out.append(try PGRecordDecoder.host(r, i)) }
        return out
    }

    /// The newest seq ever written, from the result of `PGSchema.lastSeq`.
    static func lastSeq(_ r: PGResult) throws(DecodeFailure) -> UInt64 {
        var stored: UInt64 = 0
        if !r.isNull(0, 0) {
            guard let b = r.bytea(0, 0), let n = UInt64(String(decoding: b, as: UTF8.self)), n <= RecordLimits.maxCounter else {
                throw DecodeFailure(detail: "meta last_seq is not a seq")
            }
            stored = n
        }
        if !r.isNull(0, 1) {
            guard let m = r.int64(0, 1), let n = UInt64(exactly: m), n <= RecordLimits.maxCounter else {
                throw DecodeFailure(detail: "the newest event seq \(r.text(0, 1) ?? "") is out of range")
            }
            stored = max(stored, n)
        }
        return stored
    }
}
