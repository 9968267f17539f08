import Foundation
import Locking
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The real release-like `opqd` binary with its own data and log directories (removed at deinit
/// unless `keepData`). Every wait has a timeout: a hung server fails a test instead of blocking it.
final class Opqd: @unchecked Sendable {  // used from one test at a time
    let data: String
    let logs: String
    let arguments: [String]
    private(set) var process: ServerProcess
    private var generation = 0
    private let ownsData: Bool

    /// Starts `opqd` with `arguments` (after `--host 127.0.0.1 --port 0 --data … --log-level warning`),
    /// with `environment` set over this process's (for the first start only).
    init(_ arguments: [String] = [], data: String? = nil, environment: [String: String] = [:]) throws {
        self.arguments = arguments
        if let data { self.data = data; ownsData = false } else { self.data = try makeTemporaryDirectory(prefix: "opqd-hostile-data"); ownsData = true }
        logs = try makeTemporaryDirectory(prefix: "opqd-hostile-logs")
        process = try ServerProcess(
            binary: try OpqdBinary.locate(), data: self.data, logPath: logs + "/opqd-0.log", extraArguments: arguments, environment: environment)
    }

    deinit {
        process.killNow()
        if ownsData { try? FileManager.default.removeItem(atPath: data) }
        try? FileManager.default.removeItem(atPath: logs)
    }

    var port: Int { process.port }
    var pid: pid_t { process.pid }

    /// kill -9 and reap.
    func killNine() { process.killNow() }

    /// Starts a new process on the same data directory (after `killNine`).
    func restart() throws {
        generation += 1
        process = try ServerProcess(binary: try OpqdBinary.locate(), data: data, logPath: logs + "/opqd-\(generation).log", extraArguments: arguments)
    }

    func logTail() -> String { process.logTail() }

    /// One request on a fresh connection with `headers` (add `Authorization` yourself); never throws.
    func exchange(_ method: String, _ target: String, json: String? = nil, headers: [String: String] = [:], timeout: Double = 10) -> HTTPOutcome {
        HTTPExchange.run(port: port, method: method, path: target, body: json.map { Array($0.utf8) }, headers: headers, timeout: timeout)
    }

    /// One request; throws unless a complete answer came.
    func request(_ method: String, _ target: String, json: String? = nil, token: String? = nil, headers: [String: String] = [:], timeout: Double = 10) throws
        -> TestResponse
    {
        var h = headers
        if let token { h["Authorization"] = "Bearer \(token)" }
        let outcome = exchange(method, target, json: json, headers: h, timeout: timeout)
        guard let r = outcome.response else { throw Unexpected("\(method) \(target): \(outcome)\n--- log ---\n\(logTail())") }
        return r
    }

    /// Raw bytes out on a fresh connection, then one response in (or nil with what happened).
    func raw(_ bytes: [UInt8], timeout: Double = 10) -> Result<TestResponse, TestClientError> {
        do {
            let c = try RawConnection(port: port, timeout: timeout)
            defer { c.close() }
            c.send(bytes)
            return .success(try c.readResponse(requestMethod: String(decoding: bytes.prefix(4), as: UTF8.self).hasPrefix("HEAD") ? "HEAD" : "GET"))
        } catch let e as TestClientError {
            return .failure(e)
        } catch {
            return .failure(TestClientError("\(error)"))
        }
    }

    func raw(_ text: String, timeout: Double = 10) -> Result<TestResponse, TestClientError> { raw(Array(text.utf8), timeout: timeout) }

    /// The process has not exited and `/healthz` answers 200.
    func isAlive() -> (Bool, String) {
        if let exit = process.waitForExit(timeout: 0) { return (false, "the process \(exit)\n--- log ---\n\(logTail())") }
        guard Glibc.kill(pid, 0) == 0 else { return (false, "pid \(pid) is gone") }
        // A give-up limit only (a hung server never answers): generous, since the hostile
        // suites run beside floods and a loaded machine can hold a healthy answer for seconds.
        let outcome = exchange("GET", "/healthz", timeout: 15)
        guard outcome.status == 200 else {
            let exit = process.waitForExit(timeout: 0.5)
            return (false, "/healthz: \(outcome); process: \(exit?.description ?? "running")\n--- log ---\n\(logTail())")
        }
        return (true, "")
    }

    /// Records an issue unless the process is alive and /healthz answers 200.
    func expectAlive(_ after: String, sourceLocation: SourceLocation = #_sourceLocation) {
        let (alive, why) = isAlive()
        if !alive { Issue.record("opqd is not alive after \(after): \(why)", sourceLocation: sourceLocation) }
    }

    /// VmRSS and VmHWM of the server in KiB, from /proc/<pid>/status.
    func memory() -> (rss: Int, hwm: Int) {
        let text = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        func field(_ name: String) -> Int {
            guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix(name + ":") }) else { return -1 }
            return Int(line.split(separator: " ").dropFirst().first { Int($0) != nil } ?? "") ?? -1
        }
        return (field("VmRSS"), field("VmHWM"))
    }
}

