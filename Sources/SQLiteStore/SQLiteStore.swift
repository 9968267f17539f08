import QueueEngine
import StoreKit
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
    let reader: StoreLock<StoreReader>
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
        writer.counters.appends.add(1, ordering: .relaxed)
        writer.submit(.records(records, ticket: ticket))
    }

    /// Calls `done` once everything appended up to `ticket` is committed: at once (on the
    /// caller's thread) if it already is, else on the writer thread right after the commit.
    /// Never called for a ticket that was not committed before `close`.
    public func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) {
        writer.whenDurable(ticket, done)
    }

    /// The highest ticket committed so far.
    public var durableTicket: UInt64 { writer.queue.durableTicket }

    // MARK: - closing

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
}
