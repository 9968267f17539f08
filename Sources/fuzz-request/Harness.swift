import CSystem
import Glibc
import Grammar
import MicroHTTP
import OpqdApp
import QueueAPI
import QueueEngine

/// Runs fuzz inputs through opqd's request path in-process, one application per token setting,
/// state carried from input to input (bounded: both are rebuilt every `rebuildEvery` inputs).
///
/// Input format (everything after the first byte is raw HTTP):
/// - byte 0 picks the application: `T` the one with `--token fuzz-token`, `O` the open one,
///   any other byte by its lowest bit (1: token);
/// - then up to 8 raw requests separated by a line `###`;
/// - `@ID@`, `@ID2@` and `@LEASE@` are replaced by the newest and second-newest operation id and
///   the newest lease token seen in an answer, so that inputs reach operations and leases
///   the server made up.
final class Harness {
    nonisolated(unsafe) static let shared = Harness()

    static let token = "fuzz-token"
    static let rebuildEvery = 10_000
    static let maxRequestsPerInput = 8
    /// Long polls (`timeout`, `wait`) are shortened to this, so waiting answers do not pile up;
    /// values outside the accepted range are passed as they are and still refused.
    static let longPollCap = 0.05

    private var open: OpqdApplication
    private var guarded: OpqdApplication
    private var inputs = 0
    private var nextRequestID: UInt64 = 1
    private var ids: [String] = ["op-0000000000000001", "op-0000000000000002"]
    private var lease = "none"
    private var pending: [(HTTPResponder, String)] = []
    private var streams: [HTTPStream] = []
    let checks = getenv("FUZZ_REQUEST_NO_CHECKS") == nil
    let networkIsolated: Bool

    private init() {
        networkIsolated = Self.isolateNetwork()
        open = Self.makeApp(token: nil)
        guarded = Self.makeApp(token: Self.token)
    }

    static func makeApp(token: String?) -> OpqdApplication {
        var arguments = ["--store", "memory", "--event-capacity", "512", "--log-level", "critical"]
        if let token { arguments += ["--token", token] }
        do {
            let configuration = try OpqdConfiguration.parse(arguments: arguments, environment: [:])
            return try buildApplication(configuration: configuration)
        } catch {
            fatalError("fuzz-request: cannot build the application: \(error)")
        }
    }

    /// A private network namespace (only a loopback that is down), so `http` operations and
    /// webhooks the fuzzer invents reach nothing. Needs root or user namespaces; without it,
    /// requests whose body could name a URL are skipped (see `mayReachNetwork`).
    static func isolateNetwork() -> Bool {
        if getenv("FUZZ_REQUEST_ALLOW_NETWORK") != nil { return true }
        // unshare(2) needs _GNU_SOURCE, so it comes from the CSystem target.
        if csystem_unshare_network(false) == 0 { return true }
        // An unprivileged user: a user namespace of its own first (the process is still single-threaded).
        if csystem_unshare_network(true) == 0 { return true }
        printError("fuzz-request: no private network namespace (\(String(cString: strerror(errno)))); requests whose body may name a URL are skipped")
        return false
    }

    // MARK: - one input

    func run(_ input: UnsafeBufferPointer<UInt8>) {
        inputs += 1
        if inputs % Self.rebuildEvery == 0 { rebuild() }
        guard let selector = input.first else { return }
        let useToken: Bool
        switch selector {
        case UInt8(ascii: "T"): useToken = true
        case UInt8(ascii: "O"): useToken = false
        default: useToken = selector & 1 == 1
        }
        let app = useToken ? guarded : open
        var count = 0
        for chunk in Self.split(input[1...]) {
            count += 1
            if count > Self.maxRequestsPerInput { break }
            let bytes = substitute(chunk)
            guard var raw = RawRequest(bytes[...], id: nextRequestID) else { continue }
            nextRequestID += 1
            if !networkIsolated && Self.mayReachNetwork(raw.request.body) { continue }
            raw.request = Self.shortenLongPolls(raw.request)
            drive(app.handleForTesting(raw.request, declaredBodyBytes: raw.declaredBodyBytes), raw.request)
        }
        sweep()
    }

    /// Requests separated by a line `###`.
    static func split(_ bytes: Slice<UnsafeBufferPointer<UInt8>>) -> [ArraySlice<UInt8>] {
        let all = Array(bytes)
        var parts: [ArraySlice<UInt8>] = []
        var start = 0
        var i = 0
        let marker: [UInt8] = Array("\n###".utf8)
        while i + marker.count <= all.count {
            if all[i] == 0x0A && all[i + 1] == 0x23 && all[i + 2] == 0x23 && all[i + 3] == 0x23 {
                var end = i + 4
                if end < all.count && all[end] == 0x0D { end += 1 }
                if end == all.count || all[end] == 0x0A {
                    parts.append(all[start...i])  // keeps the LF that ends the last line
                    start = min(end + 1, all.count)
                    i = start
                    continue
                }
            }
            i += 1
        }
        parts.append(all[start...])
        return parts
    }

