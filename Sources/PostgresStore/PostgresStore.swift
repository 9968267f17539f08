import Locking
import QueueEngine
import StoreKit

#if canImport(Glibc)
import Glibc
#endif

/// The durable store on PostgreSQL (`--store postgres://user:pass@host:port/db`), with the
/// SQLite store's contract and durability. A cluster owner opens it with a `PGFence` (its
/// commits fenced by the ownership epoch, see CLUSTER.md and `PGMembership`); without one it
/// serves one opqd alone, kept so by a session advisory lock.
///
/// It talks to libpq directly (`Bridge/`, the only code that calls `PQ*`), PostgreSQL's own
/// client library, synchronous, which fits a store whose writes are one dedicated thread doing
/// group commit: no event loop to bridge to.
///
/// Writes: `append` hands records to the writer thread and returns at once; the writer commits
/// everything queued in one transaction and only then calls the `whenDurable` callbacks (see
/// `PGWriter`). Reads (`load`, `events(of:)`, ...) use a second connection.
///
/// Opening never starts over data it cannot use: an unreachable server, a database another opqd
/// holds, a schema from a newer opqd, or rows that do not read back make `init` or `load` throw
/// a `PostgresStoreError` that names the database and what to do.
public final class PostgresStore: OperationStore {
    /// The URL with its password replaced by `***`, for logs and errors.
    public let displayURL: String

    let writer: PGWriter
    let reader: Lock<PGReader>
    /// `events(after:)`'s own bounded connection: the owner's feed reads back on the writer's
    /// thread, which must not wait behind history pages or webhook catch-ups on `reader`, or
    /// for minutes on a dead link.
    let feedReader: Lock<PGReader>
    /// Batches across instances (`PostgresStore+Batches`): their decisions and parts, on a
    /// bounded connection of their own.
    let batchConnection: Lock<PGReader>
    private let closed = Lock(false)

    /// Connects, takes the database's instance lock, creates or migrates the schema and starts
    /// the writer. Throws when the store cannot be used as it is: see `PostgresStoreError`.
    /// With a `fence` (a cluster owner), no advisory lock is taken: every commit is fenced by the
    /// ownership epoch instead (see `PGWriter`), and `onFenced` is called once when a commit is
    /// refused because another instance took the queues.
    public init(
        url: String, connectTimeoutSeconds: Int = 5, fence: PGFence? = nil, onFenced: @escaping @Sendable () -> Void = {}
    ) throws(PostgresStoreError) {
        let shown = Self.redact(url)
        displayURL = shown
        let conn: PGConnection
        do { conn = try PGConnection(url: url, connectTimeoutSeconds: connectTimeoutSeconds) } catch {
            throw PostgresStoreError(.cannotConnect, url: shown, detail: error.description)
        }
        do {
            var locked = fence != nil
            // A store closed a moment ago: the server ends its session (and the lock) on its own
            // time, so a restart in the same process waits up to 2 s for it.
            for attempt in 0..<40 where !locked {
                if attempt > 0 { usleep(50_000) }
                locked = try conn.exec("SELECT pg_try_advisory_lock($1::bigint)", [PGParameter(PGSchema.instanceLock)]).bool(0, 0) == true
            }
            guard locked else {
                throw PostgresStoreError(.inUse, url: shown, detail: "its instance lock is held")
            }
        } catch let e as PostgresStoreError {
            throw e
        } catch {
            throw PostgresStoreError(.io, url: shown, detail: "taking the instance lock: \(error)")
        }
        try Self.migrate(conn, url: shown)
        do {
            try PGWriter.prepareSession(conn)
            try conn.exec(PGSchema.deleteOldMarks)
            try conn.exec("BEGIN")
            try conn.exec(PGSchema.lockEvents)
            try conn.exec(PGSchema.settleEventSeq)
            try conn.exec("COMMIT")
            if let fence { try PGWriter.prepareFencedSession(conn, leaseSeconds: fence.leaseSeconds) }
        } catch {
            throw PostgresStoreError(.io, url: shown, detail: "setting up the session: \(error)")
        }
        let lastSeq: UInt64
        do {
            lastSeq = try PGReader.lastSeq(try conn.exec(PGSchema.lastSeq))
        } catch let e as DecodeFailure {
            throw PostgresStoreError(.corrupt, url: shown, detail: e.detail)
        } catch {
            throw PostgresStoreError(.io, url: shown, detail: "\(error)")
        }
        let readConnection: PGConnection
        do {
            readConnection = try PGConnection(url: url, connectTimeoutSeconds: connectTimeoutSeconds)
            writer = try PGWriter(connection: conn, url: url, displayURL: shown, lastSeq: lastSeq, fence: fence, onFenced: onFenced)
        } catch {
            throw PostgresStoreError(.cannotConnect, url: shown, detail: error.description)
        }
        reader = Lock(PGReader(url: url, connection: readConnection))
        feedReader = Lock(PGReader(url: url, connection: nil, bounded: true))
        batchConnection = Lock(PGReader(url: url, connection: nil, bounded: true))
        guard writer.start() else {
            throw PostgresStoreError(.io, url: shown, detail: "cannot start the writer thread")
        }
    }

