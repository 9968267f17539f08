// Shared pieces of the HTTP-level benchmarks (`http`, `store`, `workers`): child processes
// (opqd, wrk), fresh temporary data directories, a raw-socket keep-alive HTTP/1.1 client,
// wrk output parsing, and small formatting helpers.
import Dispatch
import Foundation
#if canImport(Glibc)
import Glibc
#endif

enum BenchSupport {
    /// Monotonic seconds.
    static func now() -> Double { Double(DispatchTime.now().uptimeNanoseconds) / 1e9 }

    /// A fresh directory under `$TMPDIR` (or /tmp).
    static func makeTempDir(_ prefix: String) -> String {
        let base = ProcessInfo.processInfo.environment["TMPDIR"].flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
        var template = Array("\(base)/\(prefix)-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else {
            eprint("opqd-bench: cannot create a temporary directory under \(base)\n")
            exit(1)
        }
        return String(cString: made)
    }

    static func removeTree(_ path: String) {
        try? FileManager.default.removeItem(atPath: path)
    }

    /// Bytes used under `path` (files only, not following links).
    static func treeSize(_ path: String) -> Int {
        guard let e = FileManager.default.enumerator(atPath: path) else { return 0 }
        var total = 0
        while let f = e.nextObject() as? String {
            if let a = try? FileManager.default.attributesOfItem(atPath: path + "/" + f), let s = a[.size] as? NSNumber {
                total += s.intValue
            }
        }
        return total
    }

    /// The directory holding this executable.
    static var selfDirectory: String {
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        return (exe as NSString).deletingLastPathComponent
    }

    /// The `opqd` built next to this executable (same scratch dir, same configuration).
    static func opqdBinary() -> String {
        if let env = ProcessInfo.processInfo.environment["OPQD_BIN"], !env.isEmpty { return env }
        let p = selfDirectory + "/opqd"
        if access(p, X_OK) == 0 { return p }
        eprint("opqd-bench: no opqd next to this executable (\(p)); build it with --product opqd or set OPQD_BIN\n")
        exit(1)
    }

    /// A `/proc/PID/status` field in kB (`VmHWM`, `VmRSS`).
    static func statusKB(_ pid: pid_t, _ field: String) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
            let parts = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            if parts.count >= 2 { return Int(parts[1]) }
        }
        return nil
    }

    static func loadAverage() -> String {
        (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8))?.split(separator: " ").prefix(3).joined(separator: " ") ?? "?"
    }

    /// `uptime`-like context line for the report.
    static func machineLine() -> String {
        "machine: \(sysconf(Int32(_SC_NPROCESSORS_ONLN))) cores, load average \(loadAverage()) (before the run)"
    }

    static func fmt(_ v: Double, _ decimals: Int = 0) -> String { String(format: "%.\(decimals)f", v) }

    static func grouped(_ v: Double) -> String {
        let n = Int(v.rounded())
        let s = String(abs(n))
        var out = ""
        for (i, c) in s.reversed().enumerated() {
            if i > 0 && i % 3 == 0 { out.append(",") }
            out.append(c)
        }
        return (n < 0 ? "-" : "") + String(out.reversed())
    }

    static func pad(_ s: String, _ width: Int, right: Bool = false) -> String {
        if s.count >= width { return s }
        let fill = String(repeating: " ", count: width - s.count)
        return right ? fill + s : s + fill
    }

    static func percentile(_ sorted: [Double], _ p: Double) -> Double {
        guard !sorted.isEmpty else { return 0 }
        let i = min(sorted.count - 1, max(0, Int((p * Double(sorted.count)).rounded(.up)) - 1))
        return sorted[i]
    }

    static func round3(_ v: Double) -> Double { (v * 1000).rounded() / 1000 }

    /// One JSON object on one line, keys in the given order.
    static func jsonLine(_ pairs: [(String, Any)]) -> String {
        func enc(_ v: Any) -> String {
            switch v {
            case let b as Bool: return b ? "true" : "false"
            case let i as Int: return String(i)
            case let d as Double: return d.isFinite ? (d == d.rounded() && abs(d) < 1e15 ? String(Int(d)) : String(d)) : "null"
            case let s as String:
                let data = (try? JSONSerialization.data(withJSONObject: [s], options: [])) ?? Data("[\"\"]".utf8)
                let t = String(decoding: data, as: UTF8.self)
                return String(t.dropFirst().dropLast())
            case let o as [(String, Any)]: return "{" + o.map { enc($0.0) + ":" + enc($0.1) }.joined(separator: ",") + "}"
            case let a as [Any]: return "[" + a.map(enc).joined(separator: ",") + "]"
            case is NSNull: return "null"
            default: return "null"
            }
        }
        return enc(pairs)
    }

    static func parseJSON(_ bytes: [UInt8]) -> [String: Any]? {
        try? JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any]
    }

    static func int(_ v: Any?) -> Int? {
        if let i = v as? Int { return i }
        if let n = v as? NSNumber { return n.intValue }
        return nil
    }
}

