import Foundation
import QueueTesting
import Testing

/// Every number a client writes in a query string (and `Last-Event-ID`), and every date it
/// writes in a body, through HTTP on a real port: each form the one grammar refuses answers 422
/// naming the parameter or field, and nothing changed afterwards (the change feed, the queues,
/// the operations and an unclaimed external operation are exactly as before).
@Suite("Strict numbers and dates")
struct StrictInputTests {
    /// Forms Swift's `Int(_:)`/`Double(_:)` (or a lenient reader) would take as some number,
    /// percent-encoded as a client would send them.
    static let badNumbers = [
        "0x10", "0X1F", "0x1p4", "inf", "-inf", "infinity", "Infinity", "nan", "NaN", "%2B5", "1e2", "1E2", "2e-1", "010", "00",
        ".5", "5.", "%201", "1%20", "1%09", "1_0", "1,5", "%EF%BC%91", "%D9%A1", "0b1", "", "-", "--1", "1-", "9%00",
    ]
    /// Out of every parameter's range (each takes only non-negative values, none this large).
    static let outOfRange = ["-1", "99999999999999999999999", "1" + String(repeating: "0", count: 400)]

    /// The integer parameters: (what is asked, parameter). `{op}` is an operation id.
    static let integerParameters = [
        ("/v1/events?", "after"), ("/v1/events?", "limit"), ("/v1/events/stream?", "after"), ("/v1/queues?", "limit"),
        ("/v1/queues/g/operations?", "limit"), ("/v1/operations/{op}/events?", "after"), ("/v1/operations/{op}/events?", "limit"),
        ("POST /v1/queues/g/claim?", "max"),
    ]
    /// The seconds parameters: decimal fractions allowed.
    static let secondsParameters = [
        ("/v1/events?", "wait"), ("/v1/queues/g/wait?", "timeout"), ("/v1/operations/{op}/wait?", "timeout"), ("POST /v1/queues/g/claim?", "wait"),
    ]

    /// A 422 problem whose detail starts with the parameter or field it names (`limit: ...`),
    /// so that a detail mentioning "max" or "after" elsewhere does not count.
    func expectRefused(_ r: TestResponse, _ name: String, sourceLocation: SourceLocation = #_sourceLocation) {
        expectProblem(r, 422, sourceLocation: sourceLocation)
        let detail = r.string("detail") ?? ""
        #expect(detail.hasPrefix("\(name): "), "the detail should start with \(name): \(detail.debugDescription)", sourceLocation: sourceLocation)
    }

    /// Everything a refused request could have changed, as the API shows it.
    func snapshot(_ server: LiveServer, _ op: String) async throws -> [String] {
        var out: [String] = []
        for path in [
            "/v1/events?after=0&limit=10000", "/v1/queues", "/v1/queues/g/operations", "/v1/queues/h/operations", "/v1/operations/\(op)", "/v1/workers",
        ] {
            let r = try await server.request("GET", path)
            out.append("\(path) \(r.status) \(r.text)")
        }
        return out
    }

