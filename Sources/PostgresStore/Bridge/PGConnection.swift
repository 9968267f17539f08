internal import CLibPQ

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A failed libpq call or statement: the server's message and SQLSTATE when there is one.
package struct PGFailure: Error, CustomStringConvertible {
    let message: String
    /// The five-character SQLSTATE, when the server sent one.
    let sqlState: String?
    /// The connection is gone (or was never made): reconnect before trying again.
    package let connectionLost: Bool

    package var description: String {
        let text = message.split(whereSeparator: { $0 == "\n" }).map { $0.drop { $0 == " " || $0 == "\t" } }.joined(separator: " ")
        return sqlState.map { "\(text) (SQLSTATE \($0))" } ?? text
    }
}

/// A parameter in text format, already NUL-terminated (libpq reads text parameters as C strings).
package struct PGParameter {
    fileprivate var bytes: [UInt8]?

    package static let null = PGParameter(bytes: nil)
    package init(bytes: [UInt8]?) { self.bytes = bytes }
    package init(_ text: String) { bytes = Array(text.utf8) + [0] }
    package init(_ n: Int64) { self.init(String(n)) }
    package init(_ n: Int) { self.init(String(n)) }
    /// A bytea as `\x` followed by hex digits: any bytes at all, U+0000 included (which
    /// PostgreSQL's `text` cannot hold).
    package init(bytea: some Sequence<UInt8>) {
        var b: [UInt8] = [UInt8(ascii: "\\"), UInt8(ascii: "x")]
        for byte in bytea {
            b.append(hexDigits[Int(byte >> 4)])
            b.append(hexDigits[Int(byte & 15)])
        }
        b.append(0)
        bytes = b
    }
}

let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

