import Foundation
import Locking
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// API.md "Observation" and "Crashes" against kill -9 of the real binary.
@Suite("Durability across kill -9")
struct DurabilityTests {
    /// Reads a Server-Sent Events stream (chunked or not) and keeps every event with an id.
    final class StreamReader: @unchecked Sendable {
        let seen = Lock<[(id: String, data: String)]>([])
        let ended = Lock(false)

        func run(port: Int, target: String, seconds: Double) {
            defer { ended.withLock { $0 = true } }
            guard let c = try? RawConnection(port: port, timeout: 10) else { return }
            defer { c.close() }
            c.send("GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            guard let (status, headers) = try? c.readHead(), status == 200 else { return }
            let chunked = headers["transfer-encoding"]?.lowercased().contains("chunked") == true
            var pending: [UInt8] = []
            var id: String? = nil
            var data: [String] = []
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                let bytes: [UInt8]
                if chunked {
                    guard let chunk = try? c.readChunk() else { return }
                    bytes = chunk
                } else {
                    let (b, eof) = c.readAvailable(milliseconds: 200)
                    if eof && b.isEmpty { return }
                    bytes = b
                }
                pending += bytes
                while let nl = pending.firstIndex(of: 0x0A) {
                    var line = Array(pending[..<nl])
                    pending.removeFirst(nl + 1)
                    if line.last == 0x0D { line.removeLast() }
                    let text = String(decoding: line, as: UTF8.self)
                    if text.isEmpty {
                        if let id, !data.isEmpty { let event = (id: id, data: data.joined(separator: "\n")); seen.withLock { $0.append(event) } }
                        id = nil; data = []
                    } else if text.hasPrefix("id:") {
                        id = String(text.dropFirst(3)).trimmingCharacters(in: .whitespaces)
                    } else if text.hasPrefix("data:") {
                        var v = text.dropFirst(5)
                        if v.first == " " { v = v.dropFirst() }
                        data.append(String(v))
                    }
                }
            }
        }
    }

    /// Every event of the feed after 0, as exact bytes by seq.
    static func feed(_ server: Opqd) throws -> [Int: [UInt8]] {
        var out: [Int: [UInt8]] = [:]
        var cursor = 0
        for _ in 0..<10_000 {
            let r = try server.request("GET", "/v1/events?after=\(cursor)&limit=1000").expecting(200, "reading the feed")
            let raw = rawArrayElements(r.body, key: "events")
            var last = cursor
            for element in raw {
                guard let object = try? JSONSerialization.jsonObject(with: Data(element)) as? [String: Any],
                    let seq = (object["seq"] as? NSNumber)?.intValue
                else { continue }
                out[seq] = element
                last = max(last, seq)
            }
            if raw.isEmpty || last == cursor { break }
            cursor = last
        }
        return out
    }

