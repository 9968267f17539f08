// The only file that calls sqlite3_*: everything above it sees Swift types.
internal import CSQLite

/// A failed libsqlite3 call: its (extended) result code and message. Never leaves the module;
/// `SQLiteStore` turns it into a `StoreError` naming the file.
struct SQLiteFailure: Error, Sendable, CustomStringConvertible {
    let code: Int32
    let message: String
    var description: String { "\(message) (SQLite code \(code))" }

    /// The primary result code (`SQLITE_NOTADB`, `SQLITE_CORRUPT`, ...) without the extended bits.
    var primary: Int32 { code & 0xFF }
    var isNotADatabase: Bool { primary == SQLITE_NOTADB }
    var isCorrupt: Bool { primary == SQLITE_CORRUPT }
    var isCantOpen: Bool { primary == SQLITE_CANTOPEN || primary == SQLITE_PERM || primary == SQLITE_AUTH }
    var isReadOnly: Bool { primary == SQLITE_READONLY }
    var isConstraint: Bool { primary == SQLITE_CONSTRAINT }
    var isBusy: Bool { primary == SQLITE_BUSY || primary == SQLITE_LOCKED }
}

/// One libsqlite3 connection, opened in multi-thread mode (`SQLITE_OPEN_NOMUTEX`): SQLite
/// takes no lock of its own, so a connection and its statements must be used by one thread
/// at a time. `SQLiteStore` guarantees that: the writer connection belongs to the writer
/// thread, the reader connection lives under a lock.
final class SQLiteConnection {
    private var handle: OpaquePointer?
    private var statements: [SQLiteStatement] = []

    /// Opens the file for reading and writing; with `create`, creates it when it is missing.
    init(path: String, create: Bool) throws(SQLiteFailure) {
        var db: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close_v2(db)
            throw SQLiteFailure(code: rc, message: message)
        }
        sqlite3_extended_result_codes(db, 1)
        handle = db
    }

    deinit { close() }

    /// The message of the most recent failure on this connection.
    private var lastMessage: String { handle.map { String(cString: sqlite3_errmsg($0)) } ?? "connection closed" }

    private func failure(_ rc: Int32) -> SQLiteFailure { SQLiteFailure(code: rc, message: lastMessage) }

    /// True when SQLite could open the file only for reading (file or directory write-protected).
    var isReadOnly: Bool { sqlite3_db_readonly(handle, "main") == 1 }

    /// Rows changed by the last INSERT, UPDATE or DELETE.
    var changes: Int { Int(sqlite3_changes(handle)) }

    /// Waits up to `milliseconds` for another connection's lock instead of failing with SQLITE_BUSY.
    func setBusyTimeout(milliseconds: Int32) { sqlite3_busy_timeout(handle, milliseconds) }

    /// Runs one or more statements that return no rows we need.
    func execute(_ sql: String) throws(SQLiteFailure) {
        var error: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(handle, sql, nil, nil, &error)
        if rc != SQLITE_OK {
            let message = error.map { String(cString: $0) } ?? lastMessage
            sqlite3_free(error)
            throw SQLiteFailure(code: rc, message: message)
        }
    }

    /// Compiles a statement kept for the connection's lifetime (`SQLITE_PREPARE_PERSISTENT`
    /// tells SQLite to allocate it outside its short-lived lookaside memory).
    func prepare(_ sql: String) throws(SQLiteFailure) -> SQLiteStatement {
        var stmt: OpaquePointer?
        let rc = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &stmt, nil)
        guard rc == SQLITE_OK, let stmt else { throw failure(rc) }
        let s = SQLiteStatement(stmt, connection: self)
        statements.append(s)
        return s
    }

    /// The first column of the first row of `sql` as text (PRAGMAs), or nil without a row.
    func text(_ sql: String) throws(SQLiteFailure) -> String? {
        let s = try prepare(sql)
        defer { s.finalize() }
        return try s.step() ? s.text(0) : nil
    }

    /// Every row's first column as text.
    func texts(_ sql: String) throws(SQLiteFailure) -> [String] {
        let s = try prepare(sql)
        defer { s.finalize() }
        var out: [String] = []
        while try s.step() { out.append(s.text(0) ?? "NULL") }
        return out
    }

    /// The first column of the first row of `sql` as an integer (0 for NULL or no row).
    func integer(_ sql: String) throws(SQLiteFailure) -> Int64 {
        let s = try prepare(sql)
        defer { s.finalize() }
        return try s.step() ? s.int64(0) : 0
    }

    fileprivate func forget(_ s: SQLiteStatement) { statements.removeAll { $0 === s } }

    /// Finalizes every statement, then closes. Idempotent.
    func close() {
        for s in statements { s.finalizeHandle() }
        statements = []
        if let h = handle { sqlite3_close_v2(h) }
        handle = nil
    }
}

