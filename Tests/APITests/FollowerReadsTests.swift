import Foundation
import Locking
import QueueTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A follower answers an operation's status and history, and the queues' statuses, from
/// PostgreSQL itself (CLUSTER.md: reads that need no owner): the same status, body bytes and
/// headers as the owner, the same refusals, and it keeps answering while no instance owns the
/// queues.
@Suite("A cluster follower's reads from PostgreSQL (the real binary)")
struct FollowerReadsTests {
    static let token = "write-token-0123456789"
    static let readToken = "read-token-0123456789"

    /// An owner and a follower on one fresh database, with tokens; `body` gets them and the URL.
    static func withPair(lease: Int, _ body: @escaping @Sendable (ServerProcess, ServerProcess, String) throws -> Void) async throws {
        let binary = try OpqdBinary.locate()
        let url = try TestPostgres.createDatabase()
        let logs = try makeTemporaryDirectory(prefix: "opqd-pg-reads")
        defer {
            TestPostgres.dropDatabase(url)
            try? FileManager.default.removeItem(atPath: logs)
        }
        try await onThread {
            // The one-owner cluster (`--ownership one`): one instance owns every queue, the other is a follower.
            let arguments = ["--store", url, "--ownership", "one", "--lease", String(lease), "--token", token, "--read-token", readToken]
            let owner = try ServerProcess(binary: binary, data: logs + "/a", logPath: logs + "/owner.log", extraArguments: arguments)
            defer {
                owner.signal(SIGTERM)
                _ = owner.waitForExit(timeout: 10)
            }
            try awaitRole(owner, owner: true)
            let follower = try ServerProcess(binary: binary, data: logs + "/b", logPath: logs + "/follower.log", extraArguments: arguments)
            defer {
                follower.signal(SIGTERM)
                _ = follower.waitForExit(timeout: 10)
            }
            try awaitRole(follower, owner: false)
            try body(owner, follower, url)
        }
    }

