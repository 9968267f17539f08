import Foundation
import OpqdApp
import QueueAPI
// Tests that use the live server get the whole kit with it.
@_exported import TestKit

#if canImport(Glibc)
import Glibc
#endif

/// Builds the application on 127.0.0.1 with port 0, starts it, runs `body` against it, and
/// shuts it down on every path (return or throw).
///
/// Each server gets a fresh data directory of its own (removed afterwards), so servers running
/// in parallel never share a store. A `configure` that sets `data` itself keeps that directory.
public func withLiveServer<T>(
    _ configure: (inout OpqdConfiguration) -> Void = { _ in },
    _ body: (LiveServer) async throws -> T
) async throws -> T {
    let scratch = try makeTemporaryDirectory(prefix: "opqd-live")
    defer { try? FileManager.default.removeItem(atPath: scratch) }
    var configuration = OpqdConfiguration()
    configuration.threads = 2
    configuration.logLevel = .error
    configuration.data = scratch
    configure(&configuration)
    configuration.host = "127.0.0.1"
    configuration.port = 0
    let application = try buildApplication(configuration: configuration)
    do {
        try application.start()
    } catch {
        try? await onThread { application.shutdown() }
        throw error
    }
    let server = LiveServer(application: application)
    do {
        let result = try await body(server)
        try await onThread { application.shutdown() }
        return result
    } catch {
        try? await onThread { application.shutdown() }
        throw error
    }
}

/// A running opqd and a small raw-socket HTTP/1.1 client for it.
public struct LiveServer: Sendable {
    public let application: OpqdApplication
    /// The bound port.
    public let port: Int
    /// `http://127.0.0.1:<port>`.
    public let baseURL: URL
    /// Seconds any one request may take before the client gives up.
    public var timeout: Double = 10

    init(application: OpqdApplication) {
        self.application = application
        self.port = application.port
        self.baseURL = URL(string: "http://127.0.0.1:\(application.port)")!
    }

    /// One request on a fresh connection (`Connection: close`); `json` is sent as the body with
    /// `Content-Type: application/json`.
    public func request(_ method: String, _ path: String, json: String? = nil, headers: [String: String] = [:]) async throws -> TestResponse {
        var headers = headers
        if json != nil, !headers.keys.contains(where: { $0.lowercased() == "content-type" }) {
            headers["Content-Type"] = "application/json"
        }
        return try await request(method, path, body: json.map { Array($0.utf8) }, headers: headers)
    }

    /// One request with raw body bytes (a `Content-Length` is sent whenever `body` is not nil).
    public func request(_ method: String, _ path: String, body: [UInt8]?, headers: [String: String] = [:]) async throws -> TestResponse {
        let (port, timeout) = (self.port, self.timeout)
        return try await onThread {
            let connection = try RawConnection(port: port, timeout: timeout)
            defer { connection.close() }
            let head = RawConnection.head(method, path, headers: headers, contentLength: body?.count)
            // A send that fails is fine: the server may answer and close early; read what it said.
            connection.send(Array(head.utf8) + (body ?? []))
            return try connection.readResponse(requestMethod: method)
        }
    }

    /// Declares `Content-Length: declaredLength`, sends only `sending` of the body, then drops
    /// the connection.
    public func dropMidBody(_ method: String, _ path: String, declaredLength: Int, sending partial: [UInt8]) async throws {
        let port = self.port
        try await onThread {
            let connection = try RawConnection(port: port, timeout: 5)
            let head = RawConnection.head(method, path, headers: ["Content-Type": "application/json"], contentLength: declaredLength)
            connection.send(Array(head.utf8) + partial)
            usleep(50_000)  // let the server read what was sent before the connection goes away
            connection.close()
        }
    }

    /// A slow client: the request line and headers go out byte by byte, spread over `over`
    /// seconds, then the body at once; returns the answer.
    public func slowRequest(_ method: String, _ path: String, json: String? = nil, over seconds: Double = 1.0) async throws -> TestResponse {
        let (port, timeout) = (self.port, self.timeout)
        return try await onThread {
            let connection = try RawConnection(port: port, timeout: timeout + seconds)
            defer { connection.close() }
            let body = json.map { Array($0.utf8) }
            let head = Array(
                RawConnection.head(method, path, headers: body == nil ? [:] : ["Content-Type": "application/json"], contentLength: body?.count).utf8)
            let pause = useconds_t(seconds * 1e6 / Double(head.count))
            for byte in head {
                guard connection.send([byte]) else { throw TestClientError("the server closed the connection of a slow client") }
                usleep(pause)
            }
            if let body { connection.send(body) }
            return try connection.readResponse(requestMethod: method)
        }
    }

