import QueueEngine
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// How hard each commit is pushed to the disk (SQLite's `PRAGMA synchronous` in WAL mode).
public enum SyncMode: String, Sendable, CaseIterable {
    /// `synchronous=FULL`: the WAL is fsynced at every commit, so an acknowledged change
    /// survives a power loss as well as a crash of the process.
    case full
    /// `synchronous=NORMAL`: the WAL is fsynced only at checkpoints. Survives a crash of the
    /// process; a power loss may lose the last acknowledged commits (never corrupts).
    case normal
}

/// The first answer to a create made with an `Idempotency-Key`, kept so that a retry after a
/// restart still gets it.
public struct IdempotencyRecord: Sendable, Equatable {
    /// The key with whatever it is scoped to (method, path, client).
    public var scope: String
    /// A digest of the request body, to refuse the same key with another body.
    public var bodyHash: String
    /// The HTTP status of the first answer.
    public var status: Int
    /// Its headers, in order.
    public var headers: [(String, String)]
    /// Its body.
    public var body: [UInt8]
    /// When it was saved (for expiry).
    public var createdAt: Timestamp

    /// Creates a record.
    public init(scope: String, bodyHash: String, status: Int, headers: [(String, String)], body: [UInt8], createdAt: Timestamp) {
        self.scope = scope; self.bodyHash = bodyHash; self.status = status
        self.headers = headers; self.body = body; self.createdAt = createdAt
    }

    /// Field by field (tuples are not `Equatable`).
    public static func == (a: IdempotencyRecord, b: IdempotencyRecord) -> Bool {
        a.scope == b.scope && a.bodyHash == b.bodyHash && a.status == b.status && a.body == b.body
            && a.createdAt == b.createdAt && a.headers.count == b.headers.count
            && zip(a.headers, b.headers).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
    }
}

/// Counters of the writer, for benchmarks and metrics.
public struct StoreStats: Sendable, Equatable {
    /// Transactions committed.
    public var commits: Int
    /// Records committed (store records plus idempotency entries).
    public var records: Int
    /// `append` calls.
    public var appends: Int
    /// The most records one commit carried.
    public var largestCommit: Int
    /// Commits that failed and were retried.
    public var failures: Int
    /// Seconds the writer spent inside transactions, fsync waits included.
    public var busySeconds: Double
    /// CPU seconds the writer thread used inside transactions.
    public var cpuSeconds: Double
    /// Mean records per commit: how much group commit batches.
    public var recordsPerCommit: Double { commits == 0 ? 0 : Double(records) / Double(commits) }
}

/// The durable store: one SQLite file, `<directory>/opqd.sqlite`, in WAL mode.
///
/// It talks to libsqlite3 directly through a thin bridge (`Bridge/`, the only code that calls
/// `sqlite3_*`) rather than through GRDB or SQLite.swift: one system library and a few hundred
/// lines instead of a large dependency, so clean CI builds stay fast and there are fewer moving
/// parts; and the group-commit writer needs full control of transactions, statements and
/// threads (one connection owned by one dedicated thread, `BEGIN IMMEDIATE` ... `COMMIT` around
/// everything queued, statements prepared once and rebound), which a database-pool abstraction
/// would hide or fight.
///
/// Writes: `append` hands records to the writer thread and returns at once. The writer takes
/// everything queued, applies it in one transaction, commits, and only then calls the
/// `whenDurable` callbacks of the tickets it covered. Reads (`load`, `events(of:)`, ...) use a
/// second connection, which WAL lets run alongside the writer.
///
/// Opening never starts empty over existing data: a file that is not a database, fails
/// `PRAGMA quick_check`, belongs to another program, has a newer schema or cannot be read and
/// written makes `init` throw a `StoreError` that names the file and what to do.
public final class SQLiteStore: OperationStore {
    /// The directory given to `init`.
    public let directory: String
    /// The database file.
    public let path: String
    /// The durability of each commit.
    public let sync: SyncMode

    let writer: StoreWriter
    private let reader: StoreLock<StoreReader>
    private let lifecycle: StoreLock<Lifecycle>

