import Foundation
import QueueTesting
import Testing

/// Admission through HTTP (API.md "Admission: debounce and singleton"): the answers, their
/// timing by the server's own clock, refusals that change nothing, batches, schedules'
/// templates, and the durability of every outcome across kill -9.
@Suite("Admission over HTTP")
struct AdmissionEndpointTests {
    static func body(_ spec: String, _ admission: String, kind: String = "delay") -> String {
        #"{"kind":"\#(kind)","spec":\#(spec),"admission":\#(admission)}"#
    }

    @Test("debounce: 201 created, then 200 merged with the latest spec, started after the quiet time")
    func debounce() async throws {
        try await withLiveServer { server in
            try await server.createQueue("sync", maxConcurrent: 10)
            // A quiet time no create of this test takes, however loaded the machine: every
            // create below comes before the operation may start, and merges.
            let d = #"{"debounce":{"key":"user-42","seconds":60}}"#
            let first = try await server.request("POST", "/v1/queues/sync/operations", json: Self.body(#"{"seconds":0.01}"#, d))
            #expect(first.status == 201 && first.string("admission") == "created" && first.string("state") == "pending", "\(first.text)")
            let id = try #require(first.string("id"))
            let createdAt = try #require(parseTime(first.object["createdAt"]))
            #expect(first.headers["location"] == "/v1/operations/\(id)")
            var last = first
            for n in 2...4 {
                let r = try await server.request("POST", "/v1/queues/sync/operations", json: Self.body(#"{"seconds":0.0\#(n)}"#, d))
                #expect(r.status == 200 && r.string("admission") == "merged" && r.string("id") == id, "\(r.text)")
                #expect(r.headers["location"] == "/v1/operations/\(id)")
                // Each merge moves the start later: 60 s after it.
                #expect((parseTime(r.object["notBefore"]) ?? .distantPast) >= (parseTime(last.object["notBefore"]) ?? .distantFuture))
                last = r
            }
            #expect((last.object["spec"] as? [String: Any])?["seconds"] as? Double == 0.04, "the latest spec wins")
            let moved = try #require(parseTime(last.object["notBefore"]))
            #expect(moved.timeIntervalSince(createdAt) >= 60 && moved.timeIntervalSince(createdAt) <= 600, "within the cap of 10 × 60 s")
            #expect(try await server.operations(in: "sync").count == 1, "one operation for four creates")

            // A short quiet time: it starts once it has passed, by the server's clock, and the next
            // create of the key is a new operation.
            let short = #"{"debounce":{"key":"user-7","seconds":1}}"#
            let made = try await server.request("POST", "/v1/queues/sync/operations", json: Self.body(#"{"seconds":0.01}"#, short))
            let shortID = try #require(made.string("id"))
            #expect(try await server.waitForState(shortID, "finished", timeout: 15))
            let notBefore = try #require(parseTime(made.object["notBefore"]))
            let started = try #require(parseTime(try await server.operation(shortID)["startedAt"]))
            #expect(started >= notBefore && started.timeIntervalSince(notBefore) < 5, "\(notBefore) → \(started)")
            let again = try await server.request("POST", "/v1/queues/sync/operations", json: Self.body(#"{"seconds":0.01}"#, short))
            #expect(again.status == 201 && again.string("admission") == "created" && again.string("id") != shortID)
        }
    }

    @Test("debounce: waitingOn says the operation waits out its quiet time (API.md \"waitingOn\")")
    func debounceWaitingOn() async throws {
        try await withLiveServer { server in
            try await server.createQueue("sync", maxConcurrent: 10)
            let d = #"{"debounce":{"key":"k","seconds":60}}"#
            let made = try await server.request("POST", "/v1/queues/sync/operations", json: Self.body(#"{"seconds":0.01}"#, d))
            let id = try #require(made.string("id"))
            let status = try await server.operation(id)
            let waiting = status["waitingOn"] as? [[String: Any]]
            #expect(waiting?.count == 1 && waiting?.first?["type"] as? String == "debounce", "\(String(describing: waiting))")
            #expect(waiting?.first?["until"] as? String == made.string("notBefore"))
        }
    }

    @Test("debounce: maxSeconds caps a stream of creates that never stops")
    func debounceCap() async throws {
        try await withLiveServer { server in
            try await server.createQueue("sync", maxConcurrent: 10)
            let d = #"{"debounce":{"key":"k","seconds":10,"maxSeconds":14}}"#
            let first = try await server.request("POST", "/v1/queues/sync/operations", json: Self.body(#"{"seconds":0.01}"#, d))
            let id = try #require(first.string("id"))
            let createdAt = try #require(parseTime(first.object["createdAt"]))
            // Creates one after the other: each moves the start 10 s on, the cap holds it at 14 s
            // after the first. Only the cap can start it while they keep coming (a create takes
            // far less than 10 s, even on a loaded machine).
            var started: Date?
            var merges = 0
            let deadline = Date().addingTimeInterval(30)
            while started == nil && Date() < deadline {
                let r = try await server.request("POST", "/v1/queues/sync/operations", json: Self.body(#"{"seconds":0.01}"#, d))
                if r.string("id") == id && r.string("admission") == "merged" { merges += 1 }
                started = parseTime(try await server.operation(id)["startedAt"])
                if started == nil { try await Task.sleep(nanoseconds: 200_000_000) }
            }
            let s = try #require(started, "a create after another, with a 10 s quiet time: only the cap starts it")
            let after = s.timeIntervalSince(createdAt)
            #expect(merges >= 2, "the creates kept coming: \(merges) merged")
            // Never before the quiet time; by the cap (a timer's lateness allowed on a loaded machine).
            #expect(after >= 14 && after < 17, "started \(after) s after the first create (cap 14 s)")
        }
    }

    @Test("singleton: skip answers the unfinished one; replaceWaiting keeps one started and one waiting")
    func singleton() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 10)
            let skip = #"{"singleton":{"key":"nightly","mode":"skip"}}"#
            let a = try await server.request("POST", "/v1/queues/q/operations", json: Self.body(#"{"seconds":30}"#, skip))
            #expect(a.status == 201 && a.string("admission") == "created")
            let b = try await server.request("POST", "/v1/queues/q/operations", json: Self.body(#"{"seconds":1}"#, skip))
            #expect(b.status == 200 && b.string("admission") == "skipped" && b.string("id") == a.string("id"))
            #expect((b.object["spec"] as? [String: Any])?["seconds"] as? Double == 30, "skipped: nothing changed")
            #expect(b.headers["location"] == "/v1/operations/\(a.string("id") ?? "")")

            let rw = #"{"singleton":{"key":"sync","mode":"replaceWaiting"}}"#
            // Runs until cancelled below: the waiting one cannot start before the merge, however slow.
            let running = try await server.request("POST", "/v1/queues/q/operations", json: Self.body(#"{"seconds":300}"#, rw))
            let runningID = try #require(running.string("id"))
            #expect(try await server.waitForState(runningID, "executing"))
            let waiting = try await server.request("POST", "/v1/queues/q/operations", json: Self.body(#"{"seconds":0.01}"#, rw))
            #expect(waiting.status == 201 && waiting.string("admission") == "created", "\(waiting.text)")
            #expect(waiting.object["dependencies"] as? [String] == [runningID], "the waiting one depends on the started one")
            let merged = try await server.request("POST", "/v1/queues/q/operations", json: Self.body(#"{"seconds":0.02}"#, rw))
            #expect(merged.status == 200 && merged.string("admission") == "merged" && merged.string("id") == waiting.string("id"))
            #expect((merged.object["spec"] as? [String: Any])?["seconds"] as? Double == 0.02)
            let waitingID = try #require(waiting.string("id"))
            _ = try await server.request("POST", "/v1/operations/\(runningID)/cancel")
            #expect(try await server.waitForState(waitingID, "finished", timeout: 10))
            let r = try await server.operation(runningID)
            let w = try await server.operation(waitingID)
            let runEnd = try #require(parseTime(r["finishedAt"]))
            let waitStart = try #require(parseTime(w["startedAt"]))
            #expect(waitStart >= runEnd, "never two at once: \(runEnd) → \(waitStart)")
            #expect(try await server.operations(in: "q").count == 3)
        }
    }

    @Test("refusals name the field and change nothing")
    func refusals() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q")
            let cases: [(String, String)] = [
                (#"{"debounce":{"key":"k"}}"#, "admission.debounce.seconds"),
                (#"{"debounce":{"key":"k","seconds":0}}"#, "admission.debounce.seconds"),
                (#"{"debounce":{"key":"k","seconds":5,"maxSeconds":2}}"#, "admission.debounce.maxSeconds"),
                (#"{"debounce":{"key":"k","seconds":1e308}}"#, "admission.debounce.seconds"),
                (#"{"debounce":{"key":"","seconds":1}}"#, "admission.debounce.key"),
                (#"{"debounce":{"key":"\#(String(repeating: "k", count: 129))","seconds":1}}"#, "admission.debounce.key"),
                (#"{"debounce":{"key":"a\u0000b","seconds":1}}"#, "admission.debounce.key"),
                (#"{"debounce":{"key":"k","seconds":1,"extra":1}}"#, "admission.debounce.extra"),
                (#"{"singleton":{"key":"k"}}"#, "admission.singleton.mode"),
                (#"{"singleton":{"key":"k","mode":"fifo"}}"#, "admission.singleton.mode"),
                (#"{"singleton":{"key":7,"mode":"skip"}}"#, "admission.singleton.key"),
                (#"{"throttle":{}}"#, "admission.throttle"),
                (#"{"debounce":{"key":"k","seconds":1},"singleton":{"key":"k","mode":"skip"}}"#, "admission"),
                (#"[]"#, "admission"),
                (#""debounce""#, "admission"),
            ]
            for (admission, field) in cases {
                let r = try await server.request("POST", "/v1/queues/q/operations", json: Self.body(#"{"seconds":1}"#, admission))
                expectProblem(r, 422, mentioning: [field])
            }
            // A key that stands for an operation of another kind.
            let d = #"{"debounce":{"key":"k","seconds":30}}"#
            let made = try await server.request("POST", "/v1/queues/q/operations", json: Self.body(#"{"seconds":1}"#, d))
            #expect(made.status == 201)
            let other = try await server.request(
                "POST", "/v1/queues/q/operations", json: Self.body(#"{"method":"GET","url":"http://127.0.0.1:9/"}"#, d, kind: "http"))
            expectProblem(other, 409, mentioning: ["admission key 'k'", "delay"])
            // A dependency that does not exist is 404, even for a create that would merge.
            let missing = try await server.request(
                "POST", "/v1/queues/q/operations",
                json: #"{"kind":"delay","spec":{"seconds":1},"dependencies":["op-00000000000fffff"],"admission":\#(d)}"#)
            expectProblem(missing, 404, mentioning: ["op-00000000000fffff"])
            let ops = try await server.operations(in: "q")
            #expect(ops.count == 1 && (ops.first?["revision"] as? Int) == made.int("revision"), "nothing changed")
        }
    }

    @Test("a batch: each element's entry is the operation that stands for it, with its admission")
    func batch() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 10)
            let body = #"""
                {"operations":[
                  {"ref":"a","queue":"q","kind":"delay","spec":{"seconds":1},"admission":{"debounce":{"key":"k","seconds":30}}},
                  {"ref":"b","queue":"q","kind":"delay","spec":{"seconds":2},"admission":{"debounce":{"key":"k","seconds":30}}},
                  {"queue":"q","kind":"delay","spec":{"seconds":0.01},"dependencies":["ref:b"]},
                  {"queue":"q","kind":"delay","spec":{"seconds":30},"admission":{"singleton":{"key":"s","mode":"skip"}}},
                  {"queue":"q","kind":"delay","spec":{"seconds":30},"admission":{"singleton":{"key":"s","mode":"skip"}}}
                ]}
                """#
            let r = try await server.request("POST", "/v1/operations:batch", json: body)
            #expect(r.status == 201, "\(r.text)")
            let ops = (r.object["operations"] as? [[String: Any]]) ?? []
            #expect(ops.map { $0["admission"] as? String } == ["created", "merged", nil, "created", "skipped"], "\(r.text)")
            #expect(ops.count == 5 && ops[1]["id"] as? String == ops[0]["id"] as? String && ops[4]["id"] as? String == ops[3]["id"] as? String)
            #expect(ops.count == 5 && ops[2]["dependencies"] as? [String] == [ops[0]["id"] as? String ?? ""])
            #expect(((ops.first?["spec"] as? [String: Any])?["seconds"] as? Double) == 2)
            #expect(try await server.operations(in: "q").count == 3)
            // Refused whole: a bad admission in the last element adds nothing.
            let bad = try await server.request(
                "POST", "/v1/operations:batch",
                json:
                    #"{"operations":[{"queue":"q","kind":"delay","spec":{"seconds":1}},{"queue":"q","kind":"delay","spec":{"seconds":1},"admission":{"singleton":{"key":"s"}}}]}"#
            )
            expectProblem(bad, 422, mentioning: ["operations[1].admission.singleton.mode"])
            #expect(try await server.operations(in: "q").count == 3)
        }
    }

    @Test("a schedule's template carries its admission: a trigger merges or skips")
    func scheduleTemplate() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 10)
            let made = try await server.request(
                "POST", "/v1/queues/q/schedules",
                json:
                    #"{"name":"n","every":3600,"operation":{"kind":"delay","spec":{"seconds":30},"admission":{"singleton":{"key":"nightly","mode":"skip"}}},"overlap":"allow"}"#
            )
            #expect(made.status == 201, "\(made.text)")
            let template = made.object["operation"] as? [String: Any]
            #expect(((template?["admission"] as? [String: Any])?["singleton"] as? [String: Any])?["mode"] as? String == "skip", "\(made.text)")
            let first = try await server.request("POST", "/v1/queues/q/schedules/n/trigger")
            #expect(first.status == 201 && first.string("admission") == "created", "\(first.text)")
            let second = try await server.request("POST", "/v1/queues/q/schedules/n/trigger")
            #expect(second.status == 200 && second.string("admission") == "skipped", "\(second.text)")
            // A plain create with the same key meets the run.
            let plain = try await server.request(
                "POST", "/v1/queues/q/operations", json: Self.body(#"{"seconds":1}"#, #"{"singleton":{"key":"nightly","mode":"skip"}}"#))
            #expect(plain.status == 200 && plain.string("id") == first.string("id"))
            let bad = try await server.request(
                "POST", "/v1/queues/q/schedules",
                json: #"{"name":"m","every":60,"operation":{"kind":"delay","spec":{"seconds":1},"admission":{"debounce":{"key":"k"}}}}"#)
            expectProblem(bad, 422, mentioning: ["admission.debounce.seconds"])
        }
    }

    @Test("every outcome is durable before the answer: kill -9, restart, the keys still hold", arguments: StoreChoice.allCases)
    func killNine(store choice: StoreChoice) async throws {
        let binary = try OpqdBinary.locate()
        let store = try choice.prepare()
        let data = try makeTemporaryDirectory(prefix: "opqd-admission-data")
        defer {
            store.remove()
            try? FileManager.default.removeItem(atPath: data)
        }
        var server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-0.log", extraArguments: store.arguments)
        try await onThread { [server] in try StoreChoice.awaitOwner(server) }
        func must(_ method: String, _ path: String, _ json: String? = nil, _ status: Int = 201) throws -> TestResponse {
            let r = try server.request(method, path, json: json)
            guard r.status == status else { throw Unexpected("\(method) \(path)", r) }
            return r
        }
        try must("POST", "/v1/queues", #"{"name":"q","maxConcurrentOperationCount":10}"#)
        let d = #"{"debounce":{"key":"user-1","seconds":60,"maxSeconds":600}}"#
        let created = try must("POST", "/v1/queues/q/operations", Self.body(#"{"seconds":1}"#, d))
        let merged = try must("POST", "/v1/queues/q/operations", Self.body(#"{"seconds":2}"#, d), 200)
        let s = #"{"singleton":{"key":"one","mode":"skip"}}"#
        let single = try must("POST", "/v1/queues/q/operations", Self.body(#"{"seconds":3600}"#, s))
        server.killNow()

        server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-1.log", extraArguments: store.arguments)
        defer { server.killNow() }
        try await onThread { [server] in try StoreChoice.awaitOwner(server) }
        let id = try #require(created.string("id"))
        let back = try must("GET", "/v1/operations/\(id)", nil, 200)
        #expect((back.object["spec"] as? [String: Any])?["seconds"] as? Double == 2, "the merge was durable: \(back.text)")
        #expect(back.string("notBefore") == merged.string("notBefore"))
        let again = try must("POST", "/v1/queues/q/operations", Self.body(#"{"seconds":3}"#, d), 200)
        #expect(again.string("admission") == "merged" && again.string("id") == id, "the debounce key survived: \(again.text)")
        let skipped = try must("POST", "/v1/queues/q/operations", Self.body(#"{"seconds":1}"#, s), 200)
        #expect(skipped.string("admission") == "skipped" && skipped.string("id") == single.string("id"))
        #expect(try must("GET", "/v1/queues/q/operations", nil, 200).object["operations"].map { ($0 as? [Any])?.count } == 2)
    }
}