    /// Sends a body of `size` bytes (declared up front) in 64 KiB pieces, stopping as soon as the
    /// server answers or closes; returns the answer and how many body bytes went out.
    public func oversizedRequest(_ method: String, _ path: String, size: Int = 20 << 20) async throws -> (response: TestResponse, sent: Int) {
        let (port, timeout) = (self.port, self.timeout)
        return try await onThread {
            let connection = try RawConnection(port: port, timeout: timeout)
            defer { connection.close() }
            let head = RawConnection.head(method, path, headers: ["Content-Type": "application/json"], contentLength: size)
            guard connection.send(head) else { throw TestClientError("could not send the head") }
            let piece = [UInt8](repeating: UInt8(ascii: " "), count: 64 << 10)
            var sent = 0
            while sent < size {
                if connection.isReadable(milliseconds: 0) { break }
                let n = min(piece.count, size - sent)
                guard connection.send(n == piece.count ? piece : Array(piece[..<n])) else { break }
                sent += n
            }
            return (try connection.readResponse(requestMethod: method), sent)
        }
    }

    /// Opens `GET path` as a Server-Sent Events stream, reads until `count` events with an `id:`
    /// have arrived, or one for which `stop` holds (or `timeout`), and closes it. Returns the
    /// response head and the events.
    public func readEventStream(
        _ path: String, count: Int, timeout: Double = 5, headers: [String: String] = [:], stop: (@Sendable (SSEEvent) -> Bool)? = nil
    ) async throws -> (
        response: TestResponse, events: [SSEEvent]
    ) {
        let port = self.port
        return try await onThread {
            let connection = try RawConnection(port: port, timeout: timeout)
            defer { connection.close() }
            connection.send(RawConnection.head("GET", path, headers: headers, contentLength: nil))
            let (status, h) = try connection.readHead()
            let head = TestResponse(status: status, headers: h, body: [])
            guard status == 200 else {
                return (
                    try TestResponse(status: status, headers: h, body: h["content-length"].flatMap(Int.init).map { try connection.readBytes($0) } ?? []), []
                )
            }
            let chunked = h["transfer-encoding"]?.lowercased().contains("chunked") == true
            let deadline = Date().addingTimeInterval(timeout)
            var parser = SSEParser()
            // Reads until enough events came, the stream ended, or the time is up (a receive
            // timeout then just ends the reading: the caller checks what arrived).
            while parser.events.filter({ $0.id != nil }).count < count, Date() < deadline, !(stop.map { parser.events.contains(where: $0) } ?? false) {
                do {
                    if chunked {
                        guard let chunk = try connection.readChunk() else { break }
                        parser.feed(chunk)
                    } else {
                        parser.feed(try connection.readBytes(1))
                    }
                } catch {
                    break
                }
            }
            return (head, parser.events)
        }
    }
}

/// One Server-Sent Event.
public struct SSEEvent: Sendable, CustomStringConvertible {
    public var id: String?
    public var event: String?
    public var data: String
    public var retry: Int?
    /// `data` parsed as a JSON object.
    public var object: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(data.utf8))) as? [String: Any] ?? [:]
    }
    public var description: String { "id: \(id ?? "-") event: \(event ?? "-") data: \(data)" }
}

/// Splits a `text/event-stream` into events (comments and retry-only blocks are kept as
/// events without data only when they carry an id).
struct SSEParser {
    var pending: [UInt8] = []
    var current = SSEEvent(id: nil, event: nil, data: "", retry: nil)
    var hasData = false
    var events: [SSEEvent] = []

    mutating func feed(_ bytes: [UInt8]) {
        pending += bytes
        while let nl = pending.firstIndex(of: 0x0A) {
            var line = Array(pending[..<nl])
            pending.removeFirst(nl + 1)
            if line.last == 0x0D { line.removeLast() }
            handle(String(decoding: line, as: UTF8.self))
        }
    }

    mutating func handle(_ line: String) {
        if line.isEmpty {
            if hasData || current.id != nil { events.append(current) }
            current = SSEEvent(id: nil, event: nil, data: "", retry: nil)
            hasData = false
            return
        }
        if line.hasPrefix(":") { return }
        let field: Substring, value: Substring
        if let colon = line.firstIndex(of: ":") {
            field = line[..<colon]
            var v = line[line.index(after: colon)...]
            if v.first == " " { v = v.dropFirst() }
            value = v
        } else {
            field = Substring(line); value = ""
        }
        switch field {
        case "id": current.id = String(value)
        case "event": current.event = String(value)
        case "data":
            current.data += (hasData ? "\n" : "") + value
            hasData = true
        case "retry": current.retry = Int(value)
        default: break
        }
    }
}
