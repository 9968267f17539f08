import Foundation
import QueueTesting
import Testing

/// A host's breaker survives kill -9 (API.md "Hosts"): an open host comes back open, its
/// backlog held, and nothing is sent to the target at start.
@Suite("Hosts survive kill -9")
struct HostDurabilityTests {
    @Test("an open host comes back open after kill -9 and holds its backlog", arguments: StoreChoice.allCases)
    func killNine(store choice: StoreChoice) async throws {
        let binary = try OpqdBinary.locate()
        let store = try choice.prepare()
        let data = try makeTemporaryDirectory(prefix: "opqd-hosts-data")
        let target = try SwitchableTarget()
        defer {
            target.stop()
            store.remove()
            try? FileManager.default.removeItem(atPath: data)
        }
        try target.set(.refusing)
        // Open long enough (300 s, the default cap) to outlast this test under a loaded parallel run (50 s seen).
        let flags = ["--breaker-failures", "2", "--breaker-open", "300"] + store.arguments
        var server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-0.log", extraArguments: flags)
        func must(_ method: String, _ path: String, _ json: String? = nil, _ status: Int = 201) throws -> TestResponse {
            let r = try server.request(method, path, json: json)
            guard r.status == status else { throw Unexpected("\(method) \(path)", r) }
            return r
        }
        try must("POST", "/v1/queues", #"{"name":"q","maxConcurrentOperationCount":10}"#)
        let op = #"{"kind":"http","spec":{"method":"GET","url":"\#(target.url())","timeout":1},"retry":{"maxAttempts":5,"backoff":0.1}}"#
        for _ in 0..<2 { try must("POST", "/v1/queues/q/operations", op) }
        var open = false
        let deadline = Date().addingTimeInterval(20)
        while !open && Date() < deadline {
            open = try must("GET", "/v1/hosts/\(target.host)", nil, 200).string("state") == "open"
            if !open { try await Task.sleep(nanoseconds: 20_000_000) }
        }
        #expect(open, "two refused connections open the host")
        var ids: [String] = []
        for _ in 0..<5 { ids.append(try #require(try must("POST", "/v1/queues/q/operations", op).string("id"))) }
        // Acknowledged: the host's state was committed with the change that opened it.
        let before = try must("GET", "/v1/hosts/\(target.host)", nil, 200)
        server.killNow()

        try target.set(.up)
        server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-1.log", extraArguments: flags)
        defer { server.killNow() }
        try await onThread { [server] in try StoreChoice.awaitOwner(server) }
        let after = try must("GET", "/v1/hosts/\(target.host)", nil, 200)
        #expect(after.string("state") == "open", "\(after.text)")
        #expect(after.string("until") == before.string("until") && after.string("openedAt") == before.string("openedAt"))
        #expect(after.int("held") == 7, "the 5 new and the 2 whose retries are due: \(after.text)")
        try await Task.sleep(nanoseconds: 1_000_000_000)
        #expect(target.count == 0, "nothing is sent to a host that comes back open")
        for id in ids {
            let s = try must("GET", "/v1/operations/\(id)", nil, 200)
            #expect(s.string("state") == "ready")
        }
        // Released by hand: the backlog drains.
        try must("PATCH", "/v1/hosts/\(target.host)", #"{"breaker":"closed"}"#, 200)
        var done = 0
        let end = Date().addingTimeInterval(10)
        while done < ids.count && Date() < end {
            done = 0
            for id in ids where try must("GET", "/v1/operations/\(id)", nil, 200).string("outcome") == "succeeded" { done += 1 }
            if done < ids.count { try await Task.sleep(nanoseconds: 50_000_000) }
        }
        #expect(done == ids.count)
    }
}