extension TestResponse {
    /// The problem type's slug (`…/problems/<slug>`), if this is a problem.
    var problemSlug: String? {
        guard let type = string("type") else { return nil }
        return type.split(separator: "/").last.map(String.init)
    }
}

/// Checks an RFC 9457 answer: status, media type, members and (optionally) the slug.
func expectProblem(_ r: TestResponse, _ status: Int, slug: String? = nil, _ what: String = "", sourceLocation: SourceLocation = #_sourceLocation) {
    guard r.status == status else {
        Issue.record("\(what): expected a \(status) problem\(slug.map { " (\($0))" } ?? ""), got:\n\(r)", sourceLocation: sourceLocation)
        return
    }
    #expect(r.mediaType == "application/problem+json", "\(what): Content-Type \(r.headers["content-type"] ?? "none")", sourceLocation: sourceLocation)
    #expect(r.int("status") == status, "\(what): problem status member: \(r.text.prefix(300))", sourceLocation: sourceLocation)
    #expect(r.string("title")?.isEmpty == false, "\(what): problem title: \(r.text.prefix(300))", sourceLocation: sourceLocation)
    #expect(r.string("detail")?.isEmpty == false, "\(what): problem detail: \(r.text.prefix(300))", sourceLocation: sourceLocation)
    if let slug {
        #expect(r.problemSlug == slug, "\(what): problem type should end in /\(slug): \(r.string("type") ?? "none")", sourceLocation: sourceLocation)
    }
}

func jsonString(_ s: String) -> String {
    String(decoding: try! JSONSerialization.data(withJSONObject: [s], options: [.fragmentsAllowed]), as: UTF8.self).dropFirst().dropLast().description
}

/// Runs `count` jobs on `threads` threads (blocking work off the cooperative pool); returns
/// when all are done. `job(i)` for i in 0..<count.
func parallel(_ count: Int, threads: Int, _ job: @escaping @Sendable (_ thread: Int, _ index: Int) -> Void) async throws {
    try await withThrowingTaskGroup(of: Void.self) { group in
        for t in 0..<threads {
            group.addTask {
                try await onThread {
                    var i = t
                    while i < count { job(t, i); i += threads }
                }
            }
        }
        try await group.waitForAll()
    }
}

