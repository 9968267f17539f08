import Foundation
import Glibc
import Locking
// The kit (raw client, waitUntil, curl via ChildProcess) for every file of this target.
@_exported import TestKit
import Testing

@testable import MicroHTTP

/// One request on a fresh connection.
func fetch(
    port: Int, _ method: String = "GET", _ target: String, headers: [(String, String)] = [], body: [UInt8]? = nil
) throws -> TestResponse {
    let socket = try RawConnection(port: port)
    defer { socket.close() }
    return try socket.request(method, target, headers: headers, body: body)
}

/// Runs `/usr/bin/curl` with `arguments` and returns (HTTP status, body); curl adds the status line.
func curl(_ arguments: [String]) throws -> (status: Int, body: String) {
    let (_, data) = try ChildProcess.capture("/usr/bin/curl", ["-s", "-S", "--max-time", "20", "-w", "\n%{http_code}"] + arguments)
    let text = String(decoding: data, as: UTF8.self)
    guard let newline = text.lastIndex(of: "\n"), let status = Int(text[text.index(after: newline)...]) else {
        throw TestClientError("unexpected curl output: \(text)")
    }
    return (status, String(text[..<newline]))
}

/// Collects the server's log lines.
final class LogSink: Sendable {
    let lines = Lock<[(level: String, message: String)]>([])
    var log: @Sendable (String, String) -> Void {
        { level, message in self.lines.withLock { $0.append((level, message)) } }
    }
    func contains(level: String, _ text: String) -> Bool {
        lines.withLock { $0.contains { $0.level == level && $0.message.contains(text) } }
    }
}

/// Starts a server on 127.0.0.1 port 0, runs `body`, and always shuts it down.
@discardableResult
func withServer<T>(
    maxBodyBytes: Int = 1 << 20,
    threads: Int = 2,
    connectionTimeout: Int = 30,
    log: LogSink = LogSink(),
    handler: @escaping HTTPHandler,
    _ body: (HTTPServer) throws -> T
) throws -> T {
    let configuration = HTTPServerConfiguration(
        host: "127.0.0.1", port: 0, threads: threads, maxBodyBytes: maxBodyBytes, connectionTimeout: connectionTimeout)
    let server = HTTPServer(configuration: configuration, handler: handler, log: log.log)
    try server.start()
    defer { server.shutdown(timeout: .seconds(2)) }
    return try body(server)
}

func text(_ string: String, status: Int = 200, contentType: String = "text/plain") -> HTTPHandlerResult {
    .response(HTTPResponse(status: status, headers: [("Content-Type", contentType)], body: Array(string.utf8)))
}

/// Decodes a JSON object body.
func jsonObject(_ bytes: [UInt8]) throws -> [String: Any] {
    let object = try JSONSerialization.jsonObject(with: Data(bytes))
    guard let dictionary = object as? [String: Any] else { throw TestClientError("not a JSON object") }
    return dictionary
}