    private struct Lifecycle {
        var closed = false
        var lockFD: Int32
    }

    /// Opens (creating if needed) `<directory>/opqd.sqlite`. The directory is created if it
    /// is missing. Throws when the store cannot be used as it is: see `StoreError`.
    public init(directory: String, sync: SyncMode = .full) throws(StoreError) {
        var dir = directory
        while dir.count > 1 && dir.hasSuffix("/") { dir.removeLast() }
        self.directory = dir
        self.path = (dir.isEmpty ? "." : dir) + "/opqd.sqlite"
        self.sync = sync
        let path = self.path

        try Self.makeDirectory(dir.isEmpty ? "." : dir)
        let fd = try Self.lockStore(directory: dir.isEmpty ? "." : dir, path: path)
        // On a throw, the connections opened so far close as their owners are released.
        do throws(StoreError) {
            if access(path, F_OK) == 0 && access(path, R_OK | W_OK) != 0 {
                throw StoreError(.cannotOpen, path: path, detail: Self.errnoText())
            }
            let conn: SQLiteConnection
            do { conn = try SQLiteConnection(path: path, create: true) } catch { throw Self.storeError(error, path, default: .cannotOpen) }
            if conn.isReadOnly { throw StoreError(.readOnly, path: path, detail: "SQLite opened it read-only") }
            try Self.prepareSchema(conn, path: path, sync: sync)
            let lastSeq: UInt64
            do { lastSeq = UInt64(bitPattern: try conn.integer(Schema.lastSeq)) } catch { throw Self.storeError(error, path, default: .io) }
            guard lastSeq <= RecordLimits.maxCounter else {
                throw StoreError(.corrupt, path: path, detail: "the last event seq \(lastSeq) is out of range")
            }
            do {
                writer = try StoreWriter(connection: conn, path: path, lastSeq: lastSeq)
                reader = StoreLock(try StoreReader(path: path))
            } catch { throw Self.storeError(error, path, default: .io) }
        } catch {
            closeDescriptor(fd)
            throw error
        }
        lifecycle = StoreLock(Lifecycle(lockFD: fd))
        writer.start()
    }

    deinit { close() }

    // MARK: - OperationStore

    /// Always true: the engine must build records for this store.
    public var wantsRecords: Bool { true }

    /// Queues `records` for the writer thread and returns at once. After `close` they are
    /// dropped (and their tickets never become durable).
    public func append(_ records: [StoreRecord], upTo ticket: UInt64) {
        writer.appends.add(1, ordering: .relaxed)
        writer.submit(.records(records, ticket: ticket))
    }