/// Splits the top-level elements of the JSON array that is the value of `"key":[` in `body`,
/// returning each element's exact bytes.
func rawArrayElements(_ body: [UInt8], key: String) -> [[UInt8]] {
    let needle = Array("\"\(key)\":[".utf8)
    guard body.count >= needle.count,
        let start = (0...(body.count - needle.count)).first(where: { Array(body[$0..<($0 + needle.count)]) == needle })
    else { return [] }
    var out: [[UInt8]] = []
    var i = start + needle.count
    var depth = 0, inString = false, escaped = false, elementStart = -1
    while i < body.count {
        let b = body[i]
        if inString {
            if escaped { escaped = false } else if b == UInt8(ascii: "\\") { escaped = true } else if b == UInt8(ascii: "\"") { inString = false }
        } else {
            switch b {
            case UInt8(ascii: "\""): inString = true
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                if depth == 0 { elementStart = i }
                depth += 1
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                if depth == 0 { return out }  // the end of the array
                depth -= 1
                if depth == 0, elementStart >= 0 { out.append(Array(body[elementStart...i])); elementStart = -1 }
            default: break
            }
        }
        i += 1
    }
    return out
}

/// A tiny hostile HTTP target on 127.0.0.1 (the kit's `RawServer`): every connection is
/// answered by `behaviour(path)`.
final class HostileTarget: Sendable {
    enum Behaviour: Sendable {
        /// Sends these bytes, then closes.
        case raw(String)
        /// Sends the head, then `piece` again and again (every `interval` seconds) until the
        /// peer goes away or `seconds` pass.
        case endless(head: String, piece: Int, interval: Double, seconds: Double)
        /// Reads the request and never answers (until the peer goes or `seconds` pass); how
        /// long the peer held on is kept (``held``).
        case hang(seconds: Double)
    }
    private let server: RawServer
    private let state: Lock<(requests: [String], bytesSent: Int, held: [(path: String, seconds: Double)])>

    init(_ behaviour: @escaping @Sendable (String) -> Behaviour) throws {
        let state = Lock<(requests: [String], bytesSent: Int, held: [(path: String, seconds: Double)])>(([], 0, []))
        self.state = state
        server = try RawServer { c, server in
            guard let request = try? c.readRequest(body: false) else { return }
            state.withLock { $0.requests.append("\(request.method) \(request.path)") }
            switch behaviour(request.path) {
            case let .raw(text):
                c.send(text)
                state.withLock { $0.bytesSent += text.utf8.count }
                usleep(50_000)
            case let .endless(head, piece, interval, seconds):
                guard c.send(head) else { return }
                let bytes = [UInt8](repeating: UInt8(ascii: "x"), count: piece)
                let deadline = Date().addingTimeInterval(seconds)
                while Date() < deadline, !server.isStopping {
                    guard c.send(bytes) else { return }
                    state.withLock { $0.bytesSent += piece }
                    if interval > 0 { usleep(useconds_t(interval * 1e6)) }
                }
            case let .hang(seconds):
                let read = monotonicSeconds()
                let deadline = Date().addingTimeInterval(seconds)
                while Date() < deadline, !server.isStopping {
                    let (_, eof) = c.readAvailable(milliseconds: 100)
                    if eof {
                        state.withLock { $0.held.append((request.path, monotonicSeconds() - read)) }
                        return
                    }
                }
            }
        }
    }

    deinit { server.stop() }

    var port: Int { server.port }
    func url(_ path: String) -> String { server.url(path) }
    /// The request lines' method and target, in order.
    var requests: [String] { state.withLock { $0.requests } }
    var bytesSent: Int { state.withLock { $0.bytesSent } }
    /// For each `.hang` request whose peer went away: seconds from reading its request to the
    /// peer closing the connection (the client's own wait, without its process start-up).
    var held: [(path: String, seconds: Double)] { state.withLock { $0.held } }

    func close() { server.stop() }
}

/// The route table of API.md ("Queues", "Operations", "Kinds", "Observation") plus the server's
/// own paths, with placeholders `{name}`, `{id}` and `{observer}` and a plausible body.
struct Route: Sendable, CustomStringConvertible {
    let method: String
    let path: String
    let body: String?
    var description: String { "\(method) \(path)" }
    var isRead: Bool { method == "GET" || method == "HEAD" }

    func target(name: String, id: String, observer: String) -> String {
        path.replacingOccurrences(of: "{name}", with: name).replacingOccurrences(of: "{id}", with: id).replacingOccurrences(of: "{observer}", with: observer)
    }

