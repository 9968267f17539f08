import Foundation

/// The PostgreSQL the tests run against: `OPQD_TEST_POSTGRES_URL` (scripts/test.sh starts a
/// throwaway server with scripts/pg.sh and sets it). Each test makes its own database, so tests
/// are independent and can run in parallel. Statements go through `psql`, which comes with the
/// server.
public enum TestPostgres {
    /// The variable that names the server.
    public static let variable = "OPQD_TEST_POSTGRES_URL"

    /// The server's URL; nil when the variable is unset or empty.
    public static var serverURL: String? {
        guard let url = ProcessInfo.processInfo.environment[variable], !url.isEmpty else { return nil }
        return url
    }

    /// Why PostgreSQL tests cannot run, for their failure message.
    public static let missing =
        "no PostgreSQL to test against: set \(variable) to a server's URL (`scripts/pg.sh start /tmp/opqd-pg` starts one and prints it); scripts/test.sh starts one and sets it"

    /// The server's URL, or a thrown error that says what to set: a PostgreSQL test never passes
    /// without a server.
    public static func requireServer() throws -> String {
        guard let url = serverURL else {
            print(missing)
            throw TestClientError(missing)
        }
        return url
    }

    /// Creates an empty database `opqd_test_<random>` and returns its URL.
    public static func createDatabase() throws -> String {
        let server = try requireServer()
        let name = "opqd_test_\(UInt64.random(in: 0...UInt64.max))"
        try psql(server, "CREATE DATABASE \(name)")
        return url(server, database: name)
    }

    /// Drops a database made by `createDatabase` (after its connections are closed).
    public static func dropDatabase(_ url: String) {
        guard let server = serverURL, let last = url.split(separator: "?").first?.split(separator: "/").last else { return }
        let name = String(last)
        guard name.hasPrefix("opqd_test_"), name.allSatisfy({ $0.isNumber || $0.isLetter || $0 == "_" }) else { return }
        _ = try? psql(server, "DROP DATABASE IF EXISTS \(name) WITH (FORCE)")
    }

    /// `server`'s URL with another database name.
    public static func url(_ server: String, database: String) -> String {
        guard let scheme = server.range(of: "://") else { return server }
        let rest = server[scheme.upperBound...]
        let end = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        let query = rest[end...].firstIndex(of: "?").map { String(rest[$0...]) } ?? ""
        return String(server[..<end]) + "/" + database + query
    }

    /// Runs `sql` with psql on `url` (stopping at the first error) and returns its output
    /// (unaligned, tuples only). Throws with psql's messages when it fails.
    @discardableResult
    public static func psql(_ url: String, _ sql: String) throws -> String {
        let errors = NSTemporaryDirectory() + "opqd-psql-\(UInt64.random(in: 0...UInt64.max)).err"
        defer { try? FileManager.default.removeItem(atPath: errors) }
        let (code, output) = try ChildProcess.capture(
            psqlPath, ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql], stderr: .file(errors, append: false))
        guard code == 0 else {
            let message = (try? String(contentsOfFile: errors, encoding: .utf8)) ?? ""
            throw TestClientError("psql failed (exit \(code.map(String.init) ?? "by a signal")) on \(sql): \(message)")
        }
        return String(decoding: output, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static var psqlPath: String {
        for p in ["/usr/bin/psql", "/usr/local/bin/psql"] where FileManager.default.isExecutableFile(atPath: p) { return p }
        let versions = (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []
        for v in versions.sorted().reversed() where FileManager.default.isExecutableFile(atPath: "/usr/lib/postgresql/\(v)/bin/psql") {
            return "/usr/lib/postgresql/\(v)/bin/psql"
        }
        return "psql"
    }
}
