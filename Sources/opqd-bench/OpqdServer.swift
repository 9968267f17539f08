// One opqd child of the HTTP-level benchmarks (`store`, `workers`).
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// One `opqd` started on 127.0.0.1, port 0, in its own fresh data directory.
final class OpqdServer: @unchecked Sendable {
    /// TestKit's opqd child: spawned, its port read from the listening line, stderr in `logPath`.
    let process: ServerProcess
    let port: UInt16
    let dataDir: String
    let logPath: String
    let label: String
    let ownsDir: Bool
    /// Seconds from spawn to the "listening" line.
    var startSeconds: Double { process.startupSeconds }

    /// `extra`: e.g. ["--store", "memory"] or ["--sync", "normal"]. `dataDir` nil = a fresh one.
    /// The server inherits this process's environment, OPQD_* settings included.
    /// `binary`: another opqd than the one next to this executable (a baseline build).
    init(label: String, extra: [String], dataDir: String? = nil, startTimeout: Double = 60, binary: String? = nil) throws {
        self.label = label
        let dir = dataDir ?? BenchSupport.makeTempDir("opqd-bench-\(label)")
        self.dataDir = dir
        self.ownsDir = dataDir == nil
        self.logPath = BenchSupport.makeTempDir("opqd-bench-log") + "/opqd.log"
        do {
            process = try ServerProcess(
                binary: binary ?? BenchSupport.opqdBinary(), data: dir, logPath: logPath, extraArguments: extra,
                timeout: startTimeout, logLevel: "error", keepOpqdSettings: true)
        } catch {
            throw BenchError("opqd (\(label)) did not start: \(error)")
        }
        port = UInt16(clamping: process.port)
    }

    var url: String { "http://127.0.0.1:\(port)" }
    var pid: pid_t { process.pid }

    /// Stops it (SIGTERM); removes its data directory if it made it.
    func stop(keepData: Bool = false) {
        process.signal(SIGTERM)
        if process.waitForExit(timeout: 10) == nil {
            eprint("opqd-bench: opqd (\(label), pid \(pid)) ignored SIGTERM for 10 s; killing it\n")
            process.killNow()
        }
        removeDirs(keepData: keepData)
    }

    func removeDirs(keepData: Bool) {
        if ownsDir && !keepData { BenchSupport.removeTree(dataDir) }
        BenchSupport.removeTree((logPath as NSString).deletingLastPathComponent)
    }

    /// The tail of its log, for error reports.
    var logTail: String { String(((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "").suffix(3000)) }

    /// One request on a fresh connection.
    func request(_ method: String, _ path: String, _ body: String? = nil) throws -> TestResponse {
        let c = KeepAliveClient(port: Int(port), retries: 0)
        defer { c.close() }
        return try c.request(method, path, body: body.map { Array($0.utf8) })
    }

    func json(_ method: String, _ path: String, _ body: String? = nil) throws -> (Int, [String: Any]) {
        let r = try request(method, path, body)
        return (r.status, BenchSupport.parseJSON(r.body) ?? [:])
    }

    /// Creates a queue; throws unless 201.
    func createQueue(_ name: String, suspended: Bool, maxConcurrent: Int = -1) throws {
        let r = try request("POST", "/v1/queues", "{\"name\":\"\(name)\",\"isSuspended\":\(suspended),\"maxConcurrentOperationCount\":\(maxConcurrent)}")
        guard r.status == 201 else { throw BenchError("create queue \(name) on \(label): HTTP \(r.status) \(r.text)") }
    }

    func queue(_ name: String) throws -> [String: Any] {
        let (s, j) = try json("GET", "/v1/queues/\(name)")
        guard s == 200 else { throw BenchError("GET /v1/queues/\(name) on \(label): HTTP \(s)") }
        return j
    }

    /// `/metrics` lines whose name mentions the store or commits (nil if there are none).
    func storeMetrics() -> [String: Double] {
        guard let r = try? request("GET", "/metrics"), r.status == 200 else { return [:] }
        var out: [String: Double] = [:]
        for line in r.text.split(separator: "\n") where !line.hasPrefix("#") {
            let l = line.lowercased()
            guard l.contains("store") || l.contains("commit") else { continue }
            let parts = line.split(separator: " ")
            if parts.count >= 2, let v = Double(parts[parts.count - 1]) { out[parts.dropLast().joined(separator: " ")] = v }
        }
        return out
    }
}