/// One connection to PostgreSQL, used by one thread at a time. The only type that calls `PQ*`
/// besides `PGResult`.
///
/// @unchecked Sendable: each connection is owned by one thread (the writer's) or used under a lock
/// (the reader's); libpq connections may move between threads as long as calls do not overlap.
package final class PGConnection: @unchecked Sendable {
    private var conn: OpaquePointer?

    /// Connects to `url` (a `postgres://` or `postgresql://` URI, or any libpq conninfo). The
    /// timeout applies unless the URL sets its own `connect_timeout`.
    /// `boundedReads`: for reads that must not hang (answers to clients on server threads, the
    /// owner's feed in its writer's aftermath): a statement runs at most 2 s, and a link that stops
    /// answering is given up after about 4 s (TCP), instead of the system's TCP timeout
    /// (minutes). The statement timeout is set after connecting, not as a startup option (which
    /// the URL's own `options` would replace and poolers refuse).
    package init(url: String, connectTimeoutSeconds: Int = 5, boundedReads: Bool = false) throws(PGFailure) {
        // Keywords before `dbname` are defaults the URL (expanded in its place) may override.
        var keywords = ["connect_timeout", "fallback_application_name"]
        var values = [String(connectTimeoutSeconds), "opqd"]
        if boundedReads {
            keywords += ["keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout"]
            values += ["2", "1", "2", "4000"]
        }
        keywords.append("dbname")
        values.append(url)
        let c: OpaquePointer? = withCStrings(keywords) { k in
            withCStrings(values) { v in PQconnectdbParams(k, v, 1) }
        }
        guard let c else { throw PGFailure(message: "out of memory", sqlState: nil, connectionLost: true) }
        guard PQstatus(c) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(c))
            PQfinish(c)
            throw PGFailure(message: message, sqlState: nil, connectionLost: true)
        }
        // Notices (e.g. "relation already exists, skipping") would go to stderr unasked.
        PQsetNoticeProcessor(c, { _, _ in }, nil)
        conn = c
        if boundedReads { try exec("SET statement_timeout TO 2000") }
    }

    deinit { close() }

    package func close() {
        if let c = conn { PQfinish(c) }
        conn = nil
    }

    /// False once the connection broke (libpq notices it on the next call that fails).
    package var isUsable: Bool {
        guard let c = conn else { return false }
        return PQstatus(c) == CONNECTION_OK
    }

    /// The server's version as a number (150018 for 15.18).
    var serverVersion: Int { conn.map { Int(PQserverVersion($0)) } ?? 0 }

    private func lost(_ what: String) -> PGFailure {
        let message = conn.map { String(cString: PQerrorMessage($0)) } ?? ""
        return PGFailure(message: message.isEmpty ? what : message, sqlState: nil, connectionLost: !isUsable)
    }

    /// Runs one statement (outside pipeline mode) and returns its result: rows for a query, the
    /// row count for a change. Values are bound as parameters, never spliced into `sql`.
    @discardableResult
    package func exec(_ sql: String, _ parameters: [PGParameter] = []) throws(PGFailure) -> PGResult {
        guard let c = conn else { throw PGFailure(message: "the connection is closed", sqlState: nil, connectionLost: true) }
        let raw = withParameters(parameters) { count, values in PQexecParams(c, sql, count, nil, values, nil, nil, 0) }
        guard let raw else { throw lost("no result") }
        let result = PGResult(raw)
        try result.check(connectionLost: !isUsable)
        return result
    }

    /// Names of the statements prepared on this connection (a new connection starts with none).
    private var prepared: Set<String> = []

    /// Runs `sql` as the prepared statement `name`, preparing it on this connection first if it
    /// is not yet: a statement run on every request is parsed and planned once per connection
    /// rather than once per call. `name` must always go with the same `sql`.
    func execPrepared(_ name: String, _ sql: String, _ parameters: [PGParameter]) throws(PGFailure) -> PGResult {
        guard let c = conn else { throw PGFailure(message: "the connection is closed", sqlState: nil, connectionLost: true) }
        var again = true
        while true {
            if !prepared.contains(name) {
                guard let raw = PQprepare(c, name, sql, Int32(parameters.count), nil) else { throw lost("no result") }
                do throws(PGFailure) {
                    try PGResult(raw).check(connectionLost: !isUsable)
                } catch {
                    // 42P05: the session has it already (a pooler handed over a server
                    // connection that prepared it): use it.
                    if error.sqlState != "42P05" { throw error }
                }
                prepared.insert(name)
            }
            let raw = withParameters(parameters) { count, values in PQexecPrepared(c, name, count, values, nil, nil, 0) }
            guard let raw else { throw lost("no result") }
            let result = PGResult(raw)
            do throws(PGFailure) {
                try result.check(connectionLost: !isUsable)
                return result
            } catch {
                // 26000: the statement is gone from the session (a pooler's DISCARD ALL, or
                // another server connection): prepared again, once.
                guard error.sqlState == "26000", again else { throw error }
                prepared.remove(name)
                again = false
            }
        }
    }

    /// Runs a fixed script of several statements (no parameters), e.g. a migration that
    /// defines a function whose body holds semicolons. Outside pipeline mode only.
    package func runScript(_ sql: String) throws(PGFailure) {
        guard let c = conn else { throw PGFailure(message: "the connection is closed", sqlState: nil, connectionLost: true) }
        guard let raw = PQexec(c, sql) else { throw lost("no result") }
        try PGResult(raw).check(connectionLost: !isUsable)
    }

    // MARK: - notifications

    /// Waits up to `seconds` for the socket to become readable, then takes in what arrived and
    /// returns how many notifications (`LISTEN`) were pending, each freed. Throws when the
    /// connection broke.
    /// Notifications whose payload is `ignoring` are consumed but not counted.
    func awaitNotifications(seconds: Double, ignoring: String? = nil) throws(PGFailure) -> Int {
        guard let c = conn else { throw PGFailure(message: "the connection is closed", sqlState: nil, connectionLost: true) }
        let fd = PQsocket(c)
        guard fd >= 0 else { throw lost("no socket") }
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let ms = Int32(max(0, min(seconds, 60)) * 1000)
        _ = poll(&p, 1, ms)
        guard PQconsumeInput(c) == 1 else { throw lost("reading notifications failed") }
        var count = 0
        while let n = PQnotifies(c) {
            var own = false
            if let ignoring, let extra = n.pointee.extra { own = String(cString: extra) == ignoring }
            PQfreemem(n)
            if !own { count += 1 }
        }
        return count
    }

    // MARK: - pipeline mode

    /// Pipeline mode (libpq >= 14): statements are sent without waiting for each answer, so a
    /// whole group commit is one round trip.
    package func enterPipelineMode() throws(PGFailure) {
        guard let c = conn, PQenterPipelineMode(c) == 1 else { throw lost("cannot enter pipeline mode") }
    }

    /// Queues one statement of the pipeline.
    package func send(_ sql: String, _ parameters: [PGParameter] = []) throws(PGFailure) {
        guard let c = conn else { throw PGFailure(message: "the connection is closed", sqlState: nil, connectionLost: true) }
        let ok = withParameters(parameters) { count, values in PQsendQueryParams(c, sql, count, nil, values, nil, nil, 0) }
        if ok != 1 { throw lost("sending a statement failed") }
    }

    /// Queues the prepared statement `name` (see `prepare(_:)`) of the pipeline.
    package func send(prepared name: String, _ parameters: [PGParameter] = []) throws(PGFailure) {
        guard let c = conn else { throw PGFailure(message: "the connection is closed", sqlState: nil, connectionLost: true) }
        let ok = withParameters(parameters) { count, values in PQsendQueryPrepared(c, name, count, values, nil, nil, 0) }
        if ok != 1 { throw lost("sending a statement failed") }
    }

    /// Prepares `statements` (name, text) on this connection in one round trip of the pipeline,
    /// for `send(prepared:)`: each is parsed once per connection instead of once per call, and
    /// planned once when its generic plan is as good as a custom one. Throws when one of them
    /// is refused (the others may stay prepared: close the connection).
    package func prepare(_ statements: [(name: String, sql: String)]) throws(PGFailure) {
        guard let c = conn else { throw PGFailure(message: "the connection is closed", sqlState: nil, connectionLost: true) }
        for (name, sql) in statements where PQsendPrepare(c, name, sql, 0, nil) != 1 {
            throw lost("sending a statement to prepare failed")
        }
        try sync()
        _ = try readPipeline(count: statements.count)
    }

    /// Ends the pipeline's current batch (the server runs it and answers).
    package func sync() throws(PGFailure) {
        guard let c = conn, PQpipelineSync(c) == 1 else { throw lost("sending the sync failed") }
    }

    /// Reads the answers of `count` statements and then the sync point. Every statement's
    /// result is returned (the first failure first among them), after the whole batch is read,
    /// so the connection is ready for the next one whatever happened.
    package func readPipeline(count: Int) throws(PGFailure) -> [PGResult] {
        guard let c = conn else { throw PGFailure(message: "the connection is closed", sqlState: nil, connectionLost: true) }
        var results: [PGResult] = []
        var firstFailure: PGFailure?
        for _ in 0..<count {
            guard let raw = PQgetResult(c) else { throw lost("the server sent fewer results than statements") }
            let r = PGResult(raw)
            // The NULL that ends this statement's results.
            while let extra = PQgetResult(c) { PQclear(extra) }
            if firstFailure == nil {
                do throws(PGFailure) { try r.check(connectionLost: !isUsable) } catch { firstFailure = error }
            }
            results.append(r)
        }
        guard let raw = PQgetResult(c) else { throw lost("no sync point at the end of the pipeline") }
        let status = PQresultStatus(raw)
        PQclear(raw)
        if status != PGRES_PIPELINE_SYNC { throw lost("the pipeline did not end at its sync point") }
        if let firstFailure { throw firstFailure }
        return results
    }
}

