import Foundation
import QueueTesting
import Testing

/// A worker's lease of a paused operation across kill -9 of the real binary (SQLite): its
/// heartbeats still see `isPaused`, and a finish it was answered 200 for while paused applies at
/// the resume, with its result (API.md: every 2xx to a change is durable).
@Suite("External operations paused across a restart")
struct ExternalRestartTests {
    @Test("kill -9 with three claimed operations paused, two finished by their workers (a result, an error; 64 levels deep): no lease or end lost")
    func pausedLeasesAcrossKill() throws {
        let binary = try OpqdBinary.locate()
        let data = try makeTemporaryDirectory(prefix: "opqd-ext-restart")
        defer { try? FileManager.default.removeItem(atPath: data) }
        var server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-0.log")
        defer { server.killNow() }
        func must(_ method: String, _ path: String, _ json: String? = nil, _ status: Int = 200) throws -> TestResponse {
            let r = try server.request(method, path, json: json)
            guard r.status == status else { throw Unexpected("\(method) \(path)", r) }
            return r
        }
        try must("POST", "/v1/queues", #"{"name":"x"}"#, 201)
        for _ in 0..<3 { try must("POST", "/v1/queues/x/operations", #"{"kind":"external","spec":{"lease":120},"retry":{"maxAttempts":1}}"#, 201) }
        var claimed: [(id: String, token: String)] = []
        let deadline = Date().addingTimeInterval(10)
        while claimed.count < 3, Date() < deadline {
            let r = try server.request("POST", "/v1/queues/x/claim?wait=1", json: #"{"worker":"w"}"#)
            if r.status == 200, let id = (r.object["operation"] as? [String: Any])?["id"] as? String,
                let token = (r.object["lease"] as? [String: Any])?["token"] as? String
            {
                claimed.append((id, token))
            }
        }
        try #require(claimed.count == 3)
        let (kept, done, failed) = (claimed[0], claimed[1], claimed[2])
        for c in claimed { try must("POST", "/v1/operations/\(c.id)/pause") }
        #expect(try must("POST", "/v1/operations/\(kept.id)/heartbeat", #"{"leaseToken":"\#(kept.token)"}"#).bool("isPaused") == true)
        // Finished by its worker while paused: answered 200, applied at the resume. Its result is
        // as deep as a request may carry (64 levels with the body's own), which a store reads back.
        let deep = String(repeating: "[", count: 62) + #"{"n":7}"# + String(repeating: "]", count: 62)
        try must("POST", "/v1/operations/\(done.id)/finish", #"{"leaseToken":"\#(done.token)","result":\#(deep)}"#)
        // Failed by its worker with an error that is no {type, detail} (kept whole as its data),
        // as deep as a request may carry (no retries: the failure is its end).
        let deepError = String(repeating: #"{"e":"#, count: 63) + "1" + String(repeating: "}", count: 63)
        try must("POST", "/v1/operations/\(failed.id)/finish", #"{"leaseToken":"\#(failed.token)","error":\#(deepError)}"#)

        server.killNow()
        server = try ServerProcess(binary: binary, data: data, logPath: data + "/opqd-1.log")

        let beat = try server.request("POST", "/v1/operations/\(kept.id)/heartbeat", json: #"{"leaseToken":"\#(kept.token)"}"#)
        #expect(beat.status == 200 && beat.bool("isPaused") == true, "the paused operation's lease after the restart: \(beat.text)")
        #expect(try must("GET", "/v1/operations/\(done.id)").string("state") == "paused")
        try must("POST", "/v1/operations/\(done.id)/resume")
        try must("POST", "/v1/operations/\(kept.id)/resume")
        let end = try must("GET", "/v1/operations/\(done.id)/wait?timeout=5")
        #expect(end.string("state") == "finished" && end.string("outcome") == "succeeded", "\(end.text)")
        var result: Any? = end.object["result"]
        for _ in 0..<62 { result = (result as? [Any])?.first }
        #expect((result as? [String: Any])?["n"] as? Int == 7, "the worker's result: \(end.text.prefix(300))")
        #expect(end.object["attempt"] as? Int == 1)
        // The failure applies at the resume too (no retry left): its error the worker's, whole.
        try must("POST", "/v1/operations/\(failed.id)/resume")
        let retried = try must("GET", "/v1/operations/\(failed.id)/wait?timeout=5")
        #expect(retried.string("outcome") == "failed", "the worker's failure applied at the resume: \(retried.text.prefix(300))")
        let error = retried.object["error"] as? [String: Any]
        var errorData: Any? = error?["data"]
        for _ in 0..<63 { errorData = (errorData as? [String: Any])?["e"] }
        #expect(error?["type"] as? String == "worker-error" && errorData as? Int == 1, "the worker's error, whole: \(retried.text.prefix(300))")
        // The kept one is its worker's still, and finishes with its token.
        let finished = try server.request("POST", "/v1/operations/\(kept.id)/finish", json: #"{"leaseToken":"\#(kept.token)","result":{}}"#)
        #expect(finished.status == 200, "\(finished.text)")
    }
}
