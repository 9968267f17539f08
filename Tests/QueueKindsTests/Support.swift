import Dispatch
import Foundation
import Locking
import MicroHTTP
import QueueEngine
import QueueKinds
import Synchronization
// The kit (Locked, waitUntil, eventually, temporary directories) for every file of this target.
@_exported import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Every kind test runs in this one serialized suite: they measure latencies, count file
/// descriptors and look for zombie children of the test process, which parallel tests would
/// disturb.
@Suite(.serialized) struct KindsTests {}

// MARK: - small shared state

/// Seconds since an arbitrary fixed point (monotonic).
func now() -> Double { monotonicSeconds() }

// MARK: - the engine

/// A real engine with the standard kinds, one queue and helpers to run operations.
struct Harness {
    let engine: QueueEngine
    let queue = "q"

    init(allow: [String] = [], maxCommands: Int = 16) throws {
        engine = QueueEngine(kinds: standardKinds(KindsConfiguration(allowCommands: allow, maxCommands: maxCommands)))
        try engine.createQueue(name: queue, maxConcurrentOperationCount: 8)
    }

    func add(_ kind: String, _ spec: String, timeout: Double? = nil) throws -> OperationID {
        try engine.addOperationID(
            to: queue,
            OperationRequest(
                kind: kind, spec: try JSONValue.parse(spec),
                options: OperationOptions(timeout: timeout)))
    }

    /// Waits until `id` is finished and returns it; records an issue if it does not finish.
    @discardableResult
    func wait(_ id: OperationID, timeout: Double = 10) throws -> OperationSnapshot {
        let finished = waitUntil(timeout: timeout) { (try? engine.operation(id).isFinished) ?? false }
        #expect(finished, "operation \(id) did not finish within \(timeout) s")
        return try engine.operation(id)
    }

    func state(_ id: OperationID) throws -> OperationState { try engine.operation(id).state }

    /// Runs one operation to its end.
    func run(_ kind: String, _ spec: String, timeout: Double = 10) throws -> OperationSnapshot {
        try wait(try add(kind, spec), timeout: timeout)
    }

    /// The field an invalid spec is refused for, or nil when it is accepted.
    func refusal(_ kind: String, _ spec: String) throws -> String? {
        do {
            _ = try add(kind, spec)
            return nil
        } catch let EngineError.invalidArgument(field, _) {
            return field
        } catch let EngineError.notPermitted(field, _, _) {
            return field
        }
    }
}

extension OperationSnapshot {
    var errorType: String? {
        if case let .string(t)? = error?["type"] { return t }
        return nil
    }
    var errorData: JSONValue? { error?["data"] }
}

extension JSONValue {
    var int: Int? { if case let .number(n) = self { return Int(n) }; return nil }
    var string: String? { if case let .string(s) = self { return s }; return nil }
    var bool: Bool? { if case let .bool(b) = self { return b }; return nil }
}

// MARK: - processes

/// Children of the test process: pid, state letter and argv.
func childProcesses(of parent: pid_t = getpid()) -> [(pid: pid_t, state: Character, argv: [String])] {
    let me = parent
    var out: [(pid_t, Character, [String])] = []
    guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return [] }
    for entry in entries {
        guard let pid = pid_t(entry), let stat = procStat(pid), stat.ppid == me else { continue }
        let cmdline = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline"))) ?? Data()
        let argv = cmdline.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        out.append((pid, stat.state, argv))
    }
    return out
}

/// Fields of /proc/PID/stat: state, parent, and CPU time (utime + stime, clock ticks).
func procStat(_ pid: pid_t) -> (state: Character, ppid: pid_t, cpu: Int)? {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = text.lastIndex(of: ")")
    else { return nil }
    let f = text[text.index(close, offsetBy: 2)...].split(separator: " ")
    guard f.count > 13, let ppid = pid_t(f[1]), let utime = Int(f[11]), let stime = Int(f[12]) else { return nil }
    return (f[0].first!, ppid, utime + stime)
}

/// Waits for the child of this process running exactly `argv` and returns its pid.
func child(running argv: [String], timeout: Double = 5) -> pid_t? {
    var found: pid_t?
    waitUntil(timeout: timeout) {
        found = childProcesses().first { $0.argv == argv && $0.state != "Z" }?.pid
        return found != nil
    }
    return found
}