/// A statement's result. Values come back in text format; every accessor checks its indexes,
/// so a result of an unexpected shape reads as NULLs rather than out of bounds.
package final class PGResult {
    private let raw: OpaquePointer
    init(_ raw: OpaquePointer) { self.raw = raw }
    deinit { PQclear(raw) }

    fileprivate func check(connectionLost: Bool) throws(PGFailure) {
        let status = PQresultStatus(raw)
        switch status {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY: return
        default:
            let state = PQresultErrorField(raw, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
            var message = PQresultErrorMessage(raw).map { String(cString: $0) } ?? ""
            if status == PGRES_PIPELINE_ABORTED && message.isEmpty { message = "not run: an earlier statement of the pipeline failed" }
            if message.isEmpty { message = String(cString: PQresStatus(status)) }
            throw PGFailure(message: message, sqlState: state, connectionLost: connectionLost)
        }
    }

    package var rows: Int { Int(PQntuples(raw)) }
    var columns: Int { Int(PQnfields(raw)) }

    /// Rows changed by an INSERT, UPDATE or DELETE (0 when the server did not say).
    var changes: Int { Int(String(cString: PQcmdTuples(raw))) ?? 0 }

    private func valid(_ row: Int, _ column: Int) -> Bool { row >= 0 && row < rows && column >= 0 && column < columns }

    func isNull(_ row: Int, _ column: Int) -> Bool {
        !valid(row, column) || PQgetisnull(raw, Int32(row), Int32(column)) == 1
    }

    /// The value's text bytes, without a copy, for the duration of `body`; nil for NULL.
    func withBytes<T>(_ row: Int, _ column: Int, _ body: (UnsafeRawBufferPointer) -> T) -> T? {
        guard !isNull(row, column), let p = PQgetvalue(raw, Int32(row), Int32(column)) else { return nil }
        let n = Int(PQgetlength(raw, Int32(row), Int32(column)))
        return body(UnsafeRawBufferPointer(start: UnsafeRawPointer(p), count: max(0, n)))
    }

    func text(_ row: Int, _ column: Int) -> String? {
        withBytes(row, column) { String(decoding: $0, as: UTF8.self) }
    }

    /// A bigint column; nil for NULL or anything that is not a 64-bit integer.
    package func int64(_ row: Int, _ column: Int) -> Int64? { text(row, column).flatMap { Int64($0) } }

    func double(_ row: Int, _ column: Int) -> Double? { text(row, column).flatMap { Double($0) } }

    func bool(_ row: Int, _ column: Int) -> Bool? {
        switch text(row, column) {
        case "t": return true
        case "f": return false
        default: return nil
        }
    }

    /// A bytea column (hex output, `\x...`); nil for NULL or malformed text.
    func bytea(_ row: Int, _ column: Int) -> [UInt8]? {
        withBytes(row, column) { b -> [UInt8]? in
            guard b.count >= 2, b[0] == UInt8(ascii: "\\"), b[1] == UInt8(ascii: "x"), b.count % 2 == 0 else { return nil }
            var out: [UInt8] = []
            out.reserveCapacity((b.count - 2) / 2)
            var i = 2
            while i < b.count {
                guard let hi = hexValue(b[i]), let lo = hexValue(b[i + 1]) else { return nil }
                out.append(hi << 4 | lo)
                i += 2
            }
            return out
        } ?? nil
    }
}

private func hexValue(_ c: UInt8) -> UInt8? {
    switch c {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
    default: return nil
    }
}

/// Calls `body` with a NULL-terminated array of C strings.
private func withCStrings<T>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> T) -> T {
    let copies: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    defer { for p in copies { free(p) } }
    var pointers: [UnsafePointer<CChar>?] = copies.map { $0.map { UnsafePointer($0) } }
    pointers.append(nil)
    // Never empty (the terminating NULL), so the base address exists.
    return pointers.withUnsafeBufferPointer { buffer in
        guard let base = buffer.baseAddress else { preconditionFailure("a non-empty array has storage") }
        return body(base)
    }
}

/// Calls `body` with the parameters as libpq wants them: a count and an array of C strings
/// (NULL for SQL NULL), valid during the call.
private func withParameters<T>(_ parameters: [PGParameter], _ body: (Int32, UnsafePointer<UnsafePointer<CChar>?>?) -> T) -> T {
    if parameters.isEmpty { return body(0, nil) }
    var pointers: [UnsafePointer<CChar>?] = []
    pointers.reserveCapacity(parameters.count)
    func nest(_ i: Int) -> T {
        if i == parameters.count {
            return pointers.withUnsafeBufferPointer { body(Int32(parameters.count), $0.baseAddress) }
        }
        guard let bytes = parameters[i].bytes else {
            pointers.append(nil)
            return nest(i + 1)
        }
        return bytes.withUnsafeBytes { raw in
            // Every parameter ends with its NUL, so the buffer is never empty.
            pointers.append(raw.bindMemory(to: CChar.self).baseAddress.map { UnsafePointer($0) })
            return nest(i + 1)
        }
    }
    return nest(0)
}