    /// Waits until `server` reports itself as the owner (or as a follower that sees an owner).
    static func awaitRole(_ server: ServerProcess, owner: Bool) throws {
        let client = KeepAliveClient(port: server.port)
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            if let view = try? client.request("GET", "/v1/cluster", headers: auth(readToken)), view.status == 200 {
                let instances = view.objects("instances")
                let me = instances.first { $0["self"] as? Bool == true }
                if me?["owner"] as? Bool == owner && instances.contains(where: { $0["owner"] as? Bool == true }) { return }
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        throw Unexpected("opqd on port \(server.port) did not become \(owner ? "the owner" : "a follower") within 15 s")
    }

    static func auth(_ token: String) -> [String: String] { ["Authorization": "Bearer \(token)"] }

    /// The follower's count of requests it relayed to the owner.
    static func relayed(_ follower: KeepAliveClient) throws -> Int {
        let text = try follower.request("GET", "/metrics", headers: auth(readToken)).expecting(200).text
        let line = text.split(separator: "\n").first { $0.hasPrefix(#"opqd_forwarded_requests_total{outcome="forwarded"} "#) }
        return line.flatMap { Int($0.split(separator: " ").last ?? "") } ?? -1
    }

    /// The answers that matter of one GET, owner's and follower's: status, body, and the headers a
    /// client acts on.
    static func compare(_ path: String, headers: [String: String], owner: KeepAliveClient, follower: KeepAliveClient) throws {
        let a = try owner.request("GET", path, headers: headers)
        let b = try follower.request("GET", path, headers: headers)
        #expect(a.status == b.status, "\(path): owner \(a.status), follower \(b.status)")
        #expect(withoutWaitingOn(a.text) == withoutWaitingOn(b.text), "\(path):\nowner    \(a.text)\nfollower \(b.text)")
        for name in ["content-type", "etag", "retry-after", "www-authenticate", "allow", "location"] {
            let owners = name == "etag" ? a.headers[name].map(withoutWaitingOnTag) : a.headers[name]
            let followers = name == "etag" ? b.headers[name].map(withoutWaitingOnTag) : b.headers[name]
            #expect(owners == followers, "\(path): \(name) owner \(a.headers[name] ?? "-"), follower \(b.headers[name] ?? "-")")
        }
    }

    /// The one designed difference (README, "Limiters and a cluster"): a follower answers from
    /// the committed row, and `waitingOn` is the holder's engine's alone. Everything else is the
    /// same byte for byte.
    static func withoutWaitingOn(_ text: String) -> String {
        var out = text
        while true {
            let next = withoutFirstWaitingOn(out)
            if next == out { return out }
            out = next
        }
    }

    static func withoutFirstWaitingOn(_ text: String) -> String {
        guard let start = text.range(of: #","waitingOn":["#) else { return text }
        var depth = 0
        var i = start.upperBound
        while i < text.endIndex {
            let c = text[i]
            if c == "[" { depth += 1 }
            if c == "]" {
                if depth == 0 { return String(text[..<start.lowerBound]) + String(text[text.index(after: i)...]) }
                depth -= 1
            }
            i = text.index(after: i)
        }
        return text
    }

    /// `"r7-w…"` less its `waitingOn` part: `"r7"`.
    static func withoutWaitingOnTag(_ tag: String) -> String {
        guard let w = tag.range(of: "-w") else { return tag }
        return String(tag[..<w.lowerBound]) + "\""
    }

    @Test("the follower answers an operation's status and history itself, byte for byte as the owner, refusals included")
    func sameAnswersAsTheOwner() async throws {
        try await Self.withPair(lease: 1) { ownerProcess, followerProcess, _ in
            let owner = KeepAliveClient(port: ownerProcess.port)
            let follower = KeepAliveClient(port: followerProcess.port)
            let write = Self.auth(Self.token)
            func post(_ path: String, _ body: String) throws -> TestResponse {
                try owner.request("POST", path, body: Array(body.utf8), headers: write)
            }
            _ = try post("/v1/queues", #"{"name":"reads","maxConcurrentOperationCount":1}"#).expecting(201)
            // Finished (succeeded), with a name that is not plain ASCII and a retry policy.
            let done =
                try post(
                    "/v1/queues/reads/operations",
                    #"{"kind":"delay","name":"n\u0000ä ☃","spec":{"seconds":0.01},"retry":{"maxAttempts":2,"backoff":0.5,"multiplier":1.5},"timeout":30}"#
                ).expecting(201).string("id") ?? ""
            _ = try owner.request("GET", "/v1/operations/\(done)/wait?timeout=10", headers: write).expecting(200)
            // Executing (external, claimed, with progress), one pending behind it, one cancelled.
            let external = try post("/v1/queues/reads/operations", #"{"kind":"external","spec":{"lease":60}}"#).expecting(201).string("id") ?? ""
            let claim = try post("/v1/queues/reads/claim?wait=5", #"{"worker":"w"}"#).expecting(200)
            let lease = (claim.object["lease"] as? [String: Any])?["token"] as? String ?? ""
            _ = try post("/v1/operations/\(external)/progress", #"{"leaseToken":"\#(lease)","completed":3,"total":4}"#).expecting(200)
            let pending =
                try post(
                    "/v1/queues/reads/operations", #"{"kind":"delay","queuePriority":"high","dependencies":["\#(external)"],"spec":{"seconds":1}}"#
                ).expecting(201).string("id") ?? ""
            let cancelled =
                try post("/v1/queues/reads/operations", #"{"kind":"delay","spec":{"seconds":1},"notBefore":"2030-01-01T00:00:00Z"}"#)
                .expecting(201).string("id") ?? ""
            _ = try post("/v1/operations/\(cancelled)/cancel", "").expecting(200)
            let seqs = try owner.request("GET", "/v1/operations/\(done)/events", headers: write).expecting(200).objects("events").compactMap {
                $0["seq"] as? Int
            }
            #expect(seqs.count >= 4)
            let middle = seqs.count > 1 ? seqs[1] : 0

            var paths: [String] = []
            for id in [done, external, pending, cancelled] {
                paths += ["/v1/operations/\(id)", "/v1/operations/\(id)/events"]
            }
            paths += [
                "/v1/operations/\(done)/events?limit=1", "/v1/operations/\(done)/events?after=\(middle)&limit=2",
                "/v1/operations/\(done)/events?after=\(seqs.last ?? 0)", "/v1/operations/\(done)/events?after=9223372036854775807",
                "/v1/operations/\(done)/events?limit=0", "/v1/operations/\(done)/events?limit=10001", "/v1/operations/\(done)/events?limit=x",
                "/v1/operations/\(done)/events?after=-1", "/v1/operations/\(done)/events?after=99999999999999999999",
                "/v1/operations/\(done)/events?wait=1", "/v1/operations/\(done)/events?limit=1&limit=2", "/v1/operations/\(done)?after=1",
                "/v1/operations/\(done)?", "/v1/operations/op-00000000000fffff", "/v1/operations/op-00000000000fffff/events",
                "/v1/operations/op-0000000000000000", "/v1/operations/op-ffffffffffffffff", "/v1/operations/op-8000000000000000/events",
                "/v1/operations/OP-0000000000000001", "/v1/operations/zzz", "/v1/operations/zzz/events", "/v1/operations/zzz?bad=1",
                "/v1/operations/%00", "/v1/operations/op-000000000000000g", "/v1/operations/\(done)x",
                "/v1/operations/op-00000000000fffff/events?limit=0",
            ]
            let before = try Self.relayed(follower)
            for path in paths {
                try Self.compare(path, headers: Self.auth(Self.readToken), owner: owner, follower: follower)
            }
            // Tokens: none, a wrong one, the full one.
            for headers in [[:], Self.auth("wrong"), write] {
                try Self.compare("/v1/operations/\(done)", headers: headers, owner: owner, follower: follower)
                try Self.compare("/v1/operations/\(done)/events", headers: headers, owner: owner, follower: follower)
            }
            // Conditional GETs: the owner's ETag gets 304 from the follower too; a stale one the status.
            let etag = try owner.request("GET", "/v1/operations/\(done)", headers: write).headers["etag"] ?? ""
            #expect(etag.hasPrefix("\"r"))
            for tag in [etag, "W/\(etag)", "\"r1\", \(etag)", "*", "\"r1\""] {
                var headers = Self.auth(Self.readToken)
                headers["If-None-Match"] = tag
                try Self.compare("/v1/operations/\(done)", headers: headers, owner: owner, follower: follower)
            }
            // Many readers at once (the follower's read connections are shared): every answer whole.
            let expected = try owner.request("GET", "/v1/operations/\(done)", headers: write).text
            let wrong = Locking.Lock(0)
            DispatchQueue.concurrentPerform(iterations: 8) { _ in
                let client = KeepAliveClient(port: followerProcess.port)
                for _ in 0..<25 {
                    let r = try? client.request("GET", "/v1/operations/\(done)", headers: Self.auth(Self.readToken))
                    if r?.status != 200 || r?.text != expected { wrong.withLock { $0 += 1 } }
                }
            }
            #expect(wrong.withLock { $0 } == 0)
            #expect(try Self.relayed(follower) == before, "the follower answered every operation read itself")

            // Queue statuses: from the queues' rows, the same bytes and ETags as the owner's, for
            // queues in every state (names that sort differently bytewise and by a locale).
            _ = try post("/v1/queues", #"{"name":"Zeta.held","isSuspended":true}"#).expecting(201)
            _ = try post("/v1/queues/Zeta.held/operations", #"{"kind":"delay","spec":{"seconds":1}}"#).expecting(201)
            _ = try post("/v1/queues", #"{"name":"alpha_empty","maxConcurrentOperationCount":-1}"#).expecting(201)
            let queuePaths = [
                "/v1/queues", "/v1/queues/reads", "/v1/queues/Zeta.held", "/v1/queues/alpha_empty", "/v1/queues?limit=1",
                "/v1/queues?after=Zeta.held", "/v1/queues?after=reads&limit=5", "/v1/queues?after=zzz", "/v1/queues?limit=0",
                "/v1/queues?limit=100001", "/v1/queues?limit=x", "/v1/queues?wait=1", "/v1/queues?limit=1&limit=2", "/v1/queues/reads?x=1",
                "/v1/queues/nope", "/v1/queues/%00", "/v1/queues/a%20b", "/v1/queues/\(String(repeating: "q", count: 65))",
                "/v1/queues/\(String(repeating: "q", count: 64))", "/v1/queues/READS", "/v1/queues/reads%2F",
            ]
            for path in queuePaths {
                try Self.compare(path, headers: Self.auth(Self.readToken), owner: owner, follower: follower)
            }
            for headers in [[:], Self.auth("wrong"), write] {
                try Self.compare("/v1/queues/reads", headers: headers, owner: owner, follower: follower)
                try Self.compare("/v1/queues", headers: headers, owner: owner, follower: follower)
            }
            let queueTag = try owner.request("GET", "/v1/queues/reads", headers: write).expecting(200).headers["etag"] ?? ""
            let listTag = try owner.request("GET", "/v1/queues", headers: write).expecting(200).headers["etag"] ?? ""
            #expect(queueTag.hasPrefix("\"q") && listTag.hasPrefix("\"l"))
            for (path, tag) in [("/v1/queues/reads", queueTag), ("/v1/queues", listTag)] {
                for candidate in [tag, "W/\(tag)", "\"x\", \(tag)", "*", "\"x\"", listTag == tag ? queueTag : listTag] {
                    var headers = Self.auth(Self.readToken)
                    headers["If-None-Match"] = candidate
                    try Self.compare(path, headers: headers, owner: owner, follower: follower)
                }
                var headers = Self.auth(Self.readToken)
                headers["If-None-Match"] = tag
                #expect(try follower.request("GET", path, headers: headers).status == 304, "\(path)")
            }
            #expect(try Self.relayed(follower) == before, "the follower answered every queue status itself")
            // A change moves the queue's revision and its stored status: the follower, reading
            // after the owner's answer, no longer matches the old ETag.
            _ = try post("/v1/queues/Zeta.held/resume", "").expecting(200)
            var stale = Self.auth(Self.readToken)
            stale["If-None-Match"] = listTag
            #expect(try follower.request("GET", "/v1/queues", headers: stale).status == 200)
            // The delay runs and finishes; its finish is committed right after the owner's memory
            // shows it, so the follower is given a moment to read it.
            _ = try owner.request("GET", "/v1/queues/Zeta.held/wait?timeout=10", headers: write).expecting(200)
            let settled = try owner.request("GET", "/v1/queues/Zeta.held", headers: write).expecting(200)
            #expect(settled.object["operationCount"] as? Int == 0, "\(settled.text)")
            let deadline = Date().addingTimeInterval(5)
            while try follower.request("GET", "/v1/queues/Zeta.held", headers: write).text != settled.text && Date() < deadline {
                Thread.sleep(forTimeInterval: 0.05)
            }
            for path in ["/v1/queues", "/v1/queues/Zeta.held"] {
                try Self.compare(path, headers: Self.auth(Self.readToken), owner: owner, follower: follower)
            }
            #expect(try Self.relayed(follower) == before)

            // What is still relayed comes back the same too (queue-scoped reads the follower does
            // not answer, and methods it does not answer on these paths).
            for path in ["/v1/queues/reads/operations", "/v1/queues/nope/operations"] {
                try Self.compare(path, headers: Self.auth(Self.readToken), owner: owner, follower: follower)
            }
            #expect(try Self.relayed(follower) == before + 2)
            let refused = try follower.request("PATCH", "/v1/operations/\(done)", body: Array("{}".utf8), headers: Self.auth(Self.readToken))
            #expect(refused.status == 403)
            let patched = try follower.request("PATCH", "/v1/operations/\(pending)", body: Array(#"{"queuePriority":"low"}"#.utf8), headers: write)
            #expect(patched.status == 200, "\(patched)")
            // The change was committed before the answer: the follower reads it at once.
            let after = try follower.request("GET", "/v1/operations/\(pending)", headers: write).expecting(200)
            #expect(after.string("queuePriority") == "low")
            #expect(after.text == Self.withoutWaitingOn(patched.text))
        }
    }

    @Test("with its owner killed, the follower still answers an operation's status and history before any takeover")
    func answersWithoutAnOwner() async throws {
        // A long lease: nobody takes over while the reads below run.
        try await Self.withPair(lease: 10) { ownerProcess, followerProcess, _ in
            let owner = KeepAliveClient(port: ownerProcess.port)
            let follower = KeepAliveClient(port: followerProcess.port)
            let (write, read) = (Self.auth(Self.token), Self.auth(Self.readToken))
            _ = try owner.request("POST", "/v1/queues", body: Array(#"{"name":"solo"}"#.utf8), headers: write).expecting(201)
            let id =
                try owner.request("POST", "/v1/queues/solo/operations", body: Array(#"{"kind":"delay","spec":{"seconds":0}}"#.utf8), headers: write)
                .expecting(201).string("id") ?? ""
            let status = try owner.request("GET", "/v1/operations/\(id)/wait?timeout=10", headers: write).expecting(200)
            #expect(status.string("state") == "finished")
            let history = try owner.request("GET", "/v1/operations/\(id)/events", headers: write).expecting(200)
            let solo = try owner.request("GET", "/v1/queues/solo", headers: write).expecting(200)
            let all = try owner.request("GET", "/v1/queues", headers: write).expecting(200)

            kill(ownerProcess.pid, SIGKILL)
            _ = ownerProcess.waitForExit(timeout: 10)
            let got = try follower.request("GET", "/v1/operations/\(id)", headers: read)
            #expect(got.status == 200)
            #expect(got.text == status.text)
            #expect(got.headers["etag"] == status.headers["etag"])
            let events = try follower.request("GET", "/v1/operations/\(id)/events", headers: read)
            #expect(events.status == 200)
            #expect(events.text == history.text)
            #expect(try follower.request("GET", "/v1/operations/op-00000000000fffff", headers: read).status == 404)
            // Queue statuses too, as the owner last answered them.
            for (path, answer) in [("/v1/queues/solo", solo), ("/v1/queues", all)] {
                let got = try follower.request("GET", path, headers: read)
                #expect(got.status == 200)
                #expect(got.text == answer.text)
                #expect(got.headers["etag"] == answer.headers["etag"])
            }
            // No owner answers meanwhile: what is relayed gets 503 with Retry-After.
            let queue = try follower.request("GET", "/v1/queues/solo/operations", headers: read)
            #expect(queue.status == 503, "\(queue)")
            #expect(queue.headers["retry-after"] != nil)
            let view = try follower.request("GET", "/v1/cluster", headers: read).expecting(200)
            #expect(view.objects("instances").first { $0["self"] as? Bool == true }?["owner"] as? Bool == false, "no takeover yet")
        }
    }

    @Test("when PostgreSQL refuses the follower, its reads answer 503 with Retry-After, and work again once it is back")
    func unreachableStore() async throws {
        try await Self.withPair(lease: 10) { ownerProcess, followerProcess, url in
            let owner = KeepAliveClient(port: ownerProcess.port)
            let follower = KeepAliveClient(port: followerProcess.port)
            let (write, read) = (Self.auth(Self.token), Self.auth(Self.readToken))
            _ = try owner.request("POST", "/v1/queues", body: Array(#"{"name":"gone"}"#.utf8), headers: write).expecting(201)
            let id =
                try owner.request("POST", "/v1/queues/gone/operations", body: Array(#"{"kind":"external","spec":{"lease":60}}"#.utf8), headers: write)
                .expecting(201).string("id") ?? ""
            _ = try follower.request("GET", "/v1/operations/\(id)", headers: read).expecting(200)
            // No new connection to the database, and every open one ended.
            guard let server = TestPostgres.serverURL, let name = url.split(separator: "/").last.map(String.init) else { return }
            try TestPostgres.psql(server, "ALTER DATABASE \(name) ALLOW_CONNECTIONS false")
            try TestPostgres.psql(server, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '\(name)'")
            for path in ["/v1/operations/\(id)", "/v1/operations/\(id)/events", "/v1/queues/gone", "/v1/queues"] {
                let r = try follower.request("GET", path, headers: read)
                #expect(r.status == 503, "\(r)")
                #expect(r.headers["retry-after"] == "1")
                #expect(r.mediaType == "application/problem+json")
                #expect(r.string("type")?.hasSuffix("store-unavailable") == true, "\(r)")
            }
            #expect(try follower.request("GET", "/v1/operations/zzz", headers: read).status == 404, "a malformed id is refused without PostgreSQL")
            #expect(try follower.request("GET", "/v1/queues/a%00", headers: read).status == 404, "a name no queue can have too")
            #expect(try follower.request("GET", "/v1/queues?limit=0", headers: read).status == 422, "bad parameters too")
            try TestPostgres.psql(server, "ALTER DATABASE \(name) ALLOW_CONNECTIONS true")
            // As a client would: retry after the Retry-After (reads fail fast for half a second
            // after a failed one).
            var back = try follower.request("GET", "/v1/operations/\(id)", headers: read)
            let deadline = Date().addingTimeInterval(5)
            while back.status == 503 && Date() < deadline {
                Thread.sleep(forTimeInterval: 0.2)
                back = try follower.request("GET", "/v1/operations/\(id)", headers: read)
            }
            #expect(back.status == 200, "\(back)")
            #expect(back.string("id") == id)
        }
    }

    @Test("after the owner stops, the next owner's queue revisions are larger, stored at once, and read alike by a new follower")
    func revisionsMoveOnAcrossOwners() async throws {
        let binary = try OpqdBinary.locate()
        let url = try TestPostgres.createDatabase()
        let logs = try makeTemporaryDirectory(prefix: "opqd-pg-revisions")
        defer {
            TestPostgres.dropDatabase(url)
            try? FileManager.default.removeItem(atPath: logs)
        }
        try await onThread {
            let arguments = ["--store", url, "--ownership", "one", "--lease", "1", "--token", Self.token, "--read-token", Self.readToken]
            let (write, read) = (Self.auth(Self.token), Self.auth(Self.readToken))
            var processes: [ServerProcess] = []
            defer {
                for p in processes {
                    p.signal(SIGTERM)
                    _ = p.waitForExit(timeout: 10)
                }
            }
            func start(_ name: String, owner: Bool) throws -> ServerProcess {
                let p = try ServerProcess(binary: binary, data: logs + "/" + name, logPath: logs + "/\(name).log", extraArguments: arguments)
                processes.append(p)
                try Self.awaitRole(p, owner: owner)
                return p
            }
            let first = try start("a", owner: true)
            let second = try start("b", owner: false)
            let owner = KeepAliveClient(port: first.port)
            _ = try owner.request("POST", "/v1/queues", body: Array(#"{"name":"kept","maxConcurrentOperationCount":1}"#.utf8), headers: write)
                .expecting(201)
            for _ in 0..<3 {
                _ = try owner.request("POST", "/v1/queues/kept/operations", body: Array(#"{"kind":"external","spec":{"lease":60}}"#.utf8), headers: write)
                    .expecting(201)
            }
            let before = try owner.request("GET", "/v1/queues/kept", headers: read).expecting(200)
            let listBefore = try owner.request("GET", "/v1/queues", headers: read).expecting(200)
            let revision = before.object["revision"] as? Int ?? 0
            #expect(revision > 4, "\(before.text)")

            // The owner stops cleanly; the follower takes the queues over (a new process image).
            first.signal(SIGTERM)
            #expect(first.waitForExit(timeout: 10) != nil)
            try Self.awaitRole(second, owner: true)
            let newOwner = KeepAliveClient(port: second.port)
            let after = try newOwner.request("GET", "/v1/queues/kept", headers: read).expecting(200)
            #expect((after.object["revision"] as? Int ?? 0) > revision, "\(before.text) then \(after.text)")
            #expect(after.object["counts"] as? NSDictionary == before.object["counts"] as? NSDictionary)
            #expect(after.headers["etag"] != before.headers["etag"])
            var stale = read
            stale["If-None-Match"] = before.headers["etag"] ?? ""
            #expect(try newOwner.request("GET", "/v1/queues/kept", headers: stale).status == 200)
            stale["If-None-Match"] = listBefore.headers["etag"] ?? ""
            #expect(try newOwner.request("GET", "/v1/queues", headers: stale).status == 200)

            // A new follower, with no change made since the takeover: it reads the new owner's
            // revision from the row (the restart's bump was stored at once), byte for byte.
            let third = try start("c", owner: false)
            let follower = KeepAliveClient(port: third.port)
            let relayed = try Self.relayed(follower)
            let deadline = Date().addingTimeInterval(5)
            while try follower.request("GET", "/v1/queues/kept", headers: read).text != after.text && Date() < deadline {
                Thread.sleep(forTimeInterval: 0.1)
            }
            for path in ["/v1/queues/kept", "/v1/queues"] {
                try Self.compare(path, headers: read, owner: newOwner, follower: follower)
            }
            var fresh = read
            fresh["If-None-Match"] = after.headers["etag"] ?? ""
            #expect(try follower.request("GET", "/v1/queues/kept", headers: fresh).status == 304)
            #expect(try Self.relayed(follower) == relayed)
        }
    }
}
