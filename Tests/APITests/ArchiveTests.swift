import Foundation
import QueueTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `GET`/`POST /v1/queues/{name}/archive` through HTTP: `NSSecureCoding` for a queue.
@Suite("Queue archive: GET/POST /v1/queues/{name}/archive")
struct ArchiveEndpointTests {
    /// A document of `format` with the given operations (JSON texts).
    static func document(_ operations: [String], queue: String = "{}", format: String = #""opqd-archive/1""#) -> String {
        #"{"format":\#(format),"queue":\#(queue),"operations":[\#(operations.joined(separator: ","))]}"#
    }

    static func element(_ id: String, seconds: Double = 5, deps: [String] = [], extra: String = "") -> String {
        #"{"id":"\#(id)","kind":"delay","spec":{"seconds":\#(seconds)}"#
            + #","dependencies":[\#(deps.map { "\"\($0)\"" }.joined(separator: ","))]"# + extra + "}"
    }

    /// The id map of a restore's answer.
    static func ids(_ r: TestResponse) -> [String: String] { r.object["ids"] as? [String: String] ?? [:] }

    @Test("a round trip keeps settings, dependencies (inside re-pointed, outside kept), priorities, paused flags and every option")
    func roundTrip() async throws {
        try await withLiveServer { server in
            try await server.createQueue("other", suspended: true)
            let outside = try await server.addDelay("other", seconds: 5)
            try await server.createQueue("src", maxConcurrent: 2, suspended: true)
            let a =
                try await server.request(
                    "POST", "/v1/queues/src/operations",
                    json:
                        #"{"kind":"delay","spec":{"seconds":5},"name":"a","timeout":30,"retry":{"maxAttempts":4,"backoff":0.5,"multiplier":3},"notBefore":"2031-01-02T03:04:05Z"}"#
                ).expecting(201).string("id") ?? ""
            let b = try await server.addDelay("src", seconds: 5, priority: "high", dependencies: [a, outside], name: "b")
            let c = try await server.addDelay("src", seconds: 5, priority: "veryLow", name: "c")
            // A dependency on a later operation (PATCH can make one): restored all the same.
            _ = try await server.request("PATCH", "/v1/operations/\(a)", json: #"{"dependencies":["\#(c)"]}"#).expecting(200)
            let fence = try await server.request("POST", "/v1/queues/src/barrier", json: #"{"name":"fence"}"#).expecting(201).string("id") ?? ""
            let d = try await server.addDelay("src", seconds: 5, priority: "low", name: "d")
            _ = try await server.request("POST", "/v1/operations/\(b)/pause").expecting(200)
            // A finished operation is not archived, nor is a dependency on it (it holds nothing back).
            let gone = try await server.addDelay("src", name: "gone")
            _ = try await server.request("POST", "/v1/operations/\(gone)/cancel").expecting(200)
            let e = try await server.addDelay("src", seconds: 5, dependencies: [gone, outside], name: "e")

            let export = try await server.request("GET", "/v1/queues/src/archive").expecting(200).validJSON()
            #expect(export.mediaType == "application/json")
            #expect(export.string("format") == "opqd-archive/1")
            #expect(parseTime(export.object["exportedAt"]) != nil)
            let settings = export.object["queue"] as? [String: Any] ?? [:]
            #expect(settings["name"] as? String == "src")
            #expect(settings["maxConcurrentOperationCount"] as? Int == 2)
            #expect(settings["isSuspended"] as? Bool == true)
            let archived = export.objects("operations")
            // Creation order, unfinished only.
            #expect(archived.compactMap { $0["id"] as? String } == [a, b, c, fence, d, e])
            #expect(archived.map { $0["isPaused"] as? Bool } == [false, true, false, false, false, false])
            #expect(archived.last?["dependencies"] as? [String] == [outside, fence])

            let r = try await server.request("POST", "/v1/queues/dst/archive", body: export.body).expecting(201).validJSON()
            #expect(r.headers["location"] == "/v1/queues/dst")
            let map = Self.ids(r)
            #expect(Set(map.keys) == [a, b, c, fence, d, e])
            #expect(Set(map.values).count == 6 && map.values.allSatisfy { !$0.isEmpty && map[$0] == nil })
            #expect(r.object["droppedDependencies"] as? [String] == [])
            let queue = try await server.queue("dst")
            #expect(queue["maxConcurrentOperationCount"] as? Int == 2)
            #expect(queue["isSuspended"] as? Bool == true)
            #expect(queue["operationCount"] as? Int == 6)

            for old in archived {
                let oldID = old["id"] as? String ?? ""
                let new = try await server.operation(map[oldID] ?? "missing")
                #expect(new["queue"] as? String == "dst")
                for key in ["name", "kind", "queuePriority", "isPaused", "attempt", "timeout", "notBefore"] {
                    #expect("\(old[key] ?? "none")" == "\(new[key] ?? "none")", "\(key) of \(oldID)")
                }
                #expect((old["spec"] as? NSDictionary) == (new["spec"] as? NSDictionary), "spec of \(oldID)")
                #expect((old["retry"] as? NSDictionary) == (new["retry"] as? NSDictionary), "retry of \(oldID)")
                let mapped = (old["dependencies"] as? [String] ?? []).map { map[$0] ?? $0 }
                #expect(Set(new["dependencies"] as? [String] ?? []) == Set(mapped), "dependencies of \(oldID)")
            }
            // Spelled out: inside re-pointed, outside kept, the barrier's place kept.
            #expect(try await server.operation(map[b] ?? "")["dependencies"] as? [String] == [map[a] ?? "", outside])
            #expect(try await server.operation(map[a] ?? "")["dependencies"] as? [String] == [map[c] ?? ""])
            #expect(try await server.operation(map[d] ?? "")["dependencies"] as? [String] == [map[fence] ?? ""])
            #expect(try await server.operation(map[b] ?? "")["state"] as? String == "paused")
            #expect(try await server.operation(map[e] ?? "")["dependencies"] as? [String] == [outside, map[fence] ?? ""])
            // The source is untouched.
            #expect(try await server.queue("src")["operationCount"] as? Int == 6)
        }
    }

    @Test("an archive made on another server drops its outside dependencies (ids are per server), listing them; without exportedFrom they are kept")
    func foreignOutsideDependencies() async throws {
        try await withLiveServer { server in
            try await server.createQueue("other", suspended: true)
            let outside = try await server.addDelay("other", seconds: 5)
            try await server.createQueue("src", suspended: true)
            let a = try await server.addDelay("src", seconds: 5, name: "a")
            _ = try await server.addDelay("src", seconds: 5, dependencies: [a, outside], name: "b")
            let export = try await server.request("GET", "/v1/queues/src/archive").expecting(200)
            let here = try #require(export.string("exportedFrom"))
            #expect(!here.isEmpty)
            // The same document, said to come from another server.
            let foreign = export.text.replacingOccurrences(of: "\"exportedFrom\":\"\(here)\"", with: "\"exportedFrom\":\"another-server\"")
            try #require(foreign != export.text)
            let r = try await server.request("POST", "/v1/queues/copy1/archive", json: foreign).expecting(201)
            #expect(r.object["droppedDependencies"] as? [String] == [outside])
            let b1 = try #require(Self.ids(r).first { $0.key != a }?.value)
            #expect(try await server.operation(b1)["dependencies"] as? [String] == [Self.ids(r)[a] ?? ""])
            // From this server: kept.
            let same = try await server.request("POST", "/v1/queues/copy2/archive", body: export.body).expecting(201)
            #expect(same.object["droppedDependencies"] as? [String] == [])
            // Without exportedFrom (written by hand): kept when it exists, as API.md says.
            let bare = export.text.replacingOccurrences(of: "\"exportedFrom\":\"\(here)\",", with: "")
            try #require(bare != export.text)
            let third = try await server.request("POST", "/v1/queues/copy3/archive", json: bare).expecting(201)
            #expect(third.object["droppedDependencies"] as? [String] == [])
            let b3 = try #require(Self.ids(third).first { $0.key != a }?.value)
            #expect((try await server.operation(b3)["dependencies"] as? [String])?.contains(outside) == true)
            expectProblem(
                try await server.request("POST", "/v1/queues/copy4/archive", json: export.text.replacingOccurrences(of: "\"\(here)\"", with: "7")), 422,
                mentioning: ["exportedFrom"])
        }
    }

    @Test("operations of equal priority keep their order: the restored queue starts them first in, first out")
    func orderSurvives() async throws {
        try await withLiveServer { server in
            try await server.createQueue("src", maxConcurrent: 1, suspended: true)
            var names: [String] = []
            for i in 0..<8 {
                names.append("n\(i)")
                _ = try await server.addDelay("src", seconds: 0.01, name: "n\(i)")
            }
            let export = try await server.request("GET", "/v1/queues/src/archive").expecting(200)
            _ = try await server.request("POST", "/v1/queues/dst/archive", body: export.body).expecting(201)
            #expect(try await server.operations(in: "dst").map { $0["name"] as? String } == names)
            _ = try await server.request("POST", "/v1/queues/dst/resume").expecting(200)
            _ = try await server.request("GET", "/v1/queues/dst/wait?timeout=10").expecting(200)
            let started = try await server.operations(in: "dst").map { ($0["name"] as? String ?? "", parseTime($0["startedAt"]) ?? .distantFuture) }
            #expect(started.sorted { $0.1 < $1.1 }.map(\.0) == names)
        }
    }

    @Test("the golden v1 archive restores: every field of the format as released")
    func goldenV1Restores() async throws {
        try await withLiveServer { server in
            let r = try await server.request("POST", "/v1/queues/restored/archive", json: ArchiveFixtures.goldenV1).expecting(201).validJSON()
            let map = Self.ids(r)
            #expect(map.count == 6)
            #expect(r.object["droppedDependencies"] as? [String] == ["op-00000000deadbeef"])
            let queue = try await server.queue("restored")
            #expect(queue["maxConcurrentOperationCount"] as? Int == 1)
            #expect(queue["isSuspended"] as? Bool == true)
            func op(_ old: String) async throws -> [String: Any] { try await server.operation(map[old] ?? "missing \(old)") }
            let fetch = try await op("op-0000000000000010")
            #expect(fetch["name"] as? String == "fetch")
            #expect(fetch["queuePriority"] as? String == "high")
            #expect(fetch["timeout"] as? Double == 30)
            #expect((fetch["retry"] as? NSDictionary) == (["maxAttempts": 4, "backoff": 0.5, "multiplier": 3] as NSDictionary))
            #expect(fetch["notBefore"] as? String == "2031-01-02T03:04:05.000Z")
            #expect(fetch["dependencies"] as? [String] == [map["op-0000000000000013"] ?? ""])
            let parse = try await op("op-0000000000000011")
            #expect(parse["state"] as? String == "paused")
            #expect(parse["queuePriority"] as? String == "veryLow")
            #expect(parse["dependencies"] as? [String] == [map["op-0000000000000010"] ?? ""])
            let retrying = try await op("op-0000000000000012")
            #expect(retrying["attempt"] as? Int == 3)
            let fence = try await op("op-0000000000000014")
            #expect(fence["kind"] as? String == "barrier")
            #expect(Set(fence["dependencies"] as? [String] ?? []) == Set(["10", "11", "12", "13"].compactMap { map["op-00000000000000\($0)"] }))
            let after = try await op("op-0000000000000015")
            #expect(after["kind"] as? String == "external")
            #expect(after["dependencies"] as? [String] == [map["op-0000000000000014"] ?? ""])
            // It runs: the one at its third attempt starts as attempt 3, not 1.
            _ = try await server.request("POST", "/v1/queues/restored/resume").expecting(200)
            #expect(try await server.waitForState(map["op-0000000000000012"] ?? "", "finished"))
            #expect(try await op("op-0000000000000012")["attempt"] as? Int == 3)
            #expect(try await op("op-0000000000000012")["outcome"] as? String == "succeeded")
        }
    }

    @Test("a restore reports like creates: one creation event per operation, then the pause of the paused ones")
    func eventsAsForCreates() async throws {
        try await withLiveServer { server in
            let before = try await server.lastSeq()
            let doc = Self.document(
                [Self.element("a"), Self.element("b", deps: ["a"], extra: #","isPaused":true"#)], queue: #"{"isSuspended":true}"#)
            let map = Self.ids(try await server.request("POST", "/v1/queues/ev/archive", json: doc).expecting(201))
            let events = try await server.request("GET", "/v1/events?after=\(before)").expecting(200).objects("events")
            let seen = events.map { "\($0["operation"] as? String ?? "")|\($0["key"] as? String ?? "")|\($0["new"] ?? "")" }
            let (a, b) = (map["a"] ?? "", map["b"] ?? "")
            #expect(seen == ["\(a)|isReady|1", "\(b)|isReady|0", "\(b)|isPaused|1"])
            #expect(events.allSatisfy { $0["queue"] as? String == "ev" })
        }
    }

    @Test("a restore into a queue with unfinished operations is 409 and changes nothing")
    func nonEmptyQueueIsRefused() async throws {
        try await withLiveServer { server in
            try await server.createQueue("busy", suspended: true)
            _ = try await server.addDelay("busy")
            let before = try await server.fingerprint()
            let r = try await server.request("POST", "/v1/queues/busy/archive", json: Self.document([Self.element("x")], queue: #"{"isSuspended":false}"#))
            expectProblem(r, 409, mentioning: ["busy", "unfinished"])
            #expect(try await server.fingerprint() == before)
            #expect(try await server.queue("busy")["isSuspended"] as? Bool == true)
        }
    }

    @Test("a restore into an existing empty queue applies the archive's settings")
    func emptyQueueTakesTheArchiveSettings() async throws {
        try await withLiveServer { server in
            try await server.createQueue("empty", maxConcurrent: 5)
            let done = try await server.addDelay("empty", seconds: 0.01)
            #expect(try await server.waitForState(done, "finished"))
            let doc = Self.document([Self.element("x")], queue: #"{"name":"elsewhere","maxConcurrentOperationCount":1,"isSuspended":true}"#)
            _ = try await server.request("POST", "/v1/queues/empty/archive", json: doc).expecting(201)
            let q = try await server.queue("empty")
            #expect(q["maxConcurrentOperationCount"] as? Int == 1)
            #expect(q["isSuspended"] as? Bool == true)
            #expect(q["operationCount"] as? Int == 1)
            // The path's name wins over queue.name.
            #expect(try await server.queueNames() == ["empty"])
        }
    }

    @Test("one bad element, anywhere, creates nothing: no queue, no operation, no event")
    func oneBadElementCreatesNothing() async throws {
        try await withLiveServer { server in
            try await server.createQueue("other", suspended: true)
            _ = try await server.addDelay("other")
            let before = try await server.fingerprint()
            let good = [Self.element("a"), Self.element("b", deps: ["a"]), Self.element("c")]
            let r = try await server.request("POST", "/v1/queues/fresh/archive", json: Self.document(good + [Self.element("d", seconds: -1)]))
            expectProblem(r, 422, mentioning: ["operations[3].spec.seconds"])
            _ = try await server.request("GET", "/v1/queues/fresh").expecting(404)
            #expect(try await server.fingerprint() == before)
        }
    }

    /// Damaged or foreign documents and the field each problem must name.
    static let damaged: [(String, String)] = [
        (#"{"queue":{},"operations":[]}"#, "format"),
        (#"{"format":"something-else/1","queue":{},"operations":[]}"#, "format"),
        (#"{"format":"opqd-archive/2","queue":{},"operations":[]}"#, "format"),
        (#"{"format":1,"queue":{},"operations":[]}"#, "format"),
        // Another tool's document: named by its format, not by its first unknown field.
        (#"{"version":2,"items":[{"id":1}]}"#, "format"),
        (#"{"format":"opqd-archive/2","queue":{},"operations":[],"checksum":"x"}"#, "format"),
        ("[]", "body"),
        (#"{"format":"opqd-archive/1","queue":{},"operations":[],"extra":true}"#, "extra"),
        (#"{"format":"opqd-archive/1","exportedAt":"yesterday","queue":{},"operations":[]}"#, "exportedAt"),
        (#"{"format":"opqd-archive/1","operations":[]}"#, "queue"),
        (#"{"format":"opqd-archive/1","queue":[],"operations":[]}"#, "queue"),
        (#"{"format":"opqd-archive/1","queue":{"maxConcurrentOperationCount":"x"},"operations":[]}"#, "queue.maxConcurrentOperationCount"),
        (#"{"format":"opqd-archive/1","queue":{"maxConcurrentOperationCount":0},"operations":[]}"#, "queue.maxConcurrentOperationCount"),
        (#"{"format":"opqd-archive/1","queue":{"isSuspended":"yes"},"operations":[]}"#, "queue.isSuspended"),
        (#"{"format":"opqd-archive/1","queue":{"color":1},"operations":[]}"#, "queue.color"),
        (#"{"format":"opqd-archive/1","queue":{}}"#, "operations"),
        (#"{"format":"opqd-archive/1","queue":{},"operations":{}}"#, "operations"),
        (Self.document(["1"]), "operations[0]"),
        (Self.document([#"{"kind":"delay","spec":{"seconds":1}}"#]), "operations[0].id"),
        (Self.document([#"{"id":7,"kind":"delay","spec":{"seconds":1}}"#]), "operations[0].id"),
        (Self.document([Self.element("a"), Self.element("a")]), "operations[1].id"),
        (Self.document([Self.element("a", extra: #","bogus":1"#)]), "operations[0].bogus"),
        (Self.document([#"{"id":"a","spec":{"seconds":1}}"#]), "operations[0].kind"),
        (Self.document([#"{"id":"a","kind":"teleport"}"#]), "operations[0].kind"),
        (Self.document([Self.element("a"), Self.element("b", seconds: 1e300)]), "operations[1].spec.seconds"),
        (Self.document([Self.element("a", extra: #","isPaused":"yes""#)]), "operations[0].isPaused"),
        (Self.document([Self.element("a", extra: #","attempt":-1"#)]), "operations[0].attempt"),
        (Self.document([Self.element("a", extra: #","attempt":1.5"#)]), "operations[0].attempt"),
        (Self.document([Self.element("a", extra: #","queuePriority":"urgent""#)]), "operations[0].queuePriority"),
        (Self.document([Self.element("a", extra: #","timeout":-3"#)]), "operations[0].timeout"),
        (Self.document([Self.element("a", extra: #","retry":{"maxAttempts":1e30}"#)]), "operations[0].retry.maxAttempts"),
        (Self.document([Self.element("a", extra: #","notBefore":"soon""#)]), "operations[0].notBefore"),
        (Self.document([Self.element("a", extra: #","createdAt":12"#)]), "operations[0].createdAt"),
        (Self.document([Self.element("a", deps: ["nonsense"])]), "operations[0].dependencies[0]"),
        (Self.document([#"{"id":"a","kind":"delay","spec":{"seconds":1},"dependencies":[5]}"#]), "operations[0].dependencies[0]"),
        (Self.document([#"{"id":"a","kind":"delay","spec":{"seconds":1},"dependencies":"b"}"#]), "operations[0].dependencies"),
        (Self.document([Self.element("a", deps: ["b"]), Self.element("b", deps: ["a"])]), "operations[1].dependencies"),
        (Self.document([#"{"id":"f","kind":"barrier","spec":{"seconds":1}}"#]), "operations[0].spec"),
    ]

    @Test(
        "a damaged or foreign document is 422 naming the field",
        arguments: ArchiveEndpointTests.damaged)
    func damagedDocuments(body: String, field: String) async throws {
        try await withLiveServer { server in
            let r = try await server.request("POST", "/v1/queues/target/archive", json: body)
            expectProblem(r, 422, mentioning: [field])
            _ = try await server.request("GET", "/v1/queues/target").expecting(404)
        }
    }

    @Test("the archive of an unknown queue is 404; a query parameter is 422")
    func unknownQueue() async throws {
        try await withLiveServer { server in
            expectProblem(try await server.request("GET", "/v1/queues/nope/archive"), 404, mentioning: ["nope"])
            try await server.createQueue("q")
            expectProblem(try await server.request("GET", "/v1/queues/q/archive?full=1"), 422, mentioning: ["full"])
        }
    }

    @Test("past --max-batch operations or --max-body bytes an archive is refused with 422 naming the limit")
    func limits() async throws {
        try await withLiveServer({ $0.limits.batch = 3 }) { server in
            try await server.createQueue("big", suspended: true)
            for _ in 0..<4 { _ = try await server.addDelay("big") }
            expectProblem(try await server.request("GET", "/v1/queues/big/archive"), 422, mentioning: ["--max-batch", "4"])
            let four = Self.document((0..<4).map { Self.element("e\($0)") })
            expectProblem(try await server.request("POST", "/v1/queues/new/archive", json: four), 422, mentioning: ["--max-batch"])
            _ = try await server.request("GET", "/v1/queues/new").expecting(404)
        }
        // Five operations of ~400 bytes: more than a restore on this server could read.
        try await withLiveServer({ $0.maxBody = 1024 }) { server in
            try await server.createQueue("wide", suspended: true)
            let name = String(repeating: "n", count: 250)
            for _ in 0..<5 { _ = try await server.addDelay("wide", name: name) }
            expectProblem(try await server.request("GET", "/v1/queues/wide/archive"), 422, mentioning: ["--max-body", "1024"])
        }
    }
}

/// The archive between real `opqd` processes: the operator's CLI and a kill -9 after a restore.
@Suite("Queue archive across processes")
struct ArchiveProcessTests {
    /// Runs `opqd archive <arguments>` with `stdin` (a file) and returns its exit code, stdout and stderr.
    static func cli(_ binary: String, _ arguments: [String], stdin: String? = nil, scratch: String) throws -> (code: Int32?, out: String, err: String) {
        let errPath = scratch + "/cli-\(UInt32.random(in: 0...UInt32.max)).err"
        // `$1` is the file for stdin; the rest are the command's arguments.
        let script = #"f="$1"; shift; exec "$0" archive "$@" < "$f""#
        let (code, out) = try ChildProcess.capture(
            "/bin/sh", ["-c", script, binary, stdin ?? "/dev/null"] + arguments, stderr: .file(errPath, append: false))
        let err = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
        return (code, String(decoding: out, as: UTF8.self), err)
    }

    @Test("opqd archive export from one server and import into another, with a token, as real processes")
    func cliAcrossTwoServers() async throws {
        let binary = try OpqdBinary.locate()
        let scratch = try makeTemporaryDirectory(prefix: "opqd-archive-cli")
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        try await onThread {
            let source = try ServerProcess(binary: binary, data: scratch + "/a", logPath: scratch + "/a.log")
            let target = try ServerProcess(binary: binary, data: scratch + "/b", logPath: scratch + "/b.log", extraArguments: ["--token", "s3cret"])
            defer {
                source.signal(SIGTERM)
                target.signal(SIGTERM)
                _ = source.waitForExit(timeout: 10)
                _ = target.waitForExit(timeout: 10)
            }
            _ = try source.request("POST", "/v1/queues", json: #"{"name":"jobs","maxConcurrentOperationCount":3,"isSuspended":true}"#).expecting(201)
            let first =
                try source.request("POST", "/v1/queues/jobs/operations", json: #"{"kind":"delay","spec":{"seconds":5},"name":"first"}"#)
                .expecting(201).string("id") ?? ""
            let second =
                try source.request(
                    "POST", "/v1/queues/jobs/operations",
                    json: #"{"kind":"delay","spec":{"seconds":5},"name":"second","queuePriority":"veryHigh","dependencies":["\#(first)"]}"#
                ).expecting(201).string("id") ?? ""
            _ = try source.request("POST", "/v1/operations/\(second)/pause").expecting(200)

            let exported = try Self.cli(binary, ["export", "--url", "http://127.0.0.1:\(source.port)", "--queue", "jobs"], scratch: scratch)
            #expect(exported.code == 0, "stderr: \(exported.err)")
            #expect(exported.out.contains(#""format":"opqd-archive/1""#))
            let file = scratch + "/jobs.json"
            try exported.out.write(toFile: file, atomically: true, encoding: .utf8)

            // Refused without the token: non-zero, the problem's detail on stderr, nothing on stdout.
            let refused = try Self.cli(binary, ["import", "--url", "http://127.0.0.1:\(target.port)", "--queue", "moved"], stdin: file, scratch: scratch)
            #expect(refused.code == 1)
            #expect(refused.err.contains("401") && refused.err.contains("Authorization"), "stderr: \(refused.err)")
            #expect(refused.out.isEmpty)

            let imported = try Self.cli(
                binary, ["import", "--url", "http://127.0.0.1:\(target.port)", "--queue", "moved", "--token", "s3cret"], stdin: file, scratch: scratch)
            #expect(imported.code == 0, "stderr: \(imported.err)")
            let answer = try JSONSerialization.jsonObject(with: Data(imported.out.utf8)) as? [String: Any] ?? [:]
            let ids = answer["ids"] as? [String: String] ?? [:]
            #expect(Set(ids.keys) == [first, second])

            let client = KeepAliveClient(port: target.port)
            let auth = ["Authorization": "Bearer s3cret"]
            let queue = try client.request("GET", "/v1/queues/moved", headers: auth).expecting(200)
            #expect(queue.int("maxConcurrentOperationCount") == 3)
            #expect(queue.bool("isSuspended") == true)
            let moved = try client.request("GET", "/v1/operations/\(ids[second] ?? "")", headers: auth).expecting(200)
            #expect(moved.string("name") == "second")
            #expect(moved.string("state") == "paused")
            #expect(moved.string("queuePriority") == "veryHigh")
            #expect(moved.object["dependencies"] as? [String] == [ids[first] ?? ""])

            // The same import again (its answer lost, say): the first answer and id map come
            // back (the CLI sends an Idempotency-Key of the document), nothing is restored twice.
            let again = try Self.cli(
                binary, ["import", "--url", "http://127.0.0.1:\(target.port)", "--queue", "moved", "--token", "s3cret"], stdin: file, scratch: scratch)
            #expect(again.code == 0, "stderr: \(again.err)")
            let replayed = (try JSONSerialization.jsonObject(with: Data(again.out.utf8)) as? [String: Any])?["ids"] as? [String: String]
            #expect(replayed == ids)
            #expect(try client.request("GET", "/v1/queues/moved", headers: auth).expecting(200).int("operationCount") == 2)
            // Another document into the now busy queue: 409 on stderr and exit 1.
            let other = scratch + "/other.json"
            try (String(contentsOfFile: file, encoding: .utf8) + "\n").write(toFile: other, atomically: true, encoding: .utf8)
            let busy = try Self.cli(
                binary, ["import", "--url", "http://127.0.0.1:\(target.port)", "--queue", "moved", "--token", "s3cret"], stdin: other, scratch: scratch)
            #expect(busy.code == 1)
            #expect(busy.err.contains("409"), "stderr: \(busy.err)")
            // A bad command line is 2.
            let bad = try Self.cli(binary, ["export", "--url", "http://127.0.0.1:\(source.port)", "--queue", "a/b"], scratch: scratch)
            #expect(bad.code == 2)
        }
    }

    @Test("a restore acknowledged with 201 survives kill -9 whole: queue, operations, dependencies, paused flags, attempts")
    func survivesKillNine() async throws {
        let binary = try OpqdBinary.locate()
        let scratch = try makeTemporaryDirectory(prefix: "opqd-archive-kill")
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        try await onThread {
            let server = try ServerProcess(binary: binary, data: scratch + "/data", logPath: scratch + "/0.log")
            var elements: [String] = []
            for i in 0..<300 {
                elements.append(
                    ArchiveEndpointTests.element(
                        "old\(i)", deps: i > 0 ? ["old\(i - 1)"] : [], extra: #","name":"n\#(i)","isPaused":\#(i % 3 == 0),"attempt":\#(i % 4)"#))
            }
            let doc = ArchiveEndpointTests.document(elements, queue: #"{"maxConcurrentOperationCount":2,"isSuspended":true}"#)
            let r = try server.request("POST", "/v1/queues/restored/archive", json: doc).expecting(201)
            let ids = r.object["ids"] as? [String: String] ?? [:]
            #expect(ids.count == 300)
            // No pause: the answer was sent only after the commit.
            server.signal(SIGKILL)
            #expect(server.waitForExit(timeout: 10) == .signaled(SIGKILL))

            let again = try ServerProcess(binary: binary, data: scratch + "/data", logPath: scratch + "/1.log")
            defer {
                again.signal(SIGTERM)
                _ = again.waitForExit(timeout: 10)
            }
            let queue = try again.request("GET", "/v1/queues/restored").expecting(200)
            #expect(queue.int("operationCount") == 300)
            #expect(queue.int("maxConcurrentOperationCount") == 2)
            #expect(queue.bool("isSuspended") == true)
            for i in 0..<300 {
                let s = try again.request("GET", "/v1/operations/\(ids["old\(i)"] ?? "")").expecting(200, "element \(i) after the restart")
                #expect(s.string("name") == "n\(i)")
                #expect(s.bool("isPaused") == (i % 3 == 0))
                #expect(s.int("attempt") == i % 4)
                if i > 0 { #expect(s.object["dependencies"] as? [String] == [ids["old\(i - 1)"] ?? ""]) }
            }
        }
    }
}