    /// Calls `done` once everything appended up to `ticket` is committed: at once (on the
    /// caller's thread) if it already is, else on the writer thread right after the commit.
    /// Never called for a ticket that was not committed before `close`.
    public func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) {
        writer.whenDurable(ticket, done)
    }

    /// The highest ticket committed so far.
    public var durableTicket: UInt64 { writer.committedTicket.load(ordering: .acquiring) }

    // MARK: - reading back

    /// Everything needed to rebuild the engine at start: queues (with counts computed from
    /// their operations), all kept operations and the newest event seq ever written (deleting
    /// events never moves it back). Call it before appending.
    public func load() throws(StoreError) -> RecoveredState {
        let path = self.path
        let lastSeq = writer.lastSeq.load(ordering: .relaxed)
        return try reader.withLock { r throws(StoreError) in
            do { return try r.load(lastSeq: lastSeq) } catch let e as DecodeFailure {
                throw StoreError(.corrupt, path: path, detail: e.detail)
            } catch let e as SQLiteFailure {
                throw Self.storeError(e, path, default: .io)
            } catch {
                throw StoreError(.io, path: path, detail: "\(error)")
            }
        }
    }

    /// The newest `limit` events, oldest first: refills the in-memory change feed at start.
    public func recentEvents(limit: Int) -> [ChangeEvent] {
        guard limit > 0 else { return [] }
        return (try? reader.withLock { r throws(SQLiteFailure) in try r.recentEvents(limit: limit) }) ?? []
    }

    /// Kept events of one operation with seq > `after`, oldest first, at most `limit`.
    public func events(of id: OperationID, after: UInt64 = 0, limit: Int = .max) -> [ChangeEvent] {
        (try? reader.withLock { r throws(SQLiteFailure) in try r.events(of: id, after: after, limit: limit) }) ?? []
    }

    /// The seq of the oldest kept event; one past the newest when none is kept. Clients that
    /// resume a feed from before it have missed events.
    public var oldestEventSeq: UInt64 {
        let next = writer.lastSeq.load(ordering: .relaxed) + 1
        return (try? reader.withLock { r throws(SQLiteFailure) in try r.oldestSeq() }) ?? next
    }

    // MARK: - meta: small durable settings of the layers above

    /// Sets (nil: deletes) `meta` rows in the next group commit; `done` runs once committed,
    /// never if the store is closing (then the result is false).
    @discardableResult
    public func setMeta(_ pairs: [(key: String, value: String?)], then done: (@Sendable () -> Void)? = nil) -> Bool {
        writer.submit(.meta(pairs, done: done))
    }

    /// Deletes every `meta` row whose key starts with `prefix`, in the next group commit.
    @discardableResult
    public func deleteMeta(prefix: String, then done: (@Sendable () -> Void)? = nil) -> Bool {
        writer.submit(.deleteMetaPrefix(prefix, done: done))
    }

    /// The `meta` rows whose key starts with `prefix`, ordered by key (text values only).
    public func meta(prefix: String) -> [(key: String, value: String)] {
        (try? reader.withLock { r throws(SQLiteFailure) in try r.meta(prefix: prefix) }) ?? []
    }

    // MARK: - idempotency

    /// Saves the first answer to an `Idempotency-Key` request in the next group commit;
    /// `done` is called once it is durable (send the answer then).
    public func saveIdempotency(scope: String, bodyHash: String, status: Int, headers: [(String, String)], body: [UInt8],
                                then done: @escaping @Sendable () -> Void) {
        let r = IdempotencyRecord(scope: scope, bodyHash: bodyHash, status: status, headers: headers, body: body, createdAt: SystemClock().now())
        writer.submit(.idempotency(r, done: done))
    }

    /// Saves the first answer to an `Idempotency-Key` request in the next group commit,
    /// without waiting for it.
    public func saveIdempotency(scope: String, bodyHash: String, status: Int, headers: [(String, String)], body: [UInt8]) {
        let r = IdempotencyRecord(scope: scope, bodyHash: bodyHash, status: status, headers: headers, body: body, createdAt: SystemClock().now())
        writer.submit(.idempotency(r, done: nil))
    }

    /// Saves a record as given (its `createdAt` included).
    public func saveIdempotency(_ record: IdempotencyRecord, then done: (@Sendable () -> Void)? = nil) {
        writer.submit(.idempotency(record, done: done))
    }

    /// Every saved answer, oldest first, for the API's cache at start. Unreadable rows are skipped.
    public func loadIdempotency() -> [IdempotencyRecord] {
        (try? reader.withLock { r throws(SQLiteFailure) in try r.idempotency() }) ?? []
    }

    /// Deletes answers saved before `cutoff`, through the writer. Returns how many.
    @discardableResult
    public func purgeIdempotency(before cutoff: Timestamp) -> Int {
        guard !writer.isWriterThread else { return 0 }
        let reply = Reply()
        guard writer.submit(.purgeIdempotency(before: cutoff, reply: reply)) else { return 0 }
        return reply.wait()
    }

    // MARK: - retention

    /// Deletes up to `limit` operations that finished before `cutoff`, with their events,
    /// oldest first. It runs on the writer thread in chunks of at most 500 operations, each
    /// part of a group commit, so creates keep flowing meanwhile. Blocks until done; returns
    /// how many were deleted. Returns 0 when called from a durability callback (the writer
    /// thread cannot wait for itself) or after `close`.
    @discardableResult
    public func purge(finishedBefore cutoff: Timestamp, limit: Int) -> Int {
        guard !writer.isWriterThread else { return 0 }
        var total = 0
        while total < limit {
            let chunk = min(500, limit - total)
            let reply = Reply()
            guard writer.submit(.purge(cutoff: cutoff, limit: chunk, reply: reply)) else { break }
            let n = reply.wait()
            total += n
            if n < chunk { break }
        }
        return total
    }

    // MARK: - health

    /// Writer counters: commits, records, how much each commit batched.
    public var stats: StoreStats {
        StoreStats(commits: writer.commits.load(ordering: .relaxed), records: writer.recordsCommitted.load(ordering: .relaxed),
                   appends: writer.appends.load(ordering: .relaxed), largestCommit: writer.largestCommit.load(ordering: .relaxed),
                   failures: writer.failures.load(ordering: .relaxed),
                   busySeconds: Double(writer.busyNanos.load(ordering: .relaxed)) / 1e9,
                   cpuSeconds: Double(writer.cpuNanos.load(ordering: .relaxed)) / 1e9)
    }

    /// The error of the last commit if it failed (the writer keeps retrying it); nil when healthy.
    public var lastError: StoreError? { writer.lastError.withLock { $0 } }

    /// Commits everything queued, checkpoints the WAL into the database file, closes the
    /// connections and releases the directory. Idempotent; a second caller waits for the first.
    public func close() {
        lifecycle.withLock { l in
            guard !l.closed else { return }
            l.closed = true
            reader.withLock { $0.close() }
            writer.stopAndFinish()
            closeDescriptor(l.lockFD)
        }
    }

    // MARK: - opening

    private static func errnoText(_ code: Int32 = errno) -> String { String(cString: strerror(code)) }

    static func storeError(_ f: SQLiteFailure, _ path: String, default reason: StoreError.Reason) -> StoreError {
        let r: StoreError.Reason
        if f.isNotADatabase { r = .notADatabase }
        else if f.isCorrupt { r = .corrupt }
        else if f.isCantOpen { r = .cannotOpen }
        else if f.isReadOnly { r = .readOnly }
        else if f.isBusy { r = .inUse }
        else { r = reason }
        return StoreError(r, path: path, detail: f.description)
    }

    /// `mkdir -p`, then checks the result is a directory.
    private static func makeDirectory(_ dir: String) throws(StoreError) {
        var st = stat()
        if stat(dir, &st) == 0 {
            if (st.st_mode & S_IFMT) != S_IFDIR { throw StoreError(.notADirectory, path: dir, detail: "not a directory") }
            return
        }
        var prefix = dir.hasPrefix("/") ? "/" : ""
        for part in dir.split(separator: "/") {
            prefix += part
            if mkdir(prefix, 0o755) != 0 && errno != EEXIST {
                throw StoreError(.cannotCreateDirectory, path: dir, detail: "\(prefix): \(errnoText())")
            }
            prefix += "/"
        }
        if stat(dir, &st) != 0 { throw StoreError(.cannotCreateDirectory, path: dir, detail: errnoText()) }
        if (st.st_mode & S_IFMT) != S_IFDIR { throw StoreError(.notADirectory, path: dir, detail: "not a directory") }
    }

    /// Takes `<dir>/opqd.lock` with `flock`, so two servers never write one store. (SQLite's
    /// own locks would let them take turns and interleave two engines' histories.)
    private static func lockStore(directory: String, path: String) throws(StoreError) -> Int32 {
        let lockPath = directory + "/opqd.lock"
        let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        if fd < 0 { throw StoreError(.cannotOpen, path: lockPath, detail: errnoText()) }
        // A forked child that has not reached exec yet shares the lock's open file (CLOEXEC
        // acts only at exec), so a lock held for a moment is retried for half a second before
        // the store is declared in use; another live opqd holds it far longer than that.
        var attempts = 0
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let e = errno
            if e == EINTR { continue }
            if e == EWOULDBLOCK && attempts < 20 {
                attempts += 1
                usleep(25_000)
                continue
            }
            closeDescriptor(fd)
            if e == EWOULDBLOCK { throw StoreError(.inUse, path: path, detail: "\(lockPath) is locked") }
            throw StoreError(.cannotOpen, path: lockPath, detail: errnoText(e))
        }
        return fd
    }

    /// Validates the file, creates or migrates the schema and sets the connection's pragmas.
    private static func prepareSchema(_ conn: SQLiteConnection, path: String, sync: SyncMode) throws(StoreError) {
        do {
            // The first read of the header: a file that is not a database fails here.
            let appID = try conn.integer("PRAGMA application_id")
            let version = Int(try conn.integer("PRAGMA user_version"))
            let mode = try conn.text("PRAGMA journal_mode = WAL")
            guard mode?.lowercased() == "wal" else {
                throw StoreError(.io, path: path, detail: "could not switch to WAL journal mode (got \(mode ?? "nothing"))")
            }
            let check = try conn.texts("PRAGMA quick_check")
            guard check == ["ok"] else {
                throw StoreError(.corrupt, path: path, detail: "quick_check: " + check.prefix(3).joined(separator: "; "))
            }
            if appID != Schema.applicationID {
                let objects = try conn.integer("SELECT count(*) FROM sqlite_schema")
                if appID != 0 || version != 0 || objects != 0 {
                    throw StoreError(.foreignDatabase, path: path, detail: "application_id \(appID), user_version \(version), \(objects) schema objects")
                }
            }
            if version < 0 {
                throw StoreError(.corrupt, path: path, detail: "negative user_version \(version)")
            }
            if version > Schema.version {
                throw StoreError(.newerSchema(found: version, supported: Schema.version), path: path, detail: "user_version \(version)")
            }
            for v in version..<Schema.version {
                try conn.execute("BEGIN IMMEDIATE")
                do throws(SQLiteFailure) {
                    try conn.execute(Schema.migrations[v])
                    try conn.execute("PRAGMA user_version = \(v + 1); PRAGMA application_id = \(Schema.applicationID)")
                    try conn.execute("COMMIT")
                } catch {
                    try? conn.execute("ROLLBACK")
                    throw error
                }
            }
            // Debian builds SQLite with SECURE_DELETE, which zeroes every freed cell: extra
            // writes on each upsert of an existing row, for no benefit here.
            try conn.execute("""
                PRAGMA synchronous = \(sync == .full ? "FULL" : "NORMAL");
                PRAGMA cache_size = -32768;
                PRAGMA temp_store = MEMORY;
                PRAGMA secure_delete = OFF;
                PRAGMA journal_size_limit = 67108864;
                PRAGMA wal_autocheckpoint = 4000;
                """)
            conn.setBusyTimeout(milliseconds: 5000)
        } catch let e as StoreError {
            throw e
        } catch let e as SQLiteFailure {
            throw storeError(e, path, default: .io)
        } catch {
            throw StoreError(.io, path: path, detail: "\(error)")
        }
    }
}

