import Foundation
import QueueTesting
import Testing

/// Schedules through HTTP on real processes (API.md "Schedules"): each overlap policy, each
/// catch-up policy after a stop, and each nominal time at most once across repeated kill -9.
/// Times are the server's own (`nominalTime`, `createdAt`, `startedAt`), not the test's clock.
@Suite("Schedules: overlap, catch-up and kill -9 through HTTP")
struct ScheduleDurabilityTests {
    /// A run of a schedule: its nominal time and the operation's status.
    struct Run {
        var nominal: Date
        var op: [String: Any]
        var created: Date { parseTime(op["createdAt"]) ?? .distantPast }
        var started: Date? { parseTime(op["startedAt"]) }
        var finished: Date? { parseTime(op["finishedAt"]) }
        var id: String { op["id"] as? String ?? "" }
    }

    static func runs(_ ops: [[String: Any]], of name: String) -> [Run] {
        ops.compactMap { op -> Run? in
            guard let s = op["schedule"] as? [String: Any], s["name"] as? String == name, let t = parseTime(s["nominalTime"]) else { return nil }
            return Run(nominal: t, op: op)
        }.sorted { $0.nominal < $1.nominal }
    }

    static func operations(_ server: ServerProcess, _ queue: String) throws -> [[String: Any]] {
        var all: [[String: Any]] = []
        var after: String?
        repeat {
            let r = try server.request("GET", "/v1/queues/\(queue)/operations?limit=1000" + (after.map { "&after=\($0)" } ?? ""))
            guard r.status == 200 else { throw Unexpected("listing \(queue)", r) }
            all += r.objects("operations")
            after = r.object["next"] as? String
        } while after != nil
        return all
    }

    @Test("each overlap policy, with runs that outlast the period")
    func overlapPolicies() async throws {
        try await withLiveServer { server in
            try await server.createQueue("q", maxConcurrent: 50)
            let policies = ["allow", "skip", "bufferOne", "bufferAll", "cancelPrevious"]
            for p in policies {
                let r = try await server.request(
                    "POST", "/v1/queues/q/schedules",
                    json: #"{"name":"\#(p)","every":1,"overlap":"\#(p)","operation":{"kind":"delay","spec":{"seconds":2.5}}}"#)
                #expect(r.status == 201, "\(r.text)")
            }
            // Until every schedule has decided three nominal times (run or skipped).
            #expect(
                try await eventually(timeout: 10) {
                    var all = true
                    for p in policies {
                        let s = try await server.request("GET", "/v1/queues/q/schedules/\(p)")
                        if (s.int("runs") ?? 0) + (s.int("skipped") ?? 0) < 3 { all = false }
                    }
                    return all
                })
            for p in policies { _ = try await server.request("POST", "/v1/queues/q/schedules/\(p)/pause") }
            let ops = try await server.operations(in: "q")
            func firstThree(_ p: String) -> (runs: [Run], times: [Date]) {
                let all = Self.runs(ops, of: p)
                // The first nominal time is the first run's (every policy runs the first).
                guard let t1 = all.first?.nominal else { return ([], []) }
                let times = (0..<3).map { t1.addingTimeInterval(Double($0)) }
                return (all.filter { $0.nominal <= times[2] }, times)
            }
            let allow = firstThree("allow")
            #expect(allow.runs.map(\.nominal) == allow.times, "allow: a run at every time")
            if allow.runs.count == 3, let s2 = allow.runs[1].started, let f1 = allow.runs[0].finished {
                #expect(s2 < f1, "allow: the second ran while the first still did")
            }
            let skip = firstThree("skip")
            #expect(skip.runs.map(\.nominal) == [skip.times[0]], "skip: the first run outlasts the next two times")
            let one = firstThree("bufferOne")
            #expect(one.runs.map(\.nominal) == Array(one.times[0...1]), "bufferOne: one waits, the third time is skipped")
            #expect(one.runs.count == 2 && one.runs[1].op["dependencies"] as? [String] == [one.runs[0].id])
            let chain = firstThree("bufferAll")
            #expect(chain.runs.map(\.nominal) == chain.times, "bufferAll: every time, a chain")
            #expect(chain.runs.count == 3 && chain.runs[2].op["dependencies"] as? [String] == [chain.runs[1].id])
            let cancel = firstThree("cancelPrevious")
            #expect(cancel.runs.map(\.nominal) == cancel.times)
            #expect(cancel.runs.prefix(2).allSatisfy { $0.op["isCancelled"] as? Bool == true }, "cancelPrevious: each run cancels the one before")
        }
    }

