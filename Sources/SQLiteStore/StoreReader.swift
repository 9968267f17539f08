import QueueEngine
import StoreKit

/// The read connection and its statements; lives under `SQLiteStore.reader`'s lock.
final class StoreReader {
    private let connection: SQLiteConnection
    private let recent, byOperation, byQueue, minSeq: SQLiteStatement
    private var closed = false

    init(path: String) throws(SQLiteFailure) {
        connection = try SQLiteConnection(path: path, create: false)
        connection.setBusyTimeout(milliseconds: 5000)
        try connection.execute("PRAGMA query_only = 1; PRAGMA cache_size = -8192")
        recent = try connection.prepare("SELECT \(Schema.eventColumns) FROM events ORDER BY seq DESC LIMIT ?1")
        byOperation = try connection.prepare("SELECT \(Schema.eventColumns) FROM events WHERE operation = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3")
        minSeq = try connection.prepare("SELECT min(seq) FROM events WHERE seq > 0")
        // A window of seqs (the primary key), so a queue with few events among many costs a
        // bounded scan per call.
        byQueue = try connection.prepare(
            "SELECT \(Schema.eventColumns) FROM events WHERE seq > ?1 AND seq <= ?2 AND queue = ?3 ORDER BY seq LIMIT ?4")
    }

    func close() {
        closed = true
        connection.close()
    }

    private func ensureOpen() throws(SQLiteFailure) {
        if closed { throw SQLiteFailure(code: 21, message: "the store is closed") }  // SQLITE_MISUSE
    }

    /// Every row of `st`, decoded; rows that do not decode are skipped.
    private func rows<T>(_ st: SQLiteStatement, _ decode: (SQLiteStatement) throws(DecodeFailure) -> T) throws(SQLiteFailure) -> [T] {
        var out: [T] = []
        defer { st.reset() }
        while try st.step() {
            if let v = try? decode(st) { out.append(v) }
        }
        return out
    }

    func recentEvents(limit: Int) throws(SQLiteFailure) -> [ChangeEvent] {
        try ensureOpen()
        recent.bind(1, limit)
        return try rows(recent, RecordDecoder.event).reversed()
    }

    func events(of id: OperationID, after: UInt64, limit: Int) throws(SQLiteFailure) -> [ChangeEvent] {
        try ensureOpen()
        byOperation.bind(1, id.raw)
        byOperation.bind(2, Int64(clamping: after))
        byOperation.bind(3, Int64(clamping: limit))
        return try rows(byOperation, RecordDecoder.event)
    }

    /// Events of a queue (or of one operation) with `after` < seq <= `through`, at most `limit`
    /// rows; also how many rows were read and the last seq read, decodable or not, so a reader
    /// that resumes after it skips nothing and repeats nothing.
    func eventWindow(queue: String?, operation: OperationID?, after: UInt64, through: UInt64, limit: Int) throws(SQLiteFailure) -> EventWindow {
        try ensureOpen()
        let st: SQLiteStatement
        if let operation {
            st = byOperation
            st.bind(1, operation.raw)
            st.bind(2, Int64(clamping: after))
            st.bind(3, Int64(clamping: limit))
        } else {
            st = byQueue
            st.bind(1, Int64(clamping: after))
            st.bind(2, Int64(clamping: through))
            st.bind(3, text: queue ?? "")
            st.bind(4, Int64(clamping: limit))
        }
        defer { st.reset() }
        var window = EventWindow(events: [], rows: 0, lastSeq: after)
        while try st.step() {
            let seq = st.uint64(0)
            // The operation's statement has no upper bound: stop at it.
            if seq > through { break }
            window.rows += 1
            window.lastSeq = seq
            if let e = try? RecordDecoder.event(st) { window.events.append(e) }
        }
        return window
    }

    func oldestSeq() throws(SQLiteFailure) -> UInt64? {
        try ensureOpen()
        defer { minSeq.reset() }
        guard try minSeq.step(), !minSeq.isNull(0) else { return nil }
        return minSeq.uint64(0)
    }

    func meta(prefix: String) throws(SQLiteFailure) -> [(key: String, value: String)] {
        try ensureOpen()
        let st = try connection.prepare("SELECT key, value FROM meta WHERE substr(key, 1, length(?1)) = ?1 ORDER BY key")
        defer { st.finalize() }
        st.bind(1, text: prefix)
        var out: [(key: String, value: String)] = []
        while try st.step() {
            if let k = st.text(0), let v = st.text(1) { out.append((k, v)) }
        }
        return out
    }

    func idempotency() throws(SQLiteFailure) -> [IdempotencyRecord] {
        try ensureOpen()
        let st = try connection.prepare("SELECT \(Schema.idempotencyColumns) FROM idempotency ORDER BY created_at, rowid")
        defer { st.finalize() }
        return try rows(st, RecordDecoder.idempotency)
    }

    /// One read transaction, so limiters, queues, operations and the seq are one consistent snapshot.
    /// Unlike the feed readers, a row that does not decode fails the whole load.
    func load(lastSeq known: UInt64) throws -> RecoveredState {
        try ensureOpen()
        try connection.execute("BEGIN")
        defer { try? connection.execute("COMMIT") }
        var queues: [QueueSnapshot] = []
        var index: [String: Int] = [:]
        let qs = try connection.prepare("SELECT \(Schema.queueColumns) FROM queues ORDER BY name")
        defer { qs.finalize() }
        while try qs.step() {
            let q = try RecordDecoder.queue(qs)
            index[q.name] = queues.count
            queues.append(q)
        }
        var operations: [OperationSnapshot] = []
        let os = try connection.prepare("SELECT \(Schema.operationColumns) FROM operations ORDER BY id")
        defer { os.finalize() }
        while try os.step() {
            let op = try RecordDecoder.operation(os)
            if let i = index[op.queue] {
                queues[i].counts[op.state, default: 0] += 1
                if op.state != .finished { queues[i].operationCount += 1 }
            }
            operations.append(op)
        }
        var limiters: [LimiterSnapshot] = []
        let ls = try connection.prepare("SELECT \(Schema.limiterColumns) FROM limiters ORDER BY name")
        defer { ls.finalize() }
        while try ls.step() { limiters.append(try RecordDecoder.limiter(ls)) }
        var hosts: [HostSnapshot] = []
        let hs = try connection.prepare("SELECT \(Schema.hostColumns) FROM hosts ORDER BY host")
        defer { hs.finalize() }
        while try hs.step() { hosts.append(try RecordDecoder.host(hs)) }
        var schedules: [ScheduleSnapshot] = []
        let ss = try connection.prepare("SELECT \(Schema.scheduleColumns) FROM schedules ORDER BY queue, name")
        defer { ss.finalize() }
        while try ss.step() { schedules.append(try RecordDecoder.schedule(ss)) }
        var history: [HistoryRow] = []
        let hr = try connection.prepare("SELECT queue, step, start, data FROM history ORDER BY queue, step, start")
        defer { hr.finalize() }
        while try hr.step() { history.append(try RecordDecoder.history(hr)) }
        let stored = UInt64(bitPattern: try connection.integer(Schema.lastSeq))
        guard stored <= RecordLimits.maxCounter else { throw DecodeFailure(detail: "the last event seq \(stored) is out of range") }
        var state = RecoveredState(queues: queues, operations: operations, lastSeq: max(stored, known), limiters: limiters, hosts: hosts)
        state.schedules = schedules
        state.history = history
        return state
    }
}