    @Test("every event an SSE client saw before kill -9 is in the feed after the restart, byte for byte (3 kill cycles)")
    func sseEventsSurviveKillNine() async throws {
        let server = try Opqd()
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"d","maxConcurrentOperationCount":8}"#).expecting(201)
        }
        var seenInAll = 0
        for cycle in 0..<3 {
            let reader = StreamReader()
            let stop = Lock(false)
            let seenBeforeKill: [(id: String, data: String)] = try await blocking {
                let port = server.port
                let start = try Self.feed(server).keys.max() ?? 0
                Thread { reader.run(port: port, target: "/v1/events/stream?after=\(start)", seconds: 75) }.start()
                // Writers keep changing things while the reader follows the stream.
                for w in 0..<4 {
                    Thread {
                        let client = KeepAliveClient(port: port)
                        defer { client.close() }
                        var n = 0
                        while !stop.withLock({ $0 }) {
                            let kind =
                                n % 3 == 0
                                ? #"{"kind":"delay","spec":{"seconds":0.02},"name":"w\#(w)-\#(n)"}"#
                                : #"{"kind":"delay","spec":{"seconds":0},"queuePriority":"high"}"#
                            if (try? client.request("POST", "/v1/queues/d/operations", body: Array(kind.utf8))) == nil { usleep(20_000) }
                            n += 1
                        }
                    }.start()
                }
                let target = 200 + Int.random(in: 0..<200)
                // A limit to give up at (the kill comes as soon as enough events were seen): how
                // many events flow before the kill is the point, not how fast a loaded machine
                // makes them. The reader follows the stream longer than this.
                let enough = waitUntil(timeout: 60, every: 0.002) { reader.seen.withLock { $0.count } >= target }
                // kill -9 while events are flowing.
                server.killNine()
                let seen = reader.seen.withLock { $0 }
                stop.withLock { $0 = true }
                #expect(
                    enough,
                    "cycle \(cycle): the stream showed only \(seen.count) events in 60 s (it stalled or ended: \(reader.ended.withLock { $0 } ? "ended" : "silent"))"
                )
                return seen
            }
            seenInAll += seenBeforeKill.count
            try await blocking {
                _ = waitUntil(timeout: 3) { reader.ended.withLock { $0 } }
                usleep(100_000)  // the writers notice the stop
                try server.restart()
                let feed = try Self.feed(server)
                var missing: [String] = []
                var different: [String] = []
                for event in seenBeforeKill {
                    guard let seq = Int(event.id) else { Issue.record("an SSE id that is not a seq: \(event.id)"); continue }
                    guard let stored = feed[seq] else { missing.append(event.id); continue }
                    if stored != Array(event.data.utf8) {
                        different.append("seq \(seq): stream \(event.data) / feed \(String(decoding: stored, as: UTF8.self))")
                    }
                }
                print(
                    "Durability SSE cycle \(cycle): \(seenBeforeKill.count) events seen on the stream before kill -9 (last id \(seenBeforeKill.last?.id ?? "-")); feed after restart holds \(feed.count); missing \(missing.count), different \(different.count)"
                )
                #expect(
                    missing.isEmpty, "cycle \(cycle): \(missing.count) events seen on the stream are not in the feed after the restart: \(missing.prefix(10))")
                #expect(
                    different.isEmpty,
                    "cycle \(cycle): \(different.count) seqs name other content after the restart:\n\(different.prefix(5).joined(separator: "\n"))")
                server.expectAlive("the restart")
            }
        }
    }

    /// Waits until operation `id` is executing (or `timeout`), returning its last status.
    static func waitExecuting(_ server: Opqd, _ id: String, timeout: Double = 10) throws -> TestResponse? {
        var last: TestResponse? = nil
        _ = try waitUntil(timeout: timeout, every: 0.05) {
            last = try server.request("GET", "/v1/operations/\(id)")
            return last?.string("state") == "executing" || last?.string("state") == "finished"
        }
        return last
    }

    static func errorType(_ r: TestResponse?) -> String? { (r?.object["error"] as? [String: Any])?["type"] as? String }

    @Test("an operation executing during 3 kill -9s in a row finishes failed with crashed-server; after 1 or 2 it does not")
    func poisonOperation() async throws {
        let server = try Opqd()
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"p"}"#).expecting(201)
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"idle","isSuspended":true}"#).expecting(201)
            let id =
                try server.request("POST", "/v1/queues/p/operations", json: #"{"kind":"delay","spec":{"seconds":60},"retry":{"maxAttempts":10,"backoff":0.1}}"#)
                .expecting(201).string("id") ?? ""
            let bystander =
                try server.request("POST", "/v1/queues/idle/operations", json: #"{"kind":"delay","spec":{"seconds":1}}"#).expecting(201).string("id") ?? ""
            for stop in 1...3 {
                let status = try Self.waitExecuting(server, id)
                guard status?.string("state") == "executing" else {
                    Issue.record("before unclean stop \(stop) the operation is not executing: \(status.map(\.text) ?? "no answer")")
                    return
                }
                server.killNine()
                try server.restart()
                let after = try server.request("GET", "/v1/operations/\(id)")
                if stop < 3 {
                    let poisoned = after.string("state") == "finished" && Self.errorType(after) == "crashed-server"
                    #expect(
                        poisoned == false,
                        "after \(stop) unclean stop(s) the operation already failed as crashed-server: \(after.text)")
                    #expect(after.string("state") != "finished", "after \(stop) unclean stop(s): \(after.text)")
                }
            }
            var final: TestResponse? = nil
            let finished = try waitUntil(timeout: 10, every: 0.05) {
                final = try server.request("GET", "/v1/operations/\(id)")
                return final?.string("state") == "finished"
            }
            #expect(
                finished && final?.string("outcome") == "failed" && Self.errorType(final) == "crashed-server",
                "after the 3rd unclean stop: \(final.map(\.text) ?? "no answer")")
            let other = try server.request("GET", "/v1/operations/\(bystander)")
            #expect(other.string("state") != "finished", "an operation that never executed was finished by the restarts: \(other.text)")
            server.expectAlive("three unclean stops")
        }
    }

    @Test("a clean stop (SIGTERM) in between resets the count: 2 unclean, 1 clean, 2 unclean is not poison")
    func cleanStopResetsTheCount() async throws {
        let server = try Opqd()
        try await blocking {
            _ = try server.request("POST", "/v1/queues", json: #"{"name":"p"}"#).expecting(201)
            let id =
                try server.request("POST", "/v1/queues/p/operations", json: #"{"kind":"delay","spec":{"seconds":60},"retry":{"maxAttempts":10,"backoff":0.1}}"#)
                .expecting(201).string("id") ?? ""
            for (n, clean) in [false, false, true, false, false].enumerated() {
                let status = try Self.waitExecuting(server, id)
                guard status?.string("state") == "executing" else {
                    Issue.record("before stop \(n + 1) the operation is not executing: \(status.map(\.text) ?? "no answer")")
                    return
                }
                if clean {
                    server.process.signal(SIGTERM)
                    let exit = server.process.waitForExit(timeout: 15)
                    #expect(exit == .exited(0), "SIGTERM: \(exit.map(\.description) ?? "still running")")
                    if exit == nil { server.killNine() }
                } else {
                    server.killNine()
                }
                try server.restart()
            }
            usleep(500_000)
            let after = try server.request("GET", "/v1/operations/\(id)")
            #expect(Self.errorType(after) != "crashed-server", "2 unclean stops, a clean one, 2 unclean: \(after.text)")
        }
    }
}