    /// A queue `g` with one started, unclaimed external operation, and an empty queue `h`.
    func setUp(_ server: LiveServer) async throws -> String {
        try await server.createQueue("g")
        try await server.createQueue("h")
        let r = try await server.request("POST", "/v1/queues/g/operations", json: #"{"kind":"external","spec":{"lease":30}}"#)
        let op = try #require(r.expecting(201).string("id"))
        #expect(try await server.waitForState(op, "executing"), "the external operation starts and waits for a worker")
        return op
    }

    func send(_ server: LiveServer, _ route: String, _ query: String, op: String, headers: [String: String] = [:]) async throws -> TestResponse {
        let post = route.hasPrefix("POST ")
        let path = (post ? String(route.dropFirst(5)) : route).replacingOccurrences(of: "{op}", with: op) + query
        return try await server.request(post ? "POST" : "GET", path, json: post ? #"{"worker":"w"}"# : nil, headers: headers)
    }

    @Test("every query number refuses hexadecimal, inf, nan, '+', exponents, leading zeros and the rest, naming the parameter, and changes nothing")
    func queryNumbers() async throws {
        try await withLiveServer { server in
            let op = try await setUp(server)
            let before = try await snapshot(server, op)
            var refused = 0
            for (route, name) in Self.integerParameters {
                for value in Self.badNumbers + Self.outOfRange + ["1.5", "0.0"] {
                    let r = try await send(server, route, "\(name)=\(value)", op: op)
                    expectRefused(r, name)
                    #expect(try await snapshot(server, op) == before, "\(route)\(name)=\(value) changed something")
                    refused += 1
                }
            }
            for (route, name) in Self.secondsParameters {
                for value in Self.badNumbers + Self.outOfRange + ["1.5e1", "1.", "-0.5"] {
                    let r = try await send(server, route, "\(name)=\(value)", op: op)
                    expectRefused(r, name)
                    #expect(try await snapshot(server, op) == before, "\(route)\(name)=\(value) changed something")
                    refused += 1
                }
            }
            #expect(try await snapshot(server, op) == before, "a refused request changed something")
            #expect(refused > 400)

            // The problem says what was wrong and what is allowed.
            let hex = try await server.request("GET", "/v1/events?limit=0x10")
            expectProblem(hex, 422, mentioning: ["limit", "hexadecimal", "decimal digits", "'0x10'"])
            let nan = try await server.request("GET", "/v1/events?wait=nan")
            expectProblem(nan, 422, mentioning: ["wait", "NaN", "fraction"])
            let plus = try await server.request("GET", "/v1/queues?limit=%2B5")
            expectProblem(plus, 422, mentioning: ["limit", "'+'"])
            let fraction = try await server.request("GET", "/v1/queues?limit=1.5")
            expectProblem(fraction, 422, mentioning: ["limit", "a fraction is not allowed"])
            let range = try await server.request("GET", "/v1/events?limit=10001")
            expectProblem(range, 422, mentioning: ["limit", "from 1 to 10000"])

            // The grammar's own forms are still taken: a fraction of seconds, zero, the bounds.
            try await server.request("GET", "/v1/events?after=0&limit=1&wait=0.05").expecting(200, "wait=0.05")
            try await server.request("GET", "/v1/events?wait=0").expecting(200, "wait=0")
            try await server.request("GET", "/v1/queues?limit=100000").expecting(200, "limit at its maximum")
            try await server.request("GET", "/v1/queues/h/wait?timeout=3600").expecting(200, "an idle queue answers at once")
            try await server.request("GET", "/v1/operations/\(op)/wait?timeout=0.01").expecting(200, "timeout=0.01")
            // Still unclaimed after every refused claim: the first valid claim gets it.
            let claim = try await server.request("POST", "/v1/queues/g/claim?wait=0&max=1", json: #"{"worker":"w"}"#).expecting(200, "claim")
            let claims = claim.object["claims"] as? [[String: Any]] ?? []
            #expect((claims.first?["operation"] as? [String: Any])?["id"] as? String == op, "\(claim)")
        }
    }

    @Test("a query parameter given twice is refused, whichever of its values is valid, and changes nothing")
    func repeatedParameters() async throws {
        try await withLiveServer { server in
            let op = try await setUp(server)
            let before = try await snapshot(server, op)
            for (method, path, name) in [
                ("GET", "/v1/events?limit=0x10&limit=5", "limit"), ("GET", "/v1/events?limit=5&limit=0x10", "limit"),
                ("GET", "/v1/events?after=0&wait=nan&wait=0", "wait"), ("GET", "/v1/queues?limit=1&limit=1", "limit"),
                ("POST", "/v1/queues/g/claim?max=1&max=1", "max"), ("POST", "/v1/queues/g/claim?wait=0&max=1&wait=0", "wait"),
                ("GET", "/v1/operations/\(op)/wait?timeout=0&timeout=0", "timeout"),
                ("POST", "/v1/operations/\(op)/cancel?cascade=false&cascade=true", "cascade"),
            ] {
                let r = try await server.request(method, path, json: path.contains("/claim") ? #"{"worker":"w"}"# : nil)
                expectRefused(r, name)
                #expect(r.string("detail")?.contains("more than once") == true, "\(r)")
                #expect(try await snapshot(server, op) == before, "\(method) \(path) changed something")
            }
            #expect(try await snapshot(server, op) == before, "a refused request changed something")
        }
    }

    @Test("Last-Event-ID takes only an event id: anything else is refused naming the header, an empty one is no id")
    func lastEventID() async throws {
        try await withLiveServer { server in
            let op = try await setUp(server)
            let before = try await snapshot(server, op)
            for value in ["0x10", "+5", "-1", "1e2", "010", "1 2", "abc", "1.0", "9223372036854775808", "18446744073709551615"] {
                let r = try await server.request("GET", "/v1/events/stream", headers: ["Last-Event-ID": value])
                expectRefused(r, "Last-Event-ID")
                // Also beside an `after`, which would win over a valid one.
                let withAfter = try await server.request("GET", "/v1/events/stream?after=0", headers: ["Last-Event-ID": value])
                expectRefused(withAfter, "Last-Event-ID")
            }
            #expect(try await snapshot(server, op) == before)
            // One of ours resumes after it; an empty one starts from the beginning.
            let (_, events) = try await server.readEventStream("/v1/events/stream", count: 1, headers: ["Last-Event-ID": "1"])
            #expect(events.first?.id == "2", "resumed after event 1: \(events)")
            let (_, fromStart) = try await server.readEventStream("/v1/events/stream", count: 1, headers: ["Last-Event-ID": ""])
            #expect(fromStart.first?.id == "1", "\(fromStart)")
        }
    }

    /// Times that do not exist, are outside the accepted years, or are not RFC 3339.
    static let badTimes = [
        #""2026-02-30T00:00:00Z""#, #""2026-04-31T12:00:00Z""#, #""2026-02-29T00:00:00Z""#, #""2100-02-29T00:00:00Z""#,
        #""2026-01-01T24:00:00Z""#, #""2026-01-01T00:60:00Z""#, #""2026-01-01T00:00:60Z""#, #""2026-13-01T00:00:00Z""#,
        #""2026-00-10T00:00:00Z""#, #""2026-01-00T00:00:00Z""#, #""2026-01-01T00:00:00+24:00""#, #""2026-01-01T00:00:00-23:60""#,
        #""2026-01-01T00:00:00+0500""#, #""1969-12-31T23:59:59Z""#, #""1900-01-01T00:00:00Z""#, #""0000-01-01T00:00:00Z""#,
        #""2262-01-01T00:00:00Z""#, #""9999-12-31T23:59:59Z""#, #""1970-01-01T00:30:00+01:00""#, #""2261-12-31T23:00:00-01:00""#, #""2026-11-22 10:00:00Z""#,
        #""2026-11-22T10:00:00""#,
        #""2026-11-22""#, #""tomorrow""#, #""""#, "1795341600", "true", #"{"at":"2026-11-22T10:00:00Z"}"#,
    ]

    @Test(
        "every date field refuses days that do not exist, hour 24, minute and second 60, offsets past 23:59 and years outside 1970-2261, naming the field, and changes nothing"
    )
    func dates() async throws {
        try await withLiveServer { server in
            let op = try await setUp(server)
            let archive = try await server.request("GET", "/v1/queues/g/archive").expecting(200, "archive").text
            let before = try await snapshot(server, op)
            for time in Self.badTimes {
                let create = try await server.request("POST", "/v1/queues/h/operations", json: #"{"kind":"delay","spec":{"seconds":1},"notBefore":\#(time)}"#)
                expectRefused(create, "notBefore")
                #expect(try await snapshot(server, op) == before, "a create with notBefore \(time) changed something")
                let batch = try await server.request(
                    "POST", "/v1/operations:batch",
                    json:
                        #"{"operations":[{"queue":"h","kind":"delay","spec":{"seconds":1}},{"queue":"h","kind":"delay","spec":{"seconds":1},"notBefore":\#(time)}]}"#
                )
                expectRefused(batch, "operations[1].notBefore")
                #expect(try await snapshot(server, op) == before, "a batch with notBefore \(time) changed something")
                let copy = try await server.request("POST", "/v1/operations/\(op)/copy", json: #"{"queue":"h","notBefore":\#(time)}"#)
                expectRefused(copy, "notBefore")
                #expect(try await snapshot(server, op) == before, "a copy with notBefore \(time) changed something")
                // An archive restored into a new queue: nothing of it may be created.
                for (field, document) in [
                    ("exportedAt", archive.replacingOccurrences(of: #""exportedAt":"#, with: #""exportedAt":\#(time),"old":"#)),
                    ("createdAt", archive.replacingOccurrences(of: #""createdAt":"#, with: #""createdAt":\#(time),"old":"#)),
                    ("notBefore", archive.replacingOccurrences(of: #""createdAt":"#, with: #""notBefore":\#(time),"createdAt":"#)),
                ] {
                    let fixed = document.replacingOccurrences(of: #","old":"[^"]*""#, with: "", options: .regularExpression)
                    #expect(fixed != archive, "the archive has a \(field) to replace")
                    let r = try await server.request("POST", "/v1/queues/restored/archive", json: fixed)
                    expectRefused(r, field == "exportedAt" ? field : "operations[0].\(field)")
                    #expect(try await snapshot(server, op) == before, "an archive with \(field) \(time) changed something")
                }
            }
            #expect(try await snapshot(server, op) == before, "a refused date changed something")

            // The problem names what was wrong with the date.
            let feb30 = try await server.request(
                "POST", "/v1/queues/h/operations", json: #"{"kind":"delay","spec":{"seconds":1},"notBefore":"2026-02-30T00:00:00Z"}"#)
            expectProblem(feb30, 422, mentioning: ["notBefore", "February 2026 has 28 days", "RFC 3339"])
            let leap = try await server.request(
                "POST", "/v1/queues/h/operations", json: #"{"kind":"delay","spec":{"seconds":1},"notBefore":"2026-06-30T23:59:60Z"}"#)
            expectProblem(leap, 422, mentioning: ["notBefore", "leap second"])
            let old = try await server.request(
                "POST", "/v1/queues/h/operations", json: #"{"kind":"delay","spec":{"seconds":1},"notBefore":"1969-07-20T20:17:40Z"}"#)
            expectProblem(old, 422, mentioning: ["notBefore", "1970", "2261"])

            // Valid times are taken, with their offset applied, and February 29 of a leap year.
            let r = try await server.request(
                "POST", "/v1/queues/h/operations", json: #"{"kind":"delay","spec":{"seconds":1},"notBefore":"2028-02-29T00:30:00+01:00"}"#)
            #expect(try r.expecting(201, "a valid notBefore").string("notBefore") == "2028-02-28T23:30:00.000Z")
            let lower = try await server.request(
                "POST", "/v1/queues/h/operations", json: #"{"kind":"delay","spec":{"seconds":0},"notBefore":"1970-01-01t00:00:00z"}"#)
            #expect(try lower.expecting(201, "the first accepted instant, lower-case t and z").string("notBefore") == "1970-01-01T00:00:00.000Z")
        }
    }
}
