import QueueEngine

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// Opening the store: the directory, its lock, and the schema checks that keep opqd from
// starting empty over existing data.
extension SQLiteStore {
    static func errnoText(_ code: Int32 = errno) -> String { String(cString: strerror(code)) }

    static func storeError(_ f: SQLiteFailure, _ path: String, default reason: StoreError.Reason) -> StoreError {
        let r: StoreError.Reason
        if f.isNotADatabase {
            r = .notADatabase
        } else if f.isCorrupt {
            r = .corrupt
        } else if f.isCantOpen {
            r = .cannotOpen
        } else if f.isReadOnly {
            r = .readOnly
        } else if f.isBusy {
            r = .inUse
        } else {
            r = reason
        }
        return StoreError(r, path: path, detail: f.description)
    }

    /// `mkdir -p`, then checks the result is a directory.
    static func makeDirectory(_ dir: String) throws(StoreError) {
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
    static func lockStore(directory: String, path: String) throws(StoreError) -> Int32 {
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
    static func prepareSchema(_ conn: SQLiteConnection, path: String, sync: SyncMode) throws(StoreError) {
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
            try conn.execute(
                """
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
func closeDescriptor(_ fd: Int32) { _ = close(fd) }
