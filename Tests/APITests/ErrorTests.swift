import Foundation
import QueueTesting
import Testing

/// One refused request: `{a}`, `{b}`, `{running}`, `{finished}` and `{missing}` in the path or
/// body stand for the fixture's operation ids.
struct ErrorCase: Sendable, CustomTestStringConvertible {
    let method: String
    let path: String
    let body: String?
    let status: Int
    /// Words the problem's `detail` must contain (the field, the queue, the state...).
    let mentions: [String]

    init(_ method: String, _ path: String, _ body: String? = nil, _ status: Int, _ mentions: [String] = []) {
        self.method = method; self.path = path; self.body = body; self.status = status; self.mentions = mentions
    }

    var testDescription: String { "\(method) \(path) \(body ?? "") → \(status)" }
}

/// A server with known, still state:
/// - `q` suspended: `a` ready, `b` pending on `a`
/// - `run` serial: `running` executing (a long delay)
/// - `done`: `finished` (succeeded)
/// - `idle`: empty
struct Fixture {
    let ids: [String: String]

    static func make(_ server: LiveServer) async throws -> Fixture {
        try await server.createQueue("q", suspended: true)
        try await server.createQueue("run", maxConcurrent: 1)
        try await server.createQueue("done")
        try await server.createQueue("idle")
        let a = try await server.addDelay("q", seconds: 0.05)
        let b = try await server.addDelay("q", seconds: 0.05, dependencies: [a])
        let running = try await server.addDelay("run", seconds: 60)
        let finished = try await server.addDelay("done", seconds: 0)
        guard try await server.waitForState(running, "executing"), try await server.waitForState(finished, "finished") else {
            throw Unexpected("fixture did not settle")
        }
        // A state shows before its events are committed (lastSeq): the fixture is settled once
        // two looks 50 ms apart agree, so a refused request is the only thing that could move it.
        var previous = try await server.fingerprint()
        for _ in 0..<100 {
            try await Task.sleep(nanoseconds: 50_000_000)
            let now = try await server.fingerprint()
            if now == previous { break }
            previous = now
        }
        return Fixture(ids: ["a": a, "b": b, "running": running, "finished": finished, "missing": "op-00000000deadbeef"])
    }

    func fill(_ text: String) -> String {
        var s = text
        for (k, v) in ids { s = s.replacingOccurrences(of: "{\(k)}", with: v) }
        return s
    }
}

/// Sends the case to a fresh fixture server and checks the problem and that nothing changed.
func checkRefused(_ c: ErrorCase, sourceLocation: SourceLocation = #_sourceLocation) async throws {
    try await withLiveServer { server in
        let fixture = try await Fixture.make(server)
        let before = try await server.fingerprint()
        let r = try await server.request(c.method, fixture.fill(c.path), json: c.body.map(fixture.fill))
        expectProblem(r, c.status, mentioning: c.mentions.map(fixture.fill), sourceLocation: sourceLocation)
        let after = try await server.fingerprint()
        #expect(after == before, "the refused request changed state", sourceLocation: sourceLocation)
        // And the server is fine afterwards.
        #expect(try await server.request("GET", "/healthz").status == 200, sourceLocation: sourceLocation)
    }
}

let delay = #""kind":"delay","spec":{"seconds":0.05}"#