/// `close(2)`, out of reach of `SQLiteStore.close()`'s name.
private func closeDescriptor(_ fd: Int32) { _ = close(fd) }

/// The read connection and its statements; lives under `SQLiteStore.reader`'s lock.
final class StoreReader {
    private let connection: SQLiteConnection
    private let recent, byOperation, minSeq: SQLiteStatement
    private var closed = false

    init(path: String) throws(SQLiteFailure) {
        connection = try SQLiteConnection(path: path, create: false)
        connection.setBusyTimeout(milliseconds: 5000)
        try connection.execute("PRAGMA query_only = 1; PRAGMA cache_size = -8192")
        recent = try connection.prepare("SELECT \(Schema.eventColumns) FROM events ORDER BY seq DESC LIMIT ?1")
        byOperation = try connection.prepare("SELECT \(Schema.eventColumns) FROM events WHERE operation = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3")
        minSeq = try connection.prepare("SELECT min(seq) FROM events WHERE seq > 0")
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

    /// One read transaction, so queues, operations and the seq are one consistent snapshot.
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
        let stored = UInt64(bitPattern: try connection.integer(Schema.lastSeq))
        guard stored <= RecordLimits.maxCounter else { throw DecodeFailure(detail: "the last event seq \(stored) is out of range") }
        return RecoveredState(queues: queues, operations: operations, lastSeq: max(stored, known))
    }
}
