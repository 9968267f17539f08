import Foundation
import QueueTesting
import Testing

extension TestResponse {
    /// This response, if its body parses as JSON; otherwise throws with the whole answer.
    @discardableResult
    func validJSON(_ what: String = "") throws -> TestResponse {
        guard json != nil else { throw Unexpected("the body of \(what) is not valid JSON", self) }
        return self
    }
}

/// Checks an RFC 9457 answer: status, media type, members, and that `detail` names `field`.
func expectProblem(
    _ r: TestResponse, _ status: Int, mentioning words: [String] = [],
    sourceLocation: SourceLocation = #_sourceLocation
) {
    guard r.status == status else {
        Issue.record("expected a \(status) problem, got:\n\(r)", sourceLocation: sourceLocation)
        return
    }
    #expect(r.mediaType == "application/problem+json", "Content-Type \(r.headers["content-type"] ?? "none")", sourceLocation: sourceLocation)
    #expect(r.int("status") == status, "problem status member: \(r.text)", sourceLocation: sourceLocation)
    #expect(r.string("type")?.isEmpty == false, "problem type member: \(r.text)", sourceLocation: sourceLocation)
    #expect(r.string("title")?.isEmpty == false, "problem title member: \(r.text)", sourceLocation: sourceLocation)
    let detail = r.string("detail") ?? ""
    #expect(!detail.isEmpty, "problem detail member: \(r.text)", sourceLocation: sourceLocation)
    for word in words {
        #expect(detail.contains(word), "detail should name \(word.debugDescription): \(detail.debugDescription)", sourceLocation: sourceLocation)
    }
}

/// Parses the API's RFC 3339 times (with or without fractional seconds).
func parseTime(_ value: Any?) -> Date? {
    guard let s = value as? String else { return nil }
    let f = ISO8601DateFormatter()
    f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    if let d = f.date(from: s) { return d }
    f.formatOptions = [.withInternetDateTime]
    return f.date(from: s)
}

func elapsed(since start: Date) -> Double { Date().timeIntervalSince(start) }

extension LiveServer {
    /// This server with `seconds` as the time any one request may take before the client gives
    /// up (the default is 10 s): for long polls whose wait is longer than that.
    func patient(_ seconds: Double) -> LiveServer {
        var copy = self
        copy.timeout = seconds
        return copy
    }

    /// Creates a queue; throws unless 201.
    @discardableResult
    func createQueue(_ name: String, maxConcurrent: Int? = nil, suspended: Bool? = nil) async throws -> TestResponse {
        var body = #"{"name":"\#(name)""#
        if let maxConcurrent { body += #","maxConcurrentOperationCount":\#(maxConcurrent)"# }
        if let suspended { body += #","isSuspended":\#(suspended)"# }
        body += "}"
        return try await request("POST", "/v1/queues", json: body).expecting(201, "creating queue \(name)")
    }

    /// Adds a `delay` operation and returns its id; throws unless 201.
    func addDelay(
        _ queue: String, seconds: Double = 0.05, priority: String? = nil, dependencies: [String] = [], name: String? = nil
    ) async throws -> String {
        var body = #"{"kind":"delay","spec":{"seconds":\#(seconds)}"#
        if let priority { body += #","queuePriority":"\#(priority)""# }
        if !dependencies.isEmpty { body += #","dependencies":[\#(dependencies.map { "\"\($0)\"" }.joined(separator: ","))]"# }
        if let name { body += #","name":"\#(name)""# }
        body += "}"
        let r = try await request("POST", "/v1/queues/\(queue)/operations", json: body).expecting(201, "adding a delay to \(queue)")
        guard let id = r.string("id") else { throw Unexpected("no id", r) }
        return id
    }

    /// `GET /v1/operations/{id}` as an object; throws unless 200.
    func operation(_ id: String) async throws -> [String: Any] {
        try await request("GET", "/v1/operations/\(id)").expecting(200, "getting operation \(id)").object
    }

    func state(_ id: String) async throws -> String? { try await operation(id)["state"] as? String }

    /// Polls until the operation is in `state` (or the deadline passes); returns whether it got there.
    func waitForState(_ id: String, _ state: String, timeout: Double = 5) async throws -> Bool {
        try await eventually(timeout: timeout) { try await self.state(id) == state }
    }

    /// `GET /v1/queues/{name}` as an object; throws unless 200.
    func queue(_ name: String) async throws -> [String: Any] {
        try await request("GET", "/v1/queues/\(name)").expecting(200, "getting queue \(name)").object
    }

    /// Every operation of a queue, following `next` through all pages.
    func operations(in queue: String, state: String? = nil) async throws -> [[String: Any]] {
        var all: [[String: Any]] = []
        var after: String? = nil
        repeat {
            var path = "/v1/queues/\(queue)/operations?limit=1000"
            if let state { path += "&state=\(state)" }
            if let after { path += "&after=\(after)" }
            let page = try await request("GET", path).expecting(200, "listing \(path)").validJSON("GET \(path)")
            all += page.objects("operations")
            after = page.object["next"] as? String
        } while after != nil
        return all
    }

    /// The names of all queues.
    func queueNames() async throws -> [String] {
        try await request("GET", "/v1/queues").expecting(200).validJSON("GET /v1/queues").objects("queues").compactMap { $0["name"] as? String }.sorted()
    }

    /// The newest event seq (0 if none).
    func lastSeq() async throws -> Int {
        var after = 0
        while true {
            let page = try await request("GET", "/v1/events?after=\(after)&limit=10000").expecting(200)
            if page.objects("events").isEmpty { return after }
            after = page.int("next") ?? after
        }
    }

    /// Everything observable: the queues with their revisions and counts, every operation of every
    /// queue, and the newest event seq. Equal before and after a refused request means it changed
    /// nothing (valid while nothing is running).
    func fingerprint() async throws -> String {
        var out = try await request("GET", "/v1/queues").expecting(200).text
        // Names taken from the raw text, so this works even if the list were not valid JSON.
        let names = out.matches(of: #/"name":"([A-Za-z0-9._-]+)"/#).map { String($0.output.1) }
        for name in names {
            let list = try await request("GET", "/v1/queues/\(name)/operations?limit=1000").expecting(200).text
            out += "\n\(name): \(list)"
        }
        out += "\nlastSeq: \(try await lastSeq())"
        return out
    }
}