    static let all: [Route] = [
        Route(method: "GET", path: "/metrics", body: nil),
        Route(method: "GET", path: "/openapi.yaml", body: nil),
        Route(method: "POST", path: "/v1/queues", body: #"{"name":"created-by-attacker"}"#),
        Route(method: "GET", path: "/v1/queues", body: nil),
        Route(method: "GET", path: "/v1/queues/{name}", body: nil),
        Route(method: "PATCH", path: "/v1/queues/{name}", body: #"{"maxConcurrentOperationCount":7}"#),
        Route(method: "POST", path: "/v1/queues/{name}/suspend", body: nil),
        Route(method: "POST", path: "/v1/queues/{name}/resume", body: nil),
        Route(method: "POST", path: "/v1/queues/{name}/cancel-all", body: nil),
        Route(method: "GET", path: "/v1/queues/{name}/wait?timeout=0", body: nil),
        Route(method: "POST", path: "/v1/queues/{name}/barrier", body: nil),
        Route(method: "GET", path: "/v1/queues/{name}/archive", body: nil),
        Route(method: "POST", path: "/v1/queues/{name}/archive", body: #"{"format":"opqd-archive/1","queue":{"name":"{name}"},"operations":[]}"#),
        Route(method: "POST", path: "/v1/queues/{name}/operations", body: #"{"kind":"delay","spec":{"seconds":1}}"#),
        Route(method: "GET", path: "/v1/queues/{name}/operations", body: nil),
        Route(method: "POST", path: "/v1/queues/{name}/operations:cancel", body: #"{}"#),
        Route(method: "POST", path: "/v1/queues/{name}/claim?wait=0", body: nil),
        Route(method: "POST", path: "/v1/queues/{name}/observers", body: #"{"url":"http://127.0.0.1:9/hook"}"#),
        Route(method: "GET", path: "/v1/queues/{name}/observers", body: nil),
        Route(method: "GET", path: "/v1/queues/{name}/observers/{observer}", body: nil),
        Route(method: "DELETE", path: "/v1/queues/{name}/observers/{observer}", body: nil),
        Route(method: "POST", path: "/v1/limiters", body: #"{"name":"made-by-attacker","concurrency":1}"#),
        Route(method: "GET", path: "/v1/limiters", body: nil),
        Route(method: "GET", path: "/v1/limiters/{name}", body: nil),
        Route(method: "PATCH", path: "/v1/limiters/{name}", body: #"{"concurrency":9}"#),
        Route(method: "DELETE", path: "/v1/limiters/{name}", body: nil),
        Route(method: "GET", path: "/v1/limiters/{name}/keys", body: nil),
        Route(method: "GET", path: "/v1/hosts", body: nil),
        Route(
            method: "POST", path: "/v1/queues/{name}/schedules", body: #"{"name":"s-by-attacker","every":60,"operation":{"kind":"delay","spec":{"seconds":1}}}"#
        ),
        Route(method: "GET", path: "/v1/queues/{name}/schedules", body: nil),
        Route(method: "GET", path: "/v1/schedules", body: nil),
        Route(method: "GET", path: "/v1/hosts/attacker.example:443", body: nil),
        Route(method: "PATCH", path: "/v1/hosts/attacker.example:443", body: #"{"breaker":"open","reason":"held by an attacker"}"#),
        Route(method: "GET", path: "/v1/operations/{id}", body: nil),
        Route(method: "PATCH", path: "/v1/operations/{id}", body: #"{"queuePriority":"veryHigh"}"#),
        Route(method: "POST", path: "/v1/operations/{id}/cancel", body: nil),
        Route(method: "POST", path: "/v1/operations/{id}/pause", body: nil),
        Route(method: "POST", path: "/v1/operations/{id}/resume", body: nil),
        Route(method: "GET", path: "/v1/operations/{id}/events", body: nil),
        Route(method: "GET", path: "/v1/operations/{id}/wait?timeout=0", body: nil),
        Route(method: "POST", path: "/v1/operations/{id}/copy", body: #"{}"#),
        Route(method: "POST", path: "/v1/operations:batch", body: #"{"operations":[{"queue":"{name}","kind":"delay","spec":{"seconds":1}}]}"#),
        Route(method: "POST", path: "/v1/operations:finish", body: #"{"finishes":[{"id":"{id}","leaseToken":"x","result":{}}]}"#),
        Route(method: "POST", path: "/v1/operations/{id}/heartbeat", body: #"{"leaseToken":"x"}"#),
        Route(method: "POST", path: "/v1/operations/{id}/progress", body: #"{"leaseToken":"x","completed":1,"total":2}"#),
        Route(method: "POST", path: "/v1/operations/{id}/finish", body: #"{"leaseToken":"x","result":{}}"#),
        Route(method: "POST", path: "/v1/operations/{id}/observers", body: #"{"url":"http://127.0.0.1:9/hook"}"#),
        Route(method: "GET", path: "/v1/operations/{id}/observers", body: nil),
        Route(method: "GET", path: "/v1/operations/{id}/observers/{observer}", body: nil),
        Route(method: "DELETE", path: "/v1/operations/{id}/observers/{observer}", body: nil),
        Route(method: "GET", path: "/v1/workers", body: nil),
        Route(method: "GET", path: "/v1/access", body: nil),
        Route(method: "GET", path: "/v1/cluster", body: nil),
        Route(method: "GET", path: "/v1/events?after=0", body: nil),
        Route(method: "GET", path: "/v1/events/stream?after=0", body: nil),
        Route(method: "DELETE", path: "/v1/queues/{name}", body: nil),
        // Paths no route matches: 404 only after authentication.
        Route(method: "GET", path: "/nope", body: nil),
        // Next to the open dashboard page: the page's files are open, nothing else near them.
        Route(method: "GET", path: "/index.html", body: nil),
        Route(method: "GET", path: "/dashboard.js.map", body: nil),
        Route(method: "GET", path: "//", body: nil),
        Route(method: "GET", path: "/v1", body: nil),
        Route(method: "GET", path: "/v1/", body: nil),
        Route(method: "GET", path: "/v1/nope", body: nil),
        Route(method: "POST", path: "/v1/nope", body: #"{}"#),
        Route(method: "GET", path: "/v1/queues/{name}/nope", body: nil),
        Route(method: "GET", path: "/metrics/", body: nil),
        Route(method: "GET", path: "/healthz/x", body: nil),
        Route(method: "POST", path: "/healthz", body: #"{}"#),
        Route(method: "DELETE", path: "/readyz", body: nil),
        Route(method: "PUT", path: "/v1/queues", body: #"{"name":"put-by-attacker"}"#),
        Route(method: "OPTIONS", path: "/v1/queues", body: nil),
        Route(method: "HEAD", path: "/v1/queues", body: nil),
        Route(method: "HEAD", path: "/metrics", body: nil),
    ]
}

/// Runs every job of a task on a fresh thread of its own, so blocking sockets never tie up the
/// cooperative pool, while the task (and with it the current test, a task-local) stays the
/// same: issues recorded inside `blocking` belong to the test that recorded them. (A plain
/// `Thread` would lose the test: Swift Testing reports such issues as «unknown» and the test
/// as passed.)
final class ThreadPerJobExecutor: TaskExecutor, @unchecked Sendable {
    static let shared = ThreadPerJobExecutor()
    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        let thread = Thread { job.runSynchronously(on: executor) }
        thread.stackSize = 8 << 20
        thread.start()
    }
}

/// Runs blocking `work` off the cooperative pool, inside the calling test.
func blocking<T: Sendable>(_ work: () throws -> T) async throws -> T {
    try await withTaskExecutorPreference(ThreadPerJobExecutor.shared) { try work() }
}
