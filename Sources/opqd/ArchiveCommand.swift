import Digest
import Dispatch
import Grammar
import Locking
import OutboundHTTP
import QueueEngine

#if canImport(Glibc)
import Glibc
#endif

/// `opqd archive export|import --url URL --queue NAME [--token TOKEN] [--timeout S]`: the
/// operator's side of `GET`/`POST /v1/queues/{name}/archive`, with the outbound client the http
/// kind uses (no curl needed). Export writes the document to stdout; import reads it from stdin
/// and writes the server's answer (the id map) to stdout. Exit 0 on success, 1 when the server
/// refuses or does not answer (its problem's detail on stderr), 2 for a bad command line.
enum ArchiveCommand {
    /// The largest document read from stdin or from the server (a server's `--max-body` is at
    /// most 1 GiB, and so is the largest archive it makes or takes).
    static let maxDocumentBytes = 1 << 30

    struct Options {
        var export = true
        var url = ""
        var queue = ""
        var token: String?
        var timeout: Double = 60
    }

    static let usage = """
        usage: opqd archive export --url URL --queue NAME [--token TOKEN] [--timeout SECONDS] > archive.json
               opqd archive import --url URL --queue NAME [--token TOKEN] [--timeout SECONDS] < archive.json
          URL is the server's base URL (http://127.0.0.1:8080); TOKEN (or OPQD_TOKEN) is sent as
          Authorization: Bearer. Import restores into a queue that does not exist or is empty, and
          prints {"ids": {"old": "new"}, "droppedDependencies": [...], "queue": {...}}.
        """

    static func run(arguments: [String], environment: [String: String]) -> Int32 {
        if arguments.contains(where: { $0 == "--help" || $0 == "-h" }) {
            say(usage, to: 1)
            return 0
        }
        let options: Options
        do {
            options = try parse(arguments, environment: environment)
        } catch {
            say("opqd archive: \(error.text)\n\(usage)", to: 2)
            return 2
        }
        var body: [UInt8]? = nil
        if !options.export {
            guard let input = readAll(0, limit: maxDocumentBytes) else {
                say("opqd archive import: cannot read the archive from stdin (unreadable, or over \(maxDocumentBytes) bytes)", to: 2)
                return 1
            }
            guard !input.isEmpty else {
                say("opqd archive import: stdin is empty; give the archive document on stdin", to: 2)
                return 1
            }
            body = input
        }
        var headers: [(String, String)] = [("Accept", "application/json, application/problem+json")]
        if body != nil { headers.append(("Content-Type", "application/json")) }
        if let token = options.token { headers.append(("Authorization", "Bearer \(token)")) }
        if let body {
            // A repeat of the same import (its answer was lost: a timeout, a dropped
            // connection) gets the first answer and its id map, not 409 queue-not-empty.
            let hex = SHA256.hash(body).map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
            headers.append(("Idempotency-Key", "opqd-archive-import-" + hex))
        }
        let base = options.url.hasSuffix("/") ? String(options.url.dropLast()) : options.url
        let request = OutboundRequest(
            method: options.export ? "GET" : "POST", url: "\(base)/v1/queues/\(options.queue)/archive", headers: headers, body: body,
            timeout: options.timeout, connectTimeout: min(10, options.timeout), maxResponseBytes: maxDocumentBytes, maxHeaderBytes: 64 * 1024)
        let outcome = Lock<Result<OutboundResponse, OutboundError>?>(nil)
        let answered = DispatchSemaphore(value: 0)
        let client = OutboundHTTPClient()
        client.send(request) { result in
            outcome.withLock { $0 = result }
            answered.signal()
        }
        let what = options.export ? "export" : "import"
        // The client's deadline ends the exchange; this only bounds a client that never calls back.
        guard answered.wait(timeout: .now() + options.timeout + 5) == .success, let result = outcome.value else {
            say("opqd archive \(what): no answer from \(options.url) within \(options.timeout) s", to: 2)
            return 1
        }
        switch result {
        case let .failure(error):
            say("opqd archive \(what): \(error.type): \(error.detail)", to: 2)
            return 1
        case let .success(response) where response.truncated:
            say("opqd archive \(what): the answer is over \(maxDocumentBytes) bytes", to: 2)
            return 1
        case let .success(response) where (200..<300).contains(response.status):
            var out = response.body
            if out.last != UInt8(ascii: "\n") { out.append(UInt8(ascii: "\n")) }
            guard writeAll(1, out) else {
                say("opqd archive \(what): cannot write to stdout", to: 2)
                return 1
            }
            return 0
        case let .success(response):
            say("opqd archive \(what): the server answered \(response.status)\(reason(response))", to: 2)
            return 1
        }
    }

