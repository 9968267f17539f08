import Foundation

/// Response headers in the order received, looked up case-insensitively.
public struct TestHeaders: Sendable, CustomStringConvertible {
    public let all: [(String, String)]
    public init(_ all: [(String, String)]) { self.all = all }

    /// The first value of `name` (any case), nil if absent.
    public subscript(_ name: String) -> String? {
        let lower = name.lowercased()
        return all.first { $0.0.lowercased() == lower }?.1
    }

    /// Every value of `name` (any case).
    public func values(_ name: String) -> [String] {
        let lower = name.lowercased()
        return all.filter { $0.0.lowercased() == lower }.map(\.1)
    }

    public var description: String { all.map { "\($0.0): \($0.1)" }.joined(separator: "\n") }
}

/// One HTTP answer as the test client saw it.
public struct TestResponse: Sendable, CustomStringConvertible {
    public let status: Int
    public let headers: TestHeaders
    public let body: [UInt8]

    public init(status: Int, headers: TestHeaders, body: [UInt8]) {
        self.status = status; self.headers = headers; self.body = body
    }

    public var text: String { String(decoding: body, as: UTF8.self) }

    /// The body parsed with `JSONSerialization` (`[String: Any]`, `[Any]`, ...); nil if it is not JSON.
    public var json: Any? {
        guard !body.isEmpty else { return nil }
        return try? JSONSerialization.jsonObject(with: Data(body), options: [.fragmentsAllowed])
    }

    /// The body as a JSON object; empty if it is not one.
    public var object: [String: Any] { json as? [String: Any] ?? [:] }

    /// A top-level string member.
    public func string(_ key: String) -> String? { object[key] as? String }
    /// A top-level integer member.
    public func int(_ key: String) -> Int? { (object[key] as? NSNumber)?.intValue }
    /// A top-level boolean member.
    public func bool(_ key: String) -> Bool? { object[key] as? Bool }
    /// A top-level array of objects, e.g. `operations` of a list.
    public func objects(_ key: String) -> [[String: Any]] { object[key] as? [[String: Any]] ?? [] }

    /// The `Content-Type` without parameters, lowercased.
    public var mediaType: String? {
        headers["content-type"].map { $0.split(separator: ";")[0].trimmingCharacters(in: .whitespaces).lowercased() }
    }

    public var description: String { "HTTP \(status)\n\(headers)\n\n\(text.prefix(2000))" }
}

/// A test gave up because the server answered something it could not continue from.
public struct Unexpected: Error, CustomStringConvertible {
    public let description: String
    public init(_ what: String, _ response: TestResponse? = nil) {
        description = response.map { "\(what)\n--- response ---\n\($0)" } ?? what
    }
}

extension TestResponse {
    /// This response, if it has `status`; otherwise throws with the whole answer for the log.
    @discardableResult
    public func expecting(_ status: Int, _ what: String = "") throws -> TestResponse {
        guard self.status == status else { throw Unexpected("expected \(status) \(what), got \(self.status)", self) }
        return self
    }
}