    @Test("each catch-up policy after a stop: skip, latest, all")
    func catchup() async throws {
        let binary = try OpqdBinary.locate()
        let data = try makeTemporaryDirectory(prefix: "opqd-catchup")
        defer { try? FileManager.default.removeItem(atPath: data) }
        var server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-0.log")
        func must(_ method: String, _ path: String, _ json: String? = nil, _ status: Int = 201) throws -> TestResponse {
            let r = try server.request(method, path, json: json)
            guard r.status == status else { throw Unexpected("\(method) \(path)", r) }
            return r
        }
        try must("POST", "/v1/queues", #"{"name":"q","maxConcurrentOperationCount":50}"#)
        let policies = ["skip", "latest", "all"]
        for p in policies {
            try must(
                "POST", "/v1/queues/q/schedules",
                #"{"name":"\#(p)","every":1,"overlap":"allow","catchup":{"policy":"\#(p)","window":3600,"maxRuns":100},"operation":{"kind":"delay","spec":{"seconds":0.01}}}"#
            )
        }
        try await Task.sleep(nanoseconds: 2_200_000_000)
        server.signal(SIGTERM)
        #expect(server.waitForExit(timeout: 10) != nil)
        try await Task.sleep(nanoseconds: 3_500_000_000)
        server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-1.log")
        defer { server.killNow() }
        try await Task.sleep(nanoseconds: 1_500_000_000)
        for p in policies { try must("POST", "/v1/queues/q/schedules/\(p)/pause", nil, 200) }
        let ops = try Self.operations(server, "q")
        // The three share one grid of whole seconds. The stop leaves a gap in skip's runs; latest
        // has the same gap less its last second (the latest missed time, run at the restart);
        // all has none.
        func gaps(_ runs: [Run]) -> [(Date, Date)] { zip(runs, runs.dropFirst()).map { ($0.nominal, $1.nominal) }.filter { $1.timeIntervalSince($0) > 1.5 } }
        let skip = Self.runs(ops, of: "skip")
        let latest = Self.runs(ops, of: "latest")
        let all = Self.runs(ops, of: "all")
        let skipGap = try #require(gaps(skip).first, "skip: the times of the stop are left out: \(skip.map(\.nominal))")
        #expect(gaps(skip).count == 1 && skipGap.1.timeIntervalSince(skipGap.0) >= 3, "\(skip.map(\.nominal))")
        let latestGap = gaps(latest)
        #expect(latestGap.count == 1, "latest: one gap: \(latest.map(\.nominal))")
        #expect(
            latestGap.first?.1 == skipGap.1.addingTimeInterval(-1), "latest: the latest missed time ran: \(latest.map(\.nominal)) vs \(skip.map(\.nominal))")
        #expect(gaps(all).isEmpty && all.count >= skip.count + 3, "all: every time of the stop: \(all.map(\.nominal))")
        let missed = try policies.map { try must("GET", "/v1/queues/q/schedules/\($0)", nil, 200).int("missed") ?? -1 }
        #expect(missed[0] >= 3 && missed[1] == missed[0] - 1 && missed[2] == 0, "missed by skip, latest, all: \(missed)")
        for runs in [skip, latest, all] { #expect(Set(runs.map(\.nominal)).count == runs.count, "each nominal time once") }
    }

    @Test("at most once, and none lost with catch-up all, across repeated kill -9", arguments: StoreChoice.allCases)
    func repeatedKillNine(store choice: StoreChoice) async throws {
        let binary = try OpqdBinary.locate()
        let store = try choice.prepare()
        let data = try makeTemporaryDirectory(prefix: "opqd-sched-kill")
        defer {
            store.remove()
            try? FileManager.default.removeItem(atPath: data)
        }
        var server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-0.log", extraArguments: store.arguments)
        try await onThread { [server] in try StoreChoice.awaitOwner(server) }
        var r = try server.request("POST", "/v1/queues", json: #"{"name":"q","maxConcurrentOperationCount":50}"#)
        #expect(r.status == 201)
        r = try server.request(
            "POST", "/v1/queues/q/schedules",
            json:
                #"{"name":"tick","every":1,"overlap":"allow","catchup":{"policy":"all","window":3600,"maxRuns":100},"operation":{"kind":"delay","spec":{"seconds":0.01}}}"#
        )
        #expect(r.status == 201, "\(r.text)")
        for round in 1...3 {
            try await Task.sleep(nanoseconds: 1_300_000_000)
            server.killNow()
            server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-\(round).log", extraArguments: store.arguments)
            try await onThread { [server] in try StoreChoice.awaitOwner(server) }
        }
        defer { server.killNow() }
        try await Task.sleep(nanoseconds: 1_500_000_000)
        #expect(try server.request("POST", "/v1/queues/q/schedules/tick/pause").status == 200)
        let runs = Self.runs(try Self.operations(server, "q"), of: "tick")
        let nominals = runs.map(\.nominal)
        #expect(runs.count >= 4, "\(nominals)")
        #expect(Set(nominals).count == nominals.count, "no nominal time twice: \(nominals)")
        let steps = zip(nominals, nominals.dropFirst()).map { $1.timeIntervalSince($0) }
        #expect(steps.allSatisfy { $0 == 1 }, "every second from the first to the last, none lost: \(nominals)")
        let s = try server.request("GET", "/v1/queues/q/schedules/tick")
        #expect(s.int("runs") == runs.count && s.int("missed") == 0, "\(s.text)")
    }
}
