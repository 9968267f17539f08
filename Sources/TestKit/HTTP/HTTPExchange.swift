import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// What became of one HTTP request to a server that may be going away.
public enum HTTPOutcome: Sendable, CustomStringConvertible {
    /// A complete answer.
    case response(TestResponse)
    /// `connect` was refused: nothing listens (any more).
    case refused
    /// The connection ended (EOF or reset) before a single byte of an answer came.
    case closedWithoutAnswer(String)
    /// Some of an answer came, then the connection ended.
    case partial(String, bytes: Int)
    /// Nothing (or not everything) came within the timeout.
    case timedOut(bytes: Int)
    /// `socket`/`connect` failed otherwise.
    case failed(String)

    public var response: TestResponse? { if case let .response(r) = self { r } else { nil } }
    public var status: Int? { response?.status }

    public var description: String {
        switch self {
        case let .response(r): "HTTP \(r.status) \(r.text.prefix(300))"
        case .refused: "connection refused"
        case let .closedWithoutAnswer(how): "closed without an answer (\(how))"
        case let .partial(how, bytes): "partial answer: \(bytes) bytes, then \(how)"
        case let .timedOut(bytes): "timed out after \(bytes) bytes"
        case let .failed(what): "failed: \(what)"
        }
    }
}

/// A one-shot HTTP/1.1 exchange (`Connection: close`) on a ``RawConnection`` that tells a
/// refused connection, an answer that never started, a cut-off answer and a timeout apart.
public enum HTTPExchange {
    public static func run(port: Int, method: String, path: String, body: [UInt8]?, headers: [String: String] = [:], timeout: Double) -> HTTPOutcome {
        run(host: "127.0.0.1", port: port, method: method, path: path, body: body, headers: headers, timeout: timeout)
    }

    /// The same to another IPv4 address than 127.0.0.1 (a test's network namespaces).
    public static func run(host: String, port: Int, method: String, path: String, body: [UInt8]?, headers: [String: String] = [:], timeout: Double)
        -> HTTPOutcome
    {
        let connection: RawConnection
        do {
            connection = try RawConnection(host: host, port: port, timeout: timeout)
        } catch let error as TestClientError {
            if error.code == ECONNREFUSED { return .refused }
            if error.code == ECONNRESET { return .closedWithoutAnswer("reset at connect") }
            return .failed(error.description)
        } catch {
            return .failed("\(error)")
        }
        defer { connection.close() }
        let head = RawConnection.head(
            method, path, headers: body == nil ? headers : headers.merging(["Content-Type": "application/json"]) { a, _ in a },
            contentLength: body?.count)
        // A send that fails is fine: the server may have answered and closed; read what it said.
        connection.send(Array(head.utf8) + (body ?? []))
        do {
            return .response(try connection.readResponse(requestMethod: method))
        } catch {
            let bytes = connection.bytesReceived
            switch connection.ending {
            case .timeout?: return .timedOut(bytes: bytes)
            case let ending?: return bytes == 0 ? .closedWithoutAnswer(ending.rawValue) : .partial(ending.rawValue, bytes: bytes)
            case nil: return bytes == 0 ? .failed("\(error)") : .partial("\(error)", bytes: bytes)
            }
        }
    }
}
