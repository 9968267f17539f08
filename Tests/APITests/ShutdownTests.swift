import Foundation
import Locking
import QueueTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// SIGTERM to the real `opqd` binary while clients are creating operations and two long polls
/// are open: it must answer what it accepted, refuse the rest cleanly, flush and exit 0.
@Suite("Graceful shutdown of the real opqd binary")
struct ShutdownTests {
    /// One request of a hammering client.
    struct Sent: Sendable {
        let client: Int
        let name: String
        let outcome: HTTPOutcome
        let started: Date
        let ended: Date
    }

    @Test("SIGTERM with requests in flight: exit 0 within 10 s, every request answered or cleanly refused, every 201 kept")
    func sigtermFinishesWhatIsInFlight() async throws {
        let binary = try OpqdBinary.locate()
        let data = try makeTemporaryDirectory(prefix: "opqd-term-data")
        let logs = try makeTemporaryDirectory(prefix: "opqd-term-logs")
        defer {
            try? FileManager.default.removeItem(atPath: data)
            try? FileManager.default.removeItem(atPath: logs)
        }
        let server = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-0.log")
        // A suspended queue with an operation in it never becomes idle: its wait stays open.
        let queue = try server.request("POST", "/v1/queues", json: #"{"name":"q","isSuspended":true}"#)
        guard queue.status == 201 else { throw Unexpected("creating queue q", queue) }
        let anchor = try server.request("POST", "/v1/queues/q/operations", json: #"{"kind":"delay","name":"anchor","spec":{"seconds":3600}}"#)
        guard anchor.status == 201 else { throw Unexpected("creating the anchor operation", anchor) }

        // Long polls: the feed waits for a seq far beyond anything the clients will make.
        let polls = Lock<[String: (HTTPOutcome, Date)]>([:])
        let pollPaths = ["/v1/events?after=1000000000&wait=30", "/v1/queues/q/wait?timeout=30"]
        let pollTasks = pollPaths.map { path in
            Task {
                try await onThread {
                    let outcome = server.exchange("GET", path, timeout: 40)
                    polls.withLock { $0[path] = (outcome, Date()) }
                }
            }
        }

        let sigtermAt = Lock<Date?>(nil)
        let created = Lock(0)
        let clients = (0..<4).map { client in
            Task {
                try await onThread { () -> [Sent] in
                    var sent: [Sent] = []
                    var n = 0
                    while true {
                        let name = "t-\(client)-\(n)"
                        n += 1
                        let started = Date()
                        let body = #"{"kind":"delay","name":"\#(name)","spec":{"seconds":3600}}"#
                        let outcome = server.exchange("POST", "/v1/queues/q/operations", json: body, timeout: 20)
                        sent.append(Sent(client: client, name: name, outcome: outcome, started: started, ended: Date()))
                        if outcome.status == 201 { created.withLock { $0 += 1 } }
                        guard let term = sigtermAt.withLock({ $0 }) else {
                            if outcome.status != 201 { return sent }  // a failure before the SIGTERM: reported below
                            continue
                        }
                        // After the SIGTERM: on until the server refuses or drops a connection.
                        if outcome.status != 201 || Date().timeIntervalSince(term) > 15 { return sent }
                    }
                }
            }
        }

        // Both long polls parked, the clients well under way, then SIGTERM at a random moment.
        _ = await eventually(timeout: 10) { created.withLock { $0 } >= 40 }
        usleep(useconds_t.random(in: 0...100_000))
        let parked = polls.withLock { $0 }
        #expect(parked.isEmpty, "the long polls answered before the SIGTERM: \(parked.mapValues { $0.0.description })")
        let term = Date()
        sigtermAt.withLock { $0 = term }
        server.signal(SIGTERM)
        let exit = try await onThread { server.waitForExit(timeout: 10) }
        let exitSeconds = Date().timeIntervalSince(term)
        #expect(exit == .exited(0), "after SIGTERM: \(exit.map(\.description) ?? "still running 10 s later")\n--- log ---\n\(server.logTail())")
        if exit == nil { server.killNow() }

        var results: [Sent] = []
        for c in clients { results += try await c.value }
        for p in pollTasks { try await p.value }

        // The long polls: a complete answer, 2xx or 503, before the process was gone.
        let answered = polls.withLock { $0 }
        for path in pollPaths {
            guard let (outcome, at) = answered[path] else {
                Issue.record("long poll \(path) never finished")
                continue
            }
            guard let status = outcome.status, (200..<300).contains(status) || status == 503 else {
                Issue.record("long poll \(path) at SIGTERM: \(outcome) (want 2xx or 503)")
                continue
            }
            #expect(at.timeIntervalSince(term) < 10, "long poll \(path) answered only \(at.timeIntervalSince(term)) s after the SIGTERM")
        }

        // The creates: 201, or refused / dropped before any answer (never accepted). Nothing else.
        var acknowledged: [String: String] = [:]  // name -> id
        var unanswered: [String] = []
        var refused = 0, dropped: [Double] = [], droppedNames: [String] = [], answered503: [String] = []
        for s in results {
            switch s.outcome {
            case let .response(r) where r.status == 201:
                acknowledged[s.name] = r.string("id")
            case let .response(r) where r.status == 503:
                // Turned away: fine if it changed nothing (checked after the restart). Once
                // stopping, the server answers 503 to every request whose headers it reads from
                // then on, including one the client sent a moment before the SIGTERM; a request
                // the server had already taken on is finished (its 201 is checked below).
                answered503.append(s.name)
                unanswered.append(s.name)
            case .refused where s.started >= term:
                refused += 1
            case .closedWithoutAnswer where s.started >= term.addingTimeInterval(-1):
                // Never accepted, or accepted and dropped: the restart below tells them apart,
                // since an accepted create would have been carried out.
                dropped.append(s.started.timeIntervalSince(term))
                droppedNames.append(s.name)
                unanswered.append(s.name)
            default:
                Issue.record(
                    "create \(s.name) sent \(String(format: "%.3f", s.started.timeIntervalSince(term))) s after the SIGTERM, ended \(String(format: "%.3f", s.ended.timeIntervalSince(term))) s after it: \(s.outcome)"
                )
                unanswered.append(s.name)
            }
        }
        #expect(!acknowledged.isEmpty)
        let afterTerm = results.filter { $0.started >= term || $0.ended >= term }
        let slowest = afterTerm.map { $0.ended.timeIntervalSince(term) }.max() ?? 0

        // After a restart on the same data, every 201 is there; nothing else but the unanswered.
        let again = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-1.log")
        var byName: [String: String] = [:]
        var after: String? = nil
        repeat {
            let path = "/v1/queues/q/operations?limit=1000" + (after.map { "&after=\($0)" } ?? "")
            let page = try again.request("GET", path)
            guard page.status == 200 else { throw Unexpected("GET \(path) after the restart", page) }
            for op in page.objects("operations") {
                if let name = op["name"] as? String, let id = op["id"] as? String { byName[name] = id }
            }
            after = page.object["next"] as? String
        } while after != nil
        let missing = acknowledged.filter { byName[$0.key] != $0.value }
        #expect(
            missing.isEmpty, "\(missing.count) of \(acknowledged.count) acknowledged creates are gone after the restart: \(missing.keys.sorted().prefix(10))")
        let extra = Set(byName.keys).subtracting(acknowledged.keys).subtracting(["anchor"])
        #expect(extra.isSubset(of: Set(unanswered)), "operations no request made: \(extra.subtracting(unanswered).sorted())")
        let keptDespite503 = answered503.filter { byName[$0] != nil }
        #expect(
            keptDespite503.isEmpty,
            "creates answered 503 (the server is shutting down) were carried out anyway and are there after the restart: \(keptDespite503)")
        let keptUnanswered = droppedNames.filter { byName[$0] != nil }
        #expect(keptUnanswered.isEmpty, "creates the server carried out but never answered (the connection closed without an answer): \(keptUnanswered)")
        again.signal(SIGTERM)
        let secondExit = again.waitForExit(timeout: 10)
        #expect(secondExit == .exited(0), "the restarted server after SIGTERM: \(secondExit.map(\.description) ?? "still running")")

        print(
            String(
                format:
                    "Shutdown: exit %@ %.3f s after SIGTERM; %d creates acknowledged (%d after the SIGTERM), %d answered 503, %d refused, %d dropped unanswered (sent at %@ s); last request ended %.3f s after SIGTERM; polls: %@; restart %.3f s",
                exit.map(\.description) ?? "none", exitSeconds, acknowledged.count,
                results.filter { $0.ended >= term && $0.outcome.status == 201 }.count,
                answered503.count, refused, dropped.count, dropped.map { String(format: "%+.3f", $0) }.joined(separator: " "), slowest,
                answered.map { "\($0.key.split(separator: "?")[0]) \($0.value.0.status.map(String.init) ?? "-")" }.sorted().joined(separator: ", "),
                again.startupSeconds))
    }
}