// MARK: - child processes

/// A process started with posix_spawn; stdout optionally to a pipe we read, stderr to a file.
final class ChildProcess: @unchecked Sendable {
    let pid: pid_t
    let argv: [String]
    private(set) var stdoutFD: Int32 = -1
    private var pending: [UInt8] = []
    private(set) var exitStatus: Int32?

    /// `stdoutPath`: nil = pipe (read with `readLine`), "-" = inherit, else a file.
    /// `stderrPath`: nil = inherit, else a file.
    init(_ argv: [String], stdoutPath: String? = nil, stderrPath: String? = nil, environment: [String: String] = [:]) throws {
        self.argv = argv
        var fa = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&fa)
        defer { posix_spawn_file_actions_destroy(&fa) }
        var fds: [Int32] = [-1, -1]
        if stdoutPath == nil {
            guard pipe(&fds) == 0 else { throw BenchError("pipe: \(String(cString: strerror(errno)))") }
            _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)
            _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
            posix_spawn_file_actions_adddup2(&fa, fds[1], 1)
        } else if let p = stdoutPath, p != "-" {
            posix_spawn_file_actions_addopen(&fa, 1, p, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        }
        if let e = stderrPath { posix_spawn_file_actions_addopen(&fa, 2, e, O_WRONLY | O_CREAT | O_TRUNC, 0o644) }
        var env = ProcessInfo.processInfo.environment
        for (k, v) in environment { env[k] = v }
        let cargs: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
        let cenv: [UnsafeMutablePointer<CChar>?] = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { for p in cargs { free(p) }; for p in cenv { free(p) } }
        var pid = pid_t()
        let rc = posix_spawnp(&pid, argv[0], &fa, nil, cargs, cenv)
        if fds[1] >= 0 { close(fds[1]) }
        guard rc == 0 else {
            if fds[0] >= 0 { close(fds[0]) }
            throw BenchError("cannot run \(argv[0]): \(String(cString: strerror(rc)))")
        }
        self.pid = pid
        self.stdoutFD = fds[0]
    }

    /// The next line of the child's stdout, or nil at EOF or after `timeout` seconds.
    func readLine(timeout: Double) -> String? {
        let deadline = BenchSupport.now() + timeout
        while true {
            if let nl = pending.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: pending[..<nl], as: UTF8.self)
                pending.removeFirst(nl + 1)
                return line
            }
            let left = deadline - BenchSupport.now()
            guard left > 0, stdoutFD >= 0 else { return nil }
            var p = pollfd(fd: stdoutFD, events: Int16(POLLIN), revents: 0)
            let r = Glibc.poll(&p, 1, Int32(min(left, 1) * 1000) + 1)
            if r < 0 && errno != EINTR { return nil }
            if r <= 0 { continue }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = read(stdoutFD, &chunk, chunk.count)
            if n <= 0 { return nil }
            pending.append(contentsOf: chunk[..<n])
        }
    }

    /// Polls for exit; returns the wait status once it exited.
    func poll() -> Int32? {
        if let s = exitStatus { return s }
        var status: Int32 = 0
        let r = waitpid(pid, &status, WNOHANG)
        if r == pid { exitStatus = status; return status }
        return nil
    }

    /// Waits up to `timeout` seconds for exit.
    @discardableResult
    func wait(timeout: Double) -> Int32? {
        let deadline = BenchSupport.now() + timeout
        while BenchSupport.now() < deadline {
            if let s = poll() { return s }
            usleep(10_000)
        }
        return poll()
    }

    /// SIGTERM, then SIGKILL after `grace` seconds; reaps it.
    func stop(grace: Double = 10) {
        defer { if stdoutFD >= 0 { close(stdoutFD); stdoutFD = -1 } }
        guard poll() == nil else { return }
        kill(pid, SIGTERM)
        if wait(timeout: grace) == nil {
            eprint("opqd-bench: \(argv[0]) (pid \(pid)) ignored SIGTERM for \(grace) s; killing it\n")
            kill(pid, SIGKILL)
            wait(timeout: 10)
        }
    }

    func kill9() {
        guard poll() == nil else { return }
        kill(pid, SIGKILL)
        wait(timeout: 10)
        if stdoutFD >= 0 { close(stdoutFD); stdoutFD = -1 }
    }

    var exitedNormally: Bool {
        guard let s = exitStatus else { return false }
        return s & 0x7f == 0 && (s >> 8) & 0xff == 0
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

// MARK: - opqd

/// One `opqd` started on 127.0.0.1, port 0, in its own fresh data directory.
final class OpqdServer: @unchecked Sendable {
    let process: ChildProcess
    let port: UInt16
    let dataDir: String
    let logPath: String
    let label: String
    let ownsDir: Bool
    /// Seconds from spawn to the "listening" line.
    let startSeconds: Double

    /// `extra`: e.g. ["--store", "memory"] or ["--sync", "normal"]. `dataDir` nil = a fresh one.
    init(label: String, extra: [String], dataDir: String? = nil, startTimeout: Double = 60) throws {
        self.label = label
        let dir = dataDir ?? BenchSupport.makeTempDir("opqd-bench-\(label)")
        self.dataDir = dir
        self.ownsDir = dataDir == nil
        self.logPath = BenchSupport.makeTempDir("opqd-bench-log") + "/opqd.log"
        let argv = [BenchSupport.opqdBinary(), "--host", "127.0.0.1", "--port", "0", "--data", dir, "--log-level", "error"] + extra
        let t0 = BenchSupport.now()
        let p = try ChildProcess(argv, stdoutPath: nil, stderrPath: logPath)
        self.process = p
        var port: UInt16 = 0
        while let line = p.readLine(timeout: max(0.1, startTimeout - (BenchSupport.now() - t0))) {
            if let r = line.range(of: "listening on http://") {
                let rest = line[r.upperBound...]
                if let colon = rest.lastIndex(of: ":"), let n = UInt16(rest[rest.index(after: colon)...].trimmingCharacters(in: .whitespaces)) {
                    port = n
                    break
                }
            }
        }
        startSeconds = BenchSupport.now() - t0
        guard port != 0 else {
            p.stop()
            let log = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
            throw BenchError("opqd (\(label)) did not start within \(startTimeout) s: \(argv.joined(separator: " "))\n\(log.suffix(2000))")
        }
        self.port = port
    }

    var url: String { "http://127.0.0.1:\(port)" }
    var pid: pid_t { process.pid }

    /// Stops it (SIGTERM); removes its data directory if it made it.
    func stop(keepData: Bool = false) {
        process.stop()
        removeDirs(keepData: keepData)
    }

    func removeDirs(keepData: Bool) {
        if ownsDir && !keepData { BenchSupport.removeTree(dataDir) }
        BenchSupport.removeTree((logPath as NSString).deletingLastPathComponent)
    }

    /// The tail of its log, for error reports.
    var logTail: String { String(((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "").suffix(3000)) }

    /// One request on a fresh connection.
    func request(_ method: String, _ path: String, _ body: String? = nil) throws -> HTTPConnection.Response {
        let c = try HTTPConnection(port: port)
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

// MARK: - raw HTTP/1.1 client

/// One keep-alive HTTP/1.1 connection over a plain socket: fixed Content-Length (or chunked)
/// answers, no pipelining. Not thread-safe: one per thread.
final class HTTPConnection: @unchecked Sendable {
    struct Response {
        var status: Int
        var headers: [(String, String)]
        var body: [UInt8]
        var text: String { String(decoding: body, as: UTF8.self) }
        func header(_ name: String) -> String? { headers.first { $0.0 == name }?.1 }
    }

    let port: UInt16
    private var fd: Int32 = -1
    private var buf: [UInt8] = []
    private var start = 0
    private var scratch = [UInt8](repeating: 0, count: 65536)

    init(port: UInt16) throws {
        self.port = port
        try connect()
    }

    deinit { close() }

    func close() {
        if fd >= 0 { Glibc.close(fd); fd = -1 }
        buf.removeAll(keepingCapacity: true); start = 0
    }

    private func connect() throws {
        close()
        let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard s >= 0 else { throw BenchError("socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(s, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = port.bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else {
            let e = errno
            Glibc.close(s)
            throw BenchError("connect 127.0.0.1:\(port): \(String(cString: strerror(e)))")
        }
        fd = s
    }

    /// Sends one request and reads its answer. Reconnects first if the last answer closed.
    func request(_ method: String, _ path: String, body: [UInt8]? = nil, headers: String = "") throws -> Response {
        if fd < 0 { try connect() }
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n" + headers
        if let body {
            head += "Content-Type: application/json\r\nContent-Length: \(body.count)\r\n"
        } else if method == "POST" || method == "PUT" || method == "PATCH" {
            head += "Content-Length: 0\r\n"
        }
        head += "\r\n"
        var out = Array(head.utf8)
        if let body { out += body }
        try sendAll(out)
        let r = try readResponse(method: method)
        if r.header("connection")?.lowercased() == "close" { close() }
        return r
    }

    private func sendAll(_ bytes: [UInt8]) throws {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR { continue }
                let e = errno
                close()
                throw BenchError("send: \(String(cString: strerror(e)))")
            }
            off += n
        }
    }

    /// Reads more bytes into `buf`; throws at EOF.
    private func fill() throws {
        if start > 0 && start == buf.count { buf.removeAll(keepingCapacity: true); start = 0 }
        while true {
            let n = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            if n > 0 { buf.append(contentsOf: scratch[0..<n]); return }
            if n < 0 && errno == EINTR { continue }
            let e = n == 0 ? "connection closed by the server" : String(cString: strerror(errno))
            close()
            throw BenchError("recv: \(e)")
        }
    }

    private func readResponse(method: String) throws -> Response {
        // Head.
        var headEnd = -1
        var scanFrom = start
        while headEnd < 0 {
            if buf.count - scanFrom >= 4 {
                var i = scanFrom
                while i + 3 < buf.count {
                    if buf[i] == 13 && buf[i + 1] == 10 && buf[i + 2] == 13 && buf[i + 3] == 10 { headEnd = i; break }
                    i += 1
                }
                if headEnd < 0 { scanFrom = max(start, buf.count - 3) }
            }
            if headEnd < 0 { try fill() }
        }
        let head = String(decoding: buf[start..<headEnd], as: UTF8.self)
        start = headEnd + 4
        let lines = head.split(separator: "\r\n", omittingEmptySubsequences: false)
        guard let first = lines.first else { throw BenchError("empty response head") }
        let parts = first.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, let status = Int(parts[1]) else { throw BenchError("bad status line: \(first)") }
        var headers: [(String, String)] = []
        var length: Int? = nil
        var chunked = false
        for l in lines.dropFirst() {
            guard let colon = l.firstIndex(of: ":") else { continue }
            let name = l[..<colon].lowercased()
            let value = l[l.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            headers.append((name, value))
            if name == "content-length" { length = Int(value) }
            if name == "transfer-encoding" && value.lowercased().contains("chunked") { chunked = true }
        }
        var body: [UInt8] = []
        if method == "HEAD" || status == 204 || status == 304 || (100..<200).contains(status) {
            // no body
        } else if chunked {
            while true {
                let lineEnd = try readLineEnd()
                let sizeText = String(decoding: buf[start..<lineEnd], as: UTF8.self).split(separator: ";").first ?? ""
                start = lineEnd + 2
                guard let size = Int(sizeText.trimmingCharacters(in: .whitespaces), radix: 16) else { throw BenchError("bad chunk size") }
                if size == 0 { _ = try readLineEnd(); start += 2; break }
                while buf.count - start < size + 2 { try fill() }
                body += buf[start..<(start + size)]
                start += size + 2
            }
        } else if let length {
            while buf.count - start < length { try fill() }
            body = Array(buf[start..<(start + length)])
            start += length
        } else {
            // Until close.
            while true {
                do { try fill() } catch { break }
            }
            body = Array(buf[min(start, buf.count)...])
            start = buf.count
        }
        if start == buf.count { buf.removeAll(keepingCapacity: true); start = 0 }
        return Response(status: status, headers: headers, body: body)
    }

    private func readLineEnd() throws -> Int {
        var i = start
        while true {
            while i + 1 < buf.count {
                if buf[i] == 13 && buf[i + 1] == 10 { return i }
                i += 1
            }
            try fill()
        }
    }
}

// MARK: - wrk

struct WrkResult {
    var requests = 0
    var seconds = 0.0
    var rps = 0.0
    var non2xx = 0
    var socketErrors = ""
    var p50ms = 0.0
    var p99ms = 0.0
    var raw = ""
    /// Answers wrk saw that were 2xx (for a create: acknowledged creates).
    var ok: Int { requests - non2xx }
}

enum Wrk {
    static func ensureInstalled() -> Bool {
        if access("/usr/bin/wrk", X_OK) == 0 || access("/usr/local/bin/wrk", X_OK) == 0 { return true }
        eprint("opqd-bench: wrk is not installed; run scripts/deps.sh bench (Debian package wrk)\n")
        return false
    }

    /// Runs wrk; `lua` is the script's text (written to a temp file).
    static func run(url: String, connections: Int, seconds: Int, threads: Int = 2, lua: String? = nil) throws -> WrkResult {
        let dir = BenchSupport.makeTempDir("opqd-bench-wrk")
        defer { BenchSupport.removeTree(dir) }
        var argv = ["wrk", "-t\(min(threads, connections))", "-c\(connections)", "-d\(seconds)s", "--latency", "--timeout", "10s"]
        if let lua {
            try lua.write(toFile: dir + "/script.lua", atomically: true, encoding: .utf8)
            argv += ["-s", dir + "/script.lua"]
        }
        argv.append(url)
        let p = try ChildProcess(argv, stdoutPath: dir + "/out.txt", stderrPath: dir + "/err.txt")
        guard let status = p.wait(timeout: Double(seconds) + 60) else {
            p.kill9()
            throw BenchError("wrk did not finish in time")
        }
        let text = (try? String(contentsOfFile: dir + "/out.txt", encoding: .utf8)) ?? ""
        guard status == 0 else {
            let err = (try? String(contentsOfFile: dir + "/err.txt", encoding: .utf8)) ?? ""
            throw BenchError("wrk failed (status \(status)): \(text)\(err)")
        }
        return parse(text)
    }

    static func ms(_ s: Substring) -> Double {
        let units: [(String, Double)] = [("us", 0.001), ("ms", 1), ("s", 1000), ("m", 60_000)]
        for (u, f) in units where s.hasSuffix(u) {
            if let v = Double(s.dropLast(u.count)) { return v * f }
        }
        return Double(s) ?? 0
    }

    static func parse(_ text: String) -> WrkResult {
        var r = WrkResult()
        r.raw = text
        for line in text.split(separator: "\n") {
            let t = line.trimmingCharacters(in: .whitespaces)
            let w = t.split(separator: " ", omittingEmptySubsequences: true)
            if t.contains("requests in"), let n = Int(w.first ?? "") {
                r.requests = n
                if w.count > 3 { r.seconds = ms(w[3].hasSuffix(",") ? w[3].dropLast() : w[3]) / 1000 }
            } else if t.hasPrefix("Requests/sec:"), w.count >= 2 {
                r.rps = Double(w[1]) ?? 0
            } else if t.hasPrefix("Non-2xx or 3xx responses:"), let n = Int(w.last ?? "") {
                r.non2xx = n
            } else if t.hasPrefix("Socket errors:") {
                r.socketErrors = String(t.dropFirst("Socket errors: ".count))
            } else if t.hasPrefix("50%"), w.count >= 2 {
                r.p50ms = ms(w[1])
            } else if t.hasPrefix("99%"), w.count >= 2 {
                r.p99ms = ms(w[1])
            }
        }
        return r
    }
}