    deinit { close() }

    /// Brings the schema to `PGSchema.version` in one transaction, or refuses a newer one.
    static func migrate(_ conn: PGConnection, url: String) throws(PostgresStoreError) {
        do {
            // A standby (or a read-only default) would refuse every commit, forever: say so now.
            let readOnly = try conn.exec("SELECT pg_is_in_recovery() OR current_setting('default_transaction_read_only') = 'on'")
            if readOnly.bool(0, 0) != false {
                throw PostgresStoreError(
                    .io, url: url, detail: "the server is read-only (a standby, or default_transaction_read_only is on); point --store at the primary")
            }
            try conn.exec("BEGIN")
            do {
                // Instances starting together migrate one after the other. The same key is the
                // session lock of an opqd that serves the database alone (a store without a
                // fence, or an older opqd): waiting behind it would be forever, so give up after
                // 10 s and say who holds it.
                var locked = false
                for _ in 0..<200 where !locked {
                    locked = try conn.exec("SELECT pg_try_advisory_xact_lock($1::bigint)", [PGParameter(PGSchema.instanceLock)]).bool(0, 0) == true
                    if !locked { usleep(50_000) }
                }
                if !locked { throw PostgresStoreError(.inUse, url: url, detail: "its instance lock is held") }
                // Only when missing: CREATE … IF NOT EXISTS would still need the CREATE privilege
                // on the database, which a user that only owns the schema may not have.
                if try conn.exec("SELECT to_regclass('opqd.schema_version') IS NULL").bool(0, 0) == true {
                    // One statement at a time: fixed text, but exec takes one statement.
                    for statement in PGSchema.bootstrap.split(separator: ";") where !statement.trimmingCharacters().isEmpty {
                        try conn.exec(String(statement))
                    }
                }
                let rows = try conn.exec("SELECT version FROM opqd.schema_version")
                var version = 0
                if rows.rows > 1 {
                    throw PostgresStoreError(.foreignSchema, url: url, detail: "opqd.schema_version has \(rows.rows) rows")
                } else if rows.rows == 1 {
                    guard let v = rows.int64(0, 0), let n = Int(exactly: v), n >= 0 else {
                        throw PostgresStoreError(.foreignSchema, url: url, detail: "opqd.schema_version holds \(rows.text(0, 0) ?? "NULL")")
                    }
                    version = n
                } else {
                    let tables = try conn.exec(
                        "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'opqd' AND tablename <> 'schema_version'")
                    if let n = tables.int64(0, 0), n != 0 {
                        throw PostgresStoreError(.foreignSchema, url: url, detail: "\(n) tables but no schema version")
                    }
                }
                if version > PGSchema.version {
                    throw PostgresStoreError(.newerSchema(found: version, supported: PGSchema.version), url: url, detail: "")
                }
                if version < PGSchema.version {
                    for v in version..<PGSchema.version {
                        if PGSchema.scriptMigrations.contains(v) {
                            try conn.runScript(PGSchema.migrations[v])
                            continue
                        }
                        for statement in PGSchema.migrations[v].split(separator: ";") where !statement.trimmingCharacters().isEmpty {
                            try conn.exec(String(statement))
                        }
                    }
                    try conn.exec("DELETE FROM opqd.schema_version")
                    try conn.exec("INSERT INTO opqd.schema_version (version) VALUES ($1::integer)", [PGParameter(PGSchema.version)])
                }
                try conn.exec("COMMIT")
            } catch {
                _ = try? conn.exec("ROLLBACK")
                throw error
            }
        } catch let e as PostgresStoreError {
            throw e
        } catch {
            throw PostgresStoreError(.io, url: url, detail: "creating or migrating the schema: \(error)")
        }
    }