/// A prepared statement. Parameters are 1-based like SQLite's; columns are 0-based.
final class SQLiteStatement {
    private var handle: OpaquePointer?
    private unowned let connection: SQLiteConnection

    fileprivate init(_ handle: OpaquePointer, connection: SQLiteConnection) {
        self.handle = handle
        self.connection = connection
    }

    fileprivate func finalizeHandle() {
        if let h = handle { sqlite3_finalize(h) }
        handle = nil
    }

    /// Finalizes a one-off statement.
    func finalize() {
        finalizeHandle()
        connection.forget(self)
    }

    // MARK: binding. Text and blobs are bound SQLITE_TRANSIENT: SQLite copies them before
    // the call returns, so the Swift buffer need not outlive it.

    @inline(__always) func bind(_ i: Int32, _ v: Int64) { sqlite3_bind_int64(handle, i, v) }
    @inline(__always) func bind(_ i: Int32, _ v: Int) { sqlite3_bind_int64(handle, i, Int64(v)) }
    @inline(__always) func bind(_ i: Int32, _ v: UInt64) { sqlite3_bind_int64(handle, i, Int64(bitPattern: v)) }
    @inline(__always) func bind(_ i: Int32, _ v: Double) { sqlite3_bind_double(handle, i, v) }
    @inline(__always) func bind(_ i: Int32, _ v: Bool) { sqlite3_bind_int64(handle, i, v ? 1 : 0) }
    @inline(__always) func bindNull(_ i: Int32) { sqlite3_bind_null(handle, i) }

    /// Binds UTF-8 text. (A nil pointer would bind NULL, so an empty string gets a real one.)
    func bind(_ i: Int32, text: String) {
        var s = text
        s.withUTF8 { bindText(i, $0) }
    }

    /// Binds UTF-8 bytes as text (serialised JSON).
    func bind(_ i: Int32, utf8 bytes: [UInt8]) {
        bytes.withUnsafeBufferPointer { bindText(i, $0) }
    }

    private func bindText(_ i: Int32, _ buf: UnsafeBufferPointer<UInt8>) {
        if let base = buf.baseAddress, buf.count > 0 {
            sqlite3_bind_text(handle, i, UnsafeRawPointer(base).assumingMemoryBound(to: CChar.self), Int32(buf.count), CSQLite_TRANSIENT())
        } else {
            sqlite3_bind_text(handle, i, "", 0, CSQLite_TRANSIENT())
        }
    }

    /// Binds bytes as a blob. (A nil pointer would bind NULL, so an empty blob is a zeroblob.)
    func bind(_ i: Int32, blob bytes: [UInt8]) {
        bytes.withUnsafeBytes { raw in
            if let base = raw.baseAddress, raw.count > 0 {
                _ = sqlite3_bind_blob(handle, i, base, Int32(raw.count), CSQLite_TRANSIENT())
            } else {
                _ = sqlite3_bind_zeroblob(handle, i, 0)
            }
        }
    }

    /// Binds every text slot of `row` without copying (SQLITE_STATIC), runs the statement
    /// to completion and clears the bindings, all while `row`'s buffer is pinned: SQLite may
    /// read a static binding until the statement is reset, so none may outlive this call.
    func run(binding row: TextRow) throws(SQLiteFailure) {
        let rc: Int32 = row.bytes.withUnsafeBufferPointer { buf in
            let base = buf.baseAddress.map { UnsafeRawPointer($0).assumingMemoryBound(to: CChar.self) }
            for slot in row.slots {
                if let base, slot.count > 0 {
                    sqlite3_bind_text(handle, slot.index, base + slot.start, Int32(slot.count), nil)
                } else {
                    sqlite3_bind_text(handle, slot.index, TextRow.empty, 0, nil)
                }
            }
            var rc = sqlite3_step(handle)
            while rc == SQLITE_ROW { rc = sqlite3_step(handle) }
            sqlite3_reset(handle)
            sqlite3_clear_bindings(handle)
            return rc
        }
        if rc != SQLITE_DONE {
            throw SQLiteFailure(code: rc, message: String(cString: sqlite3_errmsg(sqlite3_db_handle(handle))))
        }
    }