    struct UsageError: Error { let text: String }

    static func parse(_ arguments: [String], environment: [String: String]) throws(UsageError) -> Options {
        var options = Options()
        guard let verb = arguments.first else { throw UsageError(text: "say export or import") }
        switch verb {
        case "export": options.export = true
        case "import": options.export = false
        default: throw UsageError(text: "unknown command '\(verb)'; say export or import")
        }
        options.token = environment["OPQD_TOKEN"].flatMap { $0.isEmpty ? nil : $0 }
        var url: String? = nil
        var queue: String? = nil
        var i = 1
        while i < arguments.count {
            let arg = arguments[i]
            var flag = arg
            var value: String? = nil
            if let eq = arg.firstIndex(of: "="), arg.hasPrefix("--") {
                flag = String(arg[..<eq])
                value = String(arg[arg.index(after: eq)...])
            }
            guard ["--url", "--queue", "--token", "--timeout"].contains(flag) else { throw UsageError(text: "unknown option '\(arg)'") }
            if value == nil {
                guard i + 1 < arguments.count else { throw UsageError(text: "\(flag) needs a value") }
                value = arguments[i + 1]
                i += 1
            }
            let v = value ?? ""
            switch flag {
            case "--url": url = v
            case "--queue": queue = v
            case "--token":
                guard !v.isEmpty else { throw UsageError(text: "--token must not be empty") }
                options.token = v
            default:
                guard case let .success(s) = DecimalNumber.decimal(v, in: 0...3600), s > 0 else {
                    throw UsageError(text: "--timeout must be a number of seconds above 0 and at most 3600; got '\(v)'")
                }
                options.timeout = s
            }
            i += 1
        }
        guard let url else { throw UsageError(text: "--url is required (the server's base URL, e.g. http://127.0.0.1:8080)") }
        if case let .failure(e) = OutboundURL.check(url) { throw UsageError(text: "--url \(e.detail)") }
        options.url = url
        guard let queue else { throw UsageError(text: "--queue is required") }
        // The queue's name goes into the path as it is: only names a queue can have.
        let ok =
            !queue.isEmpty && queue.utf8.count <= 64
            && queue.utf8.allSatisfy { c in
                (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c == 46 || c == 95 || c == 45
            }
        guard ok else { throw UsageError(text: "--queue must match [A-Za-z0-9._-]{1,64}; got '\(queue)'") }
        options.queue = queue
        return options
    }

    /// `: <detail>` of a problem+json body (or its title), else the start of the body.
    static func reason(_ response: OutboundResponse) -> String {
        if let body = try? JSONValue.parse(response.body) {
            for key in ["detail", "title"] {
                if case let .string(text)? = body[key], !text.isEmpty { return ": \(text)" }
            }
        }
        let text = String(decoding: response.body.prefix(300), as: UTF8.self)
        return text.isEmpty ? "" : ": \(text)"
    }

    /// Everything readable from `fd`, or nil on a read error or past `limit` bytes.
    static func readAll(_ fd: Int32, limit: Int) -> [UInt8]? {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                return nil
            }
            if n == 0 { return out }
            guard out.count <= limit - n else { return nil }
            out.append(contentsOf: chunk[0..<n])
        }
    }

    /// Writes all of `bytes` to `fd`; false on an error.
    static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress?.advanced(by: offset), bytes.count - offset) }
            if n < 0 {
                if errno == EINTR { continue }
                return false
            }
            offset += n
        }
        return true
    }

    static func say(_ line: String, to fd: Int32) {
        _ = writeAll(fd, Array((line + "\n").utf8))
    }
}