/// Open file descriptors of this process.
func openDescriptors() -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []).compactMap { name in
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(name)") else { return nil }
        return "\(name) -> \(target)"
    }
}

// MARK: - an HTTP target

/// An HTTP target on 127.0.0.1 served by MicroHTTP. Routes: `/ok`, `/status/N`, `/slow` (2 s,
/// deferred), `/large` (1 MiB), `/binary`, `/redirect` (→ `/ok`), `/v6` (→ `//[::1]/`), `/loop`
/// (→ itself), `/to-file` (→ `file:///etc/passwd`), `/echo` (the request body back),
/// `/throttle/<status>/<Retry-After>`, `/twice/<status>/<Retry-After>/<Retry-After>` (values
/// percent-encoded). It counts requests by path.
final class TargetServer: Sendable {
    let port: UInt16
    private let server: HTTPServer
    private let counts: Locked<[String: Int]>

    var base: String { "http://127.0.0.1:\(port)" }
    func count(_ path: String) -> Int { counts.value[path] ?? 0 }

    init() throws {
        let counts = Locked<[String: Int]>([:])
        self.counts = counts
        server = HTTPServer(configuration: HTTPServerConfiguration(host: "127.0.0.1", port: 0, threads: 2, maxBodyBytes: 4 << 20)) { request in
            counts.withLock { $0[request.path, default: 0] += 1 }
            return TargetServer.answer(request)
        }
        try server.start()
        port = UInt16(server.port)
    }

    /// Stops the server; a pending `/slow` is answered 503 at once.
    func stop() { server.shutdown(timeout: .seconds(2)) }

    private static func answer(_ request: HTTPRequest) -> HTTPHandlerResult {
        let path = request.path
        var status = 200
        var headers: [(String, String)] = [("Content-Type", "text/plain")]
        var body: [UInt8] = Array("hello".utf8)
        switch path {
        case "/ok":
            headers.append(("X-Test", "yes"))
        case "/slow":
            return .deferred { responder in
                DispatchQueue.global().asyncAfter(deadline: .now() + 2) {
                    responder.respond(HTTPResponse(status: 200, headers: [("Content-Type", "text/plain")], body: Array("slow".utf8)))
                }
            }
        case "/large":
            body = (0..<(1 << 20)).map { UInt8(ascii: "a") + UInt8($0 % 26) }
        case "/binary":
            body = (0..<1000).map { _ in 0xFF }
            headers = [("Content-Type", "application/octet-stream")]
        case "/redirect":
            status = 302
            headers.append(("Location", "/ok"))
            body = []
        case "/v6", "/loop", "/to-file":
            status = path == "/loop" ? 301 : 302
            headers.append(("Location", path == "/v6" ? "//[::1]/" : path == "/loop" ? "/loop" : "file:///etc/passwd"))
            body = []
        case "/echo":
            body = request.body
            headers.append(("X-Got-Method", request.method))
            headers.append(("X-Got-Content-Type", request.header("content-type") ?? "none"))
        default:
            // `/throttle/429/<Retry-After>` and `/throttle/503/<Retry-After>` (percent-encoded).
            // `/twice/<status>/<Retry-After>/<Retry-After>`: the field twice.
            let segments = path.split(separator: "/", omittingEmptySubsequences: false)
            if path.hasPrefix("/throttle/"), path.count > 14, let s = Int(path.dropFirst(10).prefix(3)) {
                status = s
                let value = String(path.dropFirst(14)).removingPercentEncoding ?? ""
                headers.append(("Retry-After", value))
                body = Array("slow down".utf8)
            } else if segments.count == 5, segments[1] == "twice", let s = Int(segments[2]) {
                status = s
                headers.append(("Retry-After", segments[3].removingPercentEncoding ?? ""))
                headers.append(("retry-after", segments[4].removingPercentEncoding ?? ""))
                body = Array("slow down".utf8)
            } else if path.hasPrefix("/status/"), let s = Int(path.dropFirst(8)) {
                status = s
                body = Array("status \(s)".utf8)
            } else {
                status = 404
                body = Array("no route".utf8)
            }
        }
        return .response(HTTPResponse(status: status, headers: headers, body: body))
    }
}