    // MARK: running

    /// Steps once: true when a row is available, false when done. Resets the statement on
    /// failure so it can be used again.
    @discardableResult
    func step() throws(SQLiteFailure) -> Bool {
        let rc = sqlite3_step(handle)
        if rc == SQLITE_ROW { return true }
        if rc == SQLITE_DONE { return false }
        let failure = SQLiteFailure(code: rc, message: String(cString: sqlite3_errmsg(sqlite3_db_handle(handle))))
        sqlite3_reset(handle)
        throw failure
    }

    /// Steps to completion and resets, for statements that return no rows.
    func run() throws(SQLiteFailure) {
        while try step() {}
        sqlite3_reset(handle)
    }

    /// Makes the statement ready to bind and run again (bindings are kept).
    func reset() { sqlite3_reset(handle) }

    // MARK: columns

    @inline(__always) func isNull(_ i: Int32) -> Bool { sqlite3_column_type(handle, i) == SQLITE_NULL }
    @inline(__always) func int64(_ i: Int32) -> Int64 { sqlite3_column_int64(handle, i) }
    @inline(__always) func int(_ i: Int32) -> Int { Int(sqlite3_column_int64(handle, i)) }
    @inline(__always) func uint64(_ i: Int32) -> UInt64 { UInt64(bitPattern: sqlite3_column_int64(handle, i)) }
    @inline(__always) func double(_ i: Int32) -> Double { sqlite3_column_double(handle, i) }

    /// The column as a string; nil when NULL.
    func text(_ i: Int32) -> String? {
        guard let p = sqlite3_column_text(handle, i) else { return nil }
        return String(decoding: UnsafeBufferPointer(start: p, count: Int(sqlite3_column_bytes(handle, i))), as: UTF8.self)
    }

    /// The column's bytes (text or blob); nil when NULL.
    func bytes(_ i: Int32) -> [UInt8]? {
        if isNull(i) { return nil }
        guard let p = sqlite3_column_blob(handle, i) else { return [] }
        let n = Int(sqlite3_column_bytes(handle, i))
        return Array(UnsafeRawBufferPointer(start: p, count: n))
    }

    /// Calls `body` with the column's bytes without copying them (valid only inside `body`);
    /// nil when NULL.
    func withBytes<T>(_ i: Int32, _ body: (UnsafeRawBufferPointer) -> T) -> T? {
        if isNull(i) { return nil }
        guard let p = sqlite3_column_blob(handle, i) else { return body(UnsafeRawBufferPointer(start: nil, count: 0)) }
        return body(UnsafeRawBufferPointer(start: p, count: Int(sqlite3_column_bytes(handle, i))))
    }
}

/// The text values of one row, gathered in one buffer so that they can be bound without a
/// copy each (`SQLiteStatement.run(binding:)`). Reused row after row.
struct TextRow {
    /// Where empty strings point (a nil pointer would bind NULL): static storage.
    static var empty: UnsafePointer<CChar> {
        UnsafeRawPointer(("" as StaticString).utf8Start).assumingMemoryBound(to: CChar.self)
    }

    struct Slot {
        var index: Int32
        var start: Int
        var count: Int
    }
    private(set) var bytes: [UInt8] = []
    private(set) var slots: [Slot] = []

    init() {
        bytes.reserveCapacity(2048)
        slots.reserveCapacity(32)
    }

    mutating func reset() {
        bytes.removeAll(keepingCapacity: true)
        slots.removeAll(keepingCapacity: true)
    }

    /// Parameter `index` gets `text`.
    mutating func add(_ index: Int32, _ text: String) {
        let start = bytes.count
        bytes.append(contentsOf: text.utf8)
        slots.append(Slot(index: index, start: start, count: bytes.count - start))
    }

    /// Parameter `index` gets whatever `write` appends (serialised JSON).
    mutating func add(_ index: Int32, writing write: (inout [UInt8]) -> Void) {
        let start = bytes.count
        write(&bytes)
        slots.append(Slot(index: index, start: start, count: bytes.count - start))
    }
}