@Suite("Refused requests change nothing")
struct ErrorTests {
    @Test(
        "malformed JSON is refused with 400",
        arguments: [
            ErrorCase("POST", "/v1/queues", #"{"name": "x""#, 400),
            ErrorCase("POST", "/v1/queues", #"{"name": 'x'}"#, 400),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"kind":"delay",}"#, 400),
            ErrorCase("POST", "/v1/queues/q/operations", "", 400),
            ErrorCase("PATCH", "/v1/queues/q", "isSuspended=true", 400),
            ErrorCase("PATCH", "/v1/operations/{a}", #"{"queuePriority": }"#, 400),
            ErrorCase("POST", "/v1/operations/{a}/observers", "{", 400),
            ErrorCase("POST", "/v1/queues/q/barrier", #"{"name":"x"} trailing"#, 400),
            ErrorCase("POST", "/v1/queues", String(repeating: "[", count: 10_000), 400),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":{"seconds":NaN}}"#, 400),
        ])
    func malformed(_ c: ErrorCase) async throws { try await checkRefused(c) }

    @Test(
        "a field of the wrong type is refused with 422 naming the field",
        arguments: [
            ErrorCase("POST", "/v1/queues", #"{"name":5}"#, 422, ["name"]),
            ErrorCase("POST", "/v1/queues", #"{"name":"x","maxConcurrentOperationCount":"2"}"#, 422, ["maxConcurrentOperationCount"]),
            ErrorCase("POST", "/v1/queues", #"{"name":"x","maxConcurrentOperationCount":1.5}"#, 422, ["maxConcurrentOperationCount"]),
            ErrorCase("POST", "/v1/queues", #"{"name":"x","isSuspended":"yes"}"#, 422, ["isSuspended"]),
            ErrorCase("POST", "/v1/queues", #"["x"]"#, 422, ["body"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":{"seconds":"1"}}"#, 422, ["seconds"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":[1]}"#, 422, ["spec"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"name":7}"#, 422, ["name"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"dependencies":"{a}"}"#, 422, ["dependencies"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"queuePriority":4}"#, 422, ["queuePriority"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"timeout":"30"}"#, 422, ["timeout"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"kind":5,"spec":{"seconds":1}}"#, 422, ["kind"]),
            ErrorCase("PATCH", "/v1/queues/q", #"{"isSuspended":1}"#, 422, ["isSuspended"]),
            ErrorCase("PATCH", "/v1/operations/{a}", #"{"dependencies":[5]}"#, 422, ["dependencies"]),
            ErrorCase("PATCH", "/v1/operations/{b}", #"{"dependencies":"{a}"}"#, 422, ["dependencies"]),
            ErrorCase("POST", "/v1/operations/{a}/observers", #"{"url":42}"#, 422, ["url"]),
        ])
    func wrongType(_ c: ErrorCase) async throws { try await checkRefused(c) }

    @Test(
        "an unknown field is refused with 422 naming it",
        arguments: [
            ErrorCase("POST", "/v1/queues", #"{"name":"x","colour":"red"}"#, 422, ["colour"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"priority":"high"}"#, 422, ["priority"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":{"seconds":1,"minutes":2}}"#, 422, ["minutes"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"retry":{"maxAttempts":2,"jitter":1}}"#, 422, ["jitter"]),
            ErrorCase("PATCH", "/v1/queues/q", #"{"name":"renamed"}"#, 422, ["name"]),
            ErrorCase("PATCH", "/v1/operations/{a}", #"{"state":"finished"}"#, 422, ["state"]),
            ErrorCase("POST", "/v1/operations/{a}/observers", #"{"url":"http://127.0.0.1:9/x","secret":"s"}"#, 422, ["secret"]),
            ErrorCase("POST", "/v1/operations/{a}/cancel", #"{"reason":"because"}"#, 422, ["reason"]),
            ErrorCase("GET", "/v1/queues/q/operations?colour=red", nil, 422, ["colour"]),
            ErrorCase("DELETE", "/v1/queues/idle?forced=true", nil, 422, ["forced"]),
            ErrorCase("POST", "/v1/queues/q/suspend?colour=red", nil, 422, ["colour"]),
            ErrorCase("POST", "/v1/operations/{a}/pause?colour=red", nil, 422, ["colour"]),
            ErrorCase("POST", "/v1/queues", #"{"name":"x","name":"y"}"#, 422, ["name"]),
        ])
    func unknownField(_ c: ErrorCase) async throws { try await checkRefused(c) }

    @Test(
        "a value out of range is refused with 422 naming the field",
        arguments: [
            ErrorCase("POST", "/v1/queues", #"{"name":"x","maxConcurrentOperationCount":0}"#, 422, ["maxConcurrentOperationCount"]),
            ErrorCase("POST", "/v1/queues", #"{"name":"x","maxConcurrentOperationCount":-2}"#, 422, ["maxConcurrentOperationCount"]),
            ErrorCase("POST", "/v1/queues", #"{"name":"bad name!"}"#, 422, ["name"]),
            ErrorCase("POST", "/v1/queues", #"{"name":"\#(String(repeating: "x", count: 65))"}"#, 422, ["name"]),
            ErrorCase("POST", "/v1/queues", #"{"name":""}"#, 422, ["name"]),
            ErrorCase("POST", "/v1/queues", #"{"name":"a/b"}"#, 422, ["name"]),
            ErrorCase("POST", "/v1/queues", #"{}"#, 422, ["name"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"queuePriority":"urgent"}"#, 422, ["queuePriority"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":{"seconds":-1}}"#, 422, ["seconds"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"kind":"delay","spec":{}}"#, 422, ["seconds"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"kind":"delay"}"#, 422, ["spec"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"spec":{"seconds":1}}"#, 422, ["kind"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{"kind":"teleport","spec":{}}"#, 422, ["kind"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"timeout":0}"#, 422, ["timeout"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"retry":{"maxAttempts":0}}"#, 422, ["maxAttempts"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"notBefore":"tomorrow"}"#, 422, ["notBefore"]),
            ErrorCase("PATCH", "/v1/queues/q", #"{"maxConcurrentOperationCount":0}"#, 422, ["maxConcurrentOperationCount"]),
            ErrorCase("PATCH", "/v1/operations/{a}", #"{"queuePriority":"urgent"}"#, 422, ["queuePriority"]),
            ErrorCase("POST", "/v1/operations/{a}/observers", #"{"url":"ftp://127.0.0.1/x"}"#, 422, ["url"]),
            ErrorCase("POST", "/v1/operations/{a}/observers", #"{"url":"http://127.0.0.1:9/x","keys":["isHappy"]}"#, 422, ["keys"]),
            ErrorCase("GET", "/v1/queues/q/operations?limit=0", nil, 422, ["limit"]),
            ErrorCase("GET", "/v1/queues/q/operations?state=sleeping", nil, 422, ["state"]),
            ErrorCase("GET", "/v1/queues/q/wait?timeout=-1", nil, 422, ["timeout"]),
            ErrorCase("GET", "/v1/events?limit=0", nil, 422, ["limit"]),
            ErrorCase("POST", "/v1/operations/{a}/cancel?cascade=maybe", nil, 422, ["cascade"]),
        ])
    func outOfRange(_ c: ErrorCase) async throws { try await checkRefused(c) }

    @Test(
        "an unknown queue or operation is 404 naming it",
        arguments: [
            ErrorCase("GET", "/v1/queues/nope", nil, 404, ["nope"]),
            ErrorCase("PATCH", "/v1/queues/nope", #"{"isSuspended":true}"#, 404, ["nope"]),
            ErrorCase("DELETE", "/v1/queues/nope", nil, 404, ["nope"]),
            ErrorCase("POST", "/v1/queues/nope/suspend", nil, 404, ["nope"]),
            ErrorCase("POST", "/v1/queues/nope/resume", nil, 404, ["nope"]),
            ErrorCase("POST", "/v1/queues/nope/cancel-all", nil, 404, ["nope"]),
            ErrorCase("GET", "/v1/queues/nope/wait?timeout=1", nil, 404, ["nope"]),
            ErrorCase("POST", "/v1/queues/nope/barrier", nil, 404, ["nope"]),
            ErrorCase("POST", "/v1/queues/nope/operations", #"{\#(delay)}"#, 404, ["nope"]),
            ErrorCase("GET", "/v1/queues/nope/operations", nil, 404, ["nope"]),
            ErrorCase("GET", "/v1/operations/{missing}", nil, 404, ["{missing}"]),
            ErrorCase("GET", "/v1/operations/not-an-id", nil, 404, ["not-an-id"]),
            ErrorCase("PATCH", "/v1/operations/{missing}", #"{"queuePriority":"low"}"#, 404, ["{missing}"]),
            ErrorCase("POST", "/v1/operations/{missing}/cancel", nil, 404, ["{missing}"]),
            ErrorCase("POST", "/v1/operations/{missing}/pause", nil, 404, ["{missing}"]),
            ErrorCase("POST", "/v1/operations/{missing}/resume", nil, 404, ["{missing}"]),
            ErrorCase("GET", "/v1/operations/{missing}/events", nil, 404, ["{missing}"]),
            ErrorCase("POST", "/v1/operations/{missing}/observers", #"{"url":"http://127.0.0.1:9/x"}"#, 404, ["{missing}"]),
            ErrorCase("POST", "/v1/queues/q/operations", #"{\#(delay),"dependencies":["{a}","{missing}"]}"#, 404, ["{missing}"]),
            ErrorCase("PATCH", "/v1/operations/{b}", #"{"dependencies":["{missing}"]}"#, 404, ["{missing}"]),
            ErrorCase("GET", "/v1/nothing-here", nil, 404, []),
        ])
    func unknownResource(_ c: ErrorCase) async throws { try await checkRefused(c) }

    @Test(
        "creating a queue whose name is taken is 409 naming it",
        arguments: [
            ErrorCase("POST", "/v1/queues", #"{"name":"q"}"#, 409, ["q"]),
            ErrorCase("POST", "/v1/queues", #"{"name":"idle","maxConcurrentOperationCount":3}"#, 409, ["idle"]),
        ])
    func duplicateQueue(_ c: ErrorCase) async throws { try await checkRefused(c) }

    @Test(
        "a transition not allowed now is 409 naming the state",
        arguments: [
            ErrorCase("POST", "/v1/operations/{running}/resume", nil, 409, ["executing"]),
            ErrorCase("POST", "/v1/operations/{a}/resume", nil, 409, ["ready"]),
            ErrorCase("POST", "/v1/operations/{b}/resume", nil, 409, ["pending"]),
            ErrorCase("POST", "/v1/operations/{finished}/cancel", nil, 409, ["finished"]),
            ErrorCase("POST", "/v1/operations/{finished}/pause", nil, 409, ["finished"]),
            ErrorCase("POST", "/v1/operations/{finished}/resume", nil, 409, ["finished"]),
            ErrorCase("PATCH", "/v1/operations/{finished}", #"{"queuePriority":"high"}"#, 409, []),
            ErrorCase("PATCH", "/v1/operations/{running}", #"{"dependencies":[]}"#, 409, []),
            ErrorCase("POST", "/v1/operations/{finished}/observers", #"{"url":"http://127.0.0.1:9/x"}"#, 409, ["finished"]),
        ])
    func invalidTransition(_ c: ErrorCase) async throws { try await checkRefused(c) }

    @Test(
        "a dependency that would close a cycle is 409",
        arguments: [
            ErrorCase("PATCH", "/v1/operations/{a}", #"{"dependencies":["{b}"]}"#, 409, []),
            ErrorCase("PATCH", "/v1/operations/{a}", #"{"dependencies":["{a}"]}"#, 409, []),
            ErrorCase("PATCH", "/v1/operations/{b}", #"{"dependencies":["{b}","{a}"]}"#, 409, []),
        ])
    func dependencyCycle(_ c: ErrorCase) async throws { try await checkRefused(c) }

    @Test(
        "deleting a queue with unfinished operations without force is 409",
        arguments: [
            ErrorCase("DELETE", "/v1/queues/q", nil, 409, ["q", "force"]),
            ErrorCase("DELETE", "/v1/queues/run", nil, 409, ["run"]),
            ErrorCase("DELETE", "/v1/queues/run?force=false", nil, 409, ["run"]),
        ])
    func deleteBusyQueue(_ c: ErrorCase) async throws { try await checkRefused(c) }

    @Test(
        "a method a path does not allow is 405 with Allow",
        arguments: [
            ("PUT", "/v1/queues", ["GET", "POST"]),
            ("DELETE", "/v1/operations/{a}", ["GET", "PATCH"]),
            ("POST", "/healthz", ["GET"]),
            ("GET", "/v1/queues/q/suspend", ["POST"]),
            ("POST", "/v1/events", ["GET"]),
            ("PUT", "/v1/queues/q", ["GET", "PATCH", "DELETE"]),
        ])
    func methodNotAllowed(_ method: String, _ path: String, _ allowed: [String]) async throws {
        try await withLiveServer { server in
            let fixture = try await Fixture.make(server)
            let before = try await server.fingerprint()
            let r = try await server.request(method, fixture.fill(path), json: method == "GET" ? nil : "{}")
            expectProblem(r, 405, mentioning: [method])
            let allow = try #require(r.headers["Allow"], "no Allow header: \(r)")
            let listed = Set(allow.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) })
            #expect(listed == Set(allowed), "Allow: \(allow)")
            #expect(try await server.fingerprint() == before)
        }
    }
}