    /// `@ID@`, `@ID2@`, `@LEASE@`.
    func substitute(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
        guard bytes.contains(UInt8(ascii: "@")) else { return Array(bytes) }
        let table: [([UInt8], [UInt8])] = [
            (Array("@ID@".utf8), Array(ids[ids.count - 1].utf8)),
            (Array("@ID2@".utf8), Array(ids[ids.count - 2].utf8)),
            (Array("@LEASE@".utf8), Array(lease.utf8)),
        ]
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count + 32)
        var i = bytes.startIndex
        outer: while i < bytes.endIndex {
            if bytes[i] == UInt8(ascii: "@") {
                for (name, value) in table where bytes[i...].starts(with: name) {
                    out.append(contentsOf: value)
                    i += name.count
                    continue outer
                }
            }
            out.append(bytes[i])
            i += 1
        }
        return out
    }

    static func shortenLongPolls(_ r: HTTPRequest) -> HTTPRequest {
        var query = r.query
        var changed = false
        // Each parameter's own maximum (`wait` 300 s, `timeout` 3600 s): only what the server
        // would take as a long wait is shortened; a value it refuses (`1e2`, `0x1p4`, `wait=301`)
        // reaches it as sent, to be refused there.
        for (key, maximum) in [("timeout", 3600.0), ("wait", 300.0)] {
            if let v = query[key], case let .success(d) = DecimalNumber.decimal(v, in: 0...maximum), d > longPollCap {
                query[key] = String(longPollCap)
                changed = true
            }
        }
        guard changed else { return r }
        return HTTPRequest(id: r.id, method: r.method, path: r.path, query: query, repeatedQueryNames: r.repeatedQueryNames, headers: r.headers, body: r.body)
    }

    /// Without a private network: a body that could spell a URL (`http`, any case, or a `\u`
    /// escape that could hide one).
    static func mayReachNetwork(_ body: [UInt8]) -> Bool {
        guard body.count >= 2 else { return false }
        for i in 0..<(body.count - 1) {
            if body[i] == UInt8(ascii: "\\") && body[i + 1] == UInt8(ascii: "u") { return true }
            if i + 4 <= body.count, body[i] | 0x20 == UInt8(ascii: "h"), body[i + 1] | 0x20 == UInt8(ascii: "t"),
                body[i + 2] | 0x20 == UInt8(ascii: "t"), body[i + 3] | 0x20 == UInt8(ascii: "p")
            {
                return true
            }
        }
        return false
    }

    // MARK: - results

    func drive(_ result: HTTPHandlerResult, _ request: HTTPRequest) {
        let what = "\(request.method) \(request.path)"
        switch result {
        case let .response(response):
            answered(response, what)
        case let .routed(_, inner):
            drive(inner, request)
        case let .deferred(body):
            let responder = HTTPResponder.detached()
            body(responder)
            if let response = responder.detachedResponse {
                answered(response, what)
            } else {
                pending.append((responder, what))
                if pending.count > 256 { pending.removeFirst(pending.count - 256) }
            }
        case let .stream(status, headers, start):
            if checks { Checks.stream(status: status, headers: headers, what) }
            let stream = HTTPStream.detached()
            start(stream)
            if checks { Checks.sse(stream.takeDetachedBytes(), what) } else { _ = stream.takeDetachedBytes() }
            if stream.isClosed { return }
            streams.append(stream)
            if streams.count > 4 { streams.removeFirst().close() }
        }
    }

    func answered(_ response: HTTPResponse, _ what: String) {
        if checks { Checks.response(response, what) }
        harvest(response)
    }

    /// Long polls answered meanwhile; bytes streams got meanwhile.
    func sweep() {
        if !pending.isEmpty {
            var still: [(HTTPResponder, String)] = []
            for (responder, what) in pending {
                if let response = responder.detachedResponse { answered(response, what) } else { still.append((responder, what)) }
            }
            pending = still
        }
        for stream in streams {
            let bytes = stream.takeDetachedBytes()
            if checks { Checks.sse(bytes, "stream") }
        }
        streams.removeAll { $0.isClosed }
    }

    /// Remembers operation ids and lease tokens from 2xx answers.
    func harvest(_ response: HTTPResponse) {
        guard (200..<300).contains(response.status), response.body.count > 20 else { return }
        let body = response.body
        let idKey = Array(#""id":"op-"#.utf8)
        let tokenKey = Array(#""token":""#.utf8)
        var i = 0
        var found = 0
        while i + idKey.count < body.count && found < 4 {
            if body[i] == UInt8(ascii: "\"") {
                if body[i...].starts(with: idKey), i + 6 + 19 <= body.count {
                    let id = String(decoding: body[(i + 6)..<(i + 6 + 19)], as: UTF8.self)
                    if id != ids[ids.count - 1] { ids = [ids[ids.count - 1], id] }
                    found += 1
                } else if body[i...].starts(with: tokenKey) {
                    let start = i + tokenKey.count
                    if let end = body[start...].prefix(200).firstIndex(of: UInt8(ascii: "\"")) {
                        lease = String(decoding: body[start..<end], as: UTF8.self)
                    }
                }
            }
            i += 1
        }
    }

    // MARK: - bounds

    /// New applications; the old ones are emptied first (queues force-deleted, which cancels
    /// their operations and stops their timers' work; streams closed). Whether an
    /// `OpqdApplication` is freed once dropped has not been checked since the router stopped
    /// referring back to it (an older reference cycle made each rebuild leak ~2 MB, mostly its
    /// idempotency cache and event ring): hence rebuilds stay rare and the old state is emptied
    /// first.
    func rebuild() {
        for app in [open, guarded] {
            for q in app.engine.queues() { try? app.engine.deleteQueue(q.name, force: true) }
        }
        for s in streams { s.close() }
        streams = []
        pending = []
        open = Self.makeApp(token: nil)
        guarded = Self.makeApp(token: Self.token)
    }
}

/// A line on standard error.
func printError(_ message: String) {
    let line = Array((message + "\n").utf8)
    _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}