    /// `scheme://user:***@host...`: the password of a URL (and a `password=` query parameter)
    /// hidden; anything else unchanged.
    public static func redact(_ url: String) -> String {
        var s = url
        if let scheme = s.firstRange(of: "://") {
            let rest = s[scheme.upperBound...]
            let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
            let authority = rest[..<authorityEnd]
            if let at = authority.lastIndex(of: "@"), let colon = authority[..<at].firstIndex(of: ":") {
                s.replaceSubrange(s.index(after: colon)..<at, with: "***")
            }
        }
        var parts = s.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
        if parts.count == 2 {
            parts[1] = parts[1].split(separator: "&", omittingEmptySubsequences: false).map { p in
                p.lowercased().hasPrefix("password=") ? "password=***" : String(p)
            }.joined(separator: "&")
            s = parts.joined(separator: "?")
        }
        return s
    }

    // MARK: - OperationStore

    public var wantsRecords: Bool { true }

    /// Queues `records` for the writer thread and returns at once. After `close` they are dropped.
    public func append(_ records: [StoreRecord], upTo ticket: UInt64) {
        writer.counters.appends.add(1, ordering: .relaxed)
        writer.submit(.records(records, ticket: ticket))
    }

    /// Calls `done` once everything appended up to `ticket` is committed.
    public func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) {
        writer.whenDurable(ticket, done)
    }

    /// `tell` is called after each commit that had events (in the writer's aftermath: on the
    /// writer thread when idle, else on its own queue), before the callbacks of
    /// `whenDurable` for it run: with the committed events, numbered as PostgreSQL numbered
    /// them (their `seq` is the global one, not the engine's), or with nil when they are not
    /// known (a commit whose answer was lost: read them back). In order, one call at a
    /// time; it must not block.
    public func onCommittedEvents(_ tell: @escaping @Sendable ([ChangeEvent]?) -> Void) {
        writer.committedEvents.withLock { $0 = tell }
    }

    /// At most one NOTIFY per this many nanoseconds from this store's writer (`PGWriter`); tests
    /// lengthen it.
    package var notifySpacingNanos: Int {
        get { writer.notifySpacing.load(ordering: .relaxed) }
        set { writer.notifySpacing.store(newValue, ordering: .relaxed) }
    }

    /// Whether the writer runs a commit's aftermath itself when nothing waits for it
    /// (`CommitAftermath`); tests turn it off to see the aftermath overtaken on its queue.
    package var aftermathRunsOnIdleWriter: Bool {
        get { writer.aftermath.runsOnIdleWriter.load(ordering: .relaxed) }
        set { writer.aftermath.runsOnIdleWriter.store(newValue, ordering: .relaxed) }
    }

    /// The highest ticket committed so far.
    public var durableTicket: UInt64 { writer.queue.durableTicket }

    /// Commits everything queued (giving up after a few attempts when the server is gone),
    /// closes the connections and so releases the instance lock. Idempotent.
    public func close() {
        let first = closed.withLock { c in
            defer { c = true }
            return !c
        }
        guard first else { return }
        // The writer first: its last commits may read the feed back.
        writer.stopAndFinish()
        reader.withLock { $0.close() }
        feedReader.withLock { $0.close() }
        batchConnection.withLock { $0.close() }
    }

    // MARK: - reading

    /// Everything needed to rebuild the engine at start (as `SQLiteStore.load`).
    public func load() throws(PostgresStoreError) -> RecoveredState {
        let lastSeq = writer.lastSeq.load(ordering: .relaxed)
        return try loading { r in try r.load(lastSeq: lastSeq) }
    }

    /// A load on the reader's connection, its failures as the store's: a row that does not
    /// decode is `corrupt`, a lost connection `cannotConnect`.
    private func loading<T>(_ body: (PGReader) throws -> T) throws(PostgresStoreError) -> T {
        let url = displayURL
        return try reader.withLock { r throws(PostgresStoreError) in
            do { return try body(r) } catch let e as DecodeFailure {
                throw PostgresStoreError(.corrupt, url: url, detail: e.detail)
            } catch let e as PGFailure {
                throw PostgresStoreError(e.connectionLost ? .cannotConnect : .io, url: url, detail: e.description)
            } catch {
                throw PostgresStoreError(.io, url: url, detail: "\(error)")
            }
        }
    }

    /// The queues named, with their operations, and the states of their dependencies outside
    /// them (`RemoteOperations.states`): what a cluster instance adopts (`QueueEngine.adopt`).
    public func load(queues names: [String]) throws(PostgresStoreError) -> (RecoveredState, RemoteStates) {
        try loading { r in try r.load(queues: names) }
    }

    /// Every queue's name.
    public func queueNames() throws(PostgresStoreError) -> [String] {
        let url = displayURL
        return try reader.withLock { r throws(PostgresStoreError) in
            do throws(PGFailure) {
                let res = try r.withConnection { c throws(PGFailure) in try c.exec("SELECT name FROM opqd.queues ORDER BY name") }
                return (0..<res.rows).compactMap { res.text($0, 0) }
            } catch {
                throw PostgresStoreError(error.connectionLost ? .cannotConnect : .io, url: url, detail: error.description)
            }
        }
    }

    /// The queue of operation `id` (nil: no such operation).
    public func queue(of id: OperationID) throws(PostgresStoreError) -> String? {
        let url = displayURL
        return try feedReader.withLock { r throws(PostgresStoreError) in
            do throws(PGFailure) { return try r.queue(of: id) } catch {
                throw PostgresStoreError(error.connectionLost ? .cannotConnect : .io, url: url, detail: error.description)
            }
        }
    }

    /// The queue of each of `ids` that names an operation (one read).
    public func queues(of ids: [OperationID]) throws(PostgresStoreError) -> [OperationID: String] {
        guard !ids.isEmpty else { return [:] }
        let url = displayURL
        return try feedReader.withLock { r throws(PostgresStoreError) in
            do throws(PGFailure) { return try r.queues(of: ids) } catch {
                throw PostgresStoreError(error.connectionLost ? .cannotConnect : .io, url: url, detail: error.description)
            }
        }
    }

    /// The committed row of operation `id` (nil: none).
    public func operation(_ id: OperationID) throws(PostgresStoreError) -> OperationSnapshot? {
        try loading { r in try r.operation(id) }
    }

    /// Whether `target` is reachable from `ids` along the committed dependencies of unfinished
    /// operations, in every queue.
    /// (On the loading connection, not the feed's: a long walk does not hold the feed up.)
    public func reaches(_ target: OperationID, from ids: [OperationID]) throws(PostgresStoreError) -> Bool {
        try loading { r in try r.reaches(target, from: ids) }
    }

    /// Whether each of `ids` exists and is finished, and which a cascade cancelled; ids of no
    /// operation are left out.
    public func operationStates(_ ids: [OperationID]) throws(PostgresStoreError) -> RemoteStates {
        guard !ids.isEmpty else { return RemoteStates() }
        let url = displayURL
        return try feedReader.withLock { r throws(PostgresStoreError) in
            do throws(PGFailure) { return try r.operationStates(ids) } catch {
                throw PostgresStoreError(error.connectionLost ? .cannotConnect : .io, url: url, detail: error.description)
            }
        }
    }

    /// The newest `limit` events, oldest first.
    public func recentEvents(limit: Int) -> [ChangeEvent] {
        guard limit > 0 else { return [] }
        return (try? reader.withLock { r throws(PGFailure) in try r.recentEvents(limit: limit) }) ?? []
    }

    /// Kept events of one operation with seq > `after`, oldest first, at most `limit`.
    public func events(of id: OperationID, after: UInt64 = 0, limit: Int = .max) -> [ChangeEvent] {
        history(of: id, after: after, limit: limit) ?? []
    }

    /// Kept events with seq > `after`, in seq order, at most `limit`; throws when the read
    /// failed. Every commit's events become visible in seq order (see `PGSchema.lockEvents`), so
    /// reading on from the newest one read never skips one.
    public func events(after seq: UInt64, limit: Int) throws -> [ChangeEvent] {
        try feedReader.withLock { r throws(PGFailure) in try r.events(after: seq, limit: limit) }
    }

    /// As `events(of:)`, but nil when the read failed (not an empty history).
    public func history(of id: OperationID, after: UInt64, limit: Int) -> [ChangeEvent]? {
        try? reader.withLock { r throws(PGFailure) in try r.events(of: id, after: after, limit: limit) }
    }

    /// Kept events of one queue, or of one operation, with `after` < seq <= `through`; nil when
    /// the read failed.
    public func eventWindow(queue: String?, operation: OperationID?, after: UInt64, through: UInt64, limit: Int) -> EventWindow? {
        guard through > after, limit > 0 else { return EventWindow(events: [], rows: 0, lastSeq: after) }
        return try? reader.withLock { r throws(PGFailure) in
            try r.eventWindow(queue: queue, operation: operation, after: after, through: through, limit: limit)
        }
    }

    /// The seq of the oldest kept event; one past the newest when none is kept.
    public var oldestEventSeq: UInt64 {
        let next = writer.lastSeq.load(ordering: .relaxed) &+ 1
        return (try? reader.withLock { r throws(PGFailure) in try r.oldestSeq() }) ?? next
    }

    // MARK: - meta, idempotency, retention

    /// Sets (nil: deletes) `meta` rows in the next group commit; false when closing.
    @discardableResult
    public func setMeta(_ pairs: [(key: String, value: String?)], then done: (@Sendable () -> Void)? = nil) -> Bool {
        writer.submit(.meta(pairs, done: done))
    }

    /// Deletes every `meta` row whose key starts with `prefix`, in the next group commit.
    @discardableResult
    public func deleteMeta(prefix: String, then done: (@Sendable () -> Void)? = nil) -> Bool {
        writer.submit(.deleteMetaPrefix(prefix, done: done))
    }

    /// `meta(prefix:)`, or why it cannot be read.
    public func readMeta(prefix: String) throws(PostgresStoreError) -> [(key: String, value: String)] {
        try loading { r in try r.meta(prefix: prefix) }
    }

    /// The `meta` rows whose key starts with `prefix`, ordered by key.
    public func meta(prefix: String) -> [(key: String, value: String)] {
        (try? reader.withLock { r throws(PGFailure) in try r.meta(prefix: prefix) }) ?? []
    }

    /// Every saved answer, oldest first. Unreadable rows are skipped.
    public func loadIdempotency() -> [IdempotencyRecord] {
        (try? reader.withLock { r throws(PGFailure) in try r.idempotency() }) ?? []
    }

    /// The answers kept with changes to the queues of `partitions` (`QueuePartitions`), and
    /// those kept with none: what an instance taking these partitions needs.
    public func loadIdempotency(partitions: [Int]) -> [IdempotencyRecord] {
        (try? reader.withLock { r throws(PGFailure) in try r.idempotency(partitions: partitions) }) ?? []
    }

    /// Deletes answers saved before `cutoff`, through the writer. Returns how many.
    @discardableResult
    public func purgeIdempotency(before cutoff: Timestamp) -> Int {
        guard !writer.isWriterThread else { return 0 }
        return writer.queue.purgeIdempotency(before: cutoff)
    }

    /// Deletes up to `limit` operations that finished before `cutoff`, with their events,
    /// in chunks of at most 500 per group commit. Blocks until done; returns how many.
    @discardableResult
    public func purge(finishedBefore cutoff: Timestamp, limit: Int) -> Int {
        guard !writer.isWriterThread else { return 0 }
        return writer.queue.purge(finishedBefore: cutoff, limit: limit)
    }

    // MARK: - health

    /// Writer counters, as the SQLite store's.
    public var stats: StoreStats {
        writer.counters.stats
    }

    /// Why the last commit (or the idle connection check) failed, while the writer retries;
    /// nil when healthy.
    public var lastError: PostgresStoreError? { writer.lastError.withLock { $0 } }

    /// `lastError` in a few words, without the URL or the server's message: for answers to
    /// anyone (readiness is open to unauthenticated clients); nil when healthy.
    public var unavailableReason: String? {
        guard let e = lastError else { return nil }
        switch e.reason {
        case .cannotConnect: return "the PostgreSQL store is unreachable; reconnecting"
        default: return "the PostgreSQL store refused a commit; retrying"
        }
    }
}
