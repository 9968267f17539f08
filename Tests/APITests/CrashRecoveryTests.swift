import Foundation
import Locking
import QueueTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// kill -9 of the real `opqd` binary while several clients change things, then a restart on the
/// same data: every change the server acknowledged (2xx) must be there. Repeated over several
/// cycles on one data directory, so acknowledged facts accumulate.
@Suite("Crash recovery of the real opqd binary")
struct CrashRecoveryTests {
    static let cycles = 4
    static let clients = 4

    @Test(
        "kill -9 during concurrent creates, cancels, pauses, resumes and priority changes loses no acknowledged change",
        arguments: StoreChoice.allCases)
    func killNineLosesNothingAcknowledged(store choice: StoreChoice) async throws {
        let binary = try OpqdBinary.locate()
        let store = try choice.prepare()
        let data = try makeTemporaryDirectory(prefix: "opqd-crash-data")
        let logs = try makeTemporaryDirectory(prefix: "opqd-crash-logs")
        defer {
            store.remove()
            try? FileManager.default.removeItem(atPath: data)
            try? FileManager.default.removeItem(atPath: logs)
        }
        let ledger = Lock(Ledger())
        var summary: [String] = []

        var server = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-0.log", extraArguments: store.arguments)
        summary.append(String(format: "first start %.3f s", server.startupSeconds))
        for name in ["c0", "c1", "c2"] {
            let r = try server.request("POST", "/v1/queues", json: #"{"name":"\#(name)","maxConcurrentOperationCount":2,"isSuspended":true}"#)
            guard r.status == 201 else { throw Unexpected("creating queue \(name)", r) }
            ledger.withLock { $0.queues[name] = 2 }
        }

        for cycle in 0..<Self.cycles {
            if cycle > 0 {
                server = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-\(cycle).log", extraArguments: store.arguments)
                try await onThread { [server] in try StoreChoice.awaitOwner(server) }
                let (problems, note) = try await onThread { [server] in try Self.verify(server, ledger, after: "kill \(cycle)") }
                summary.append(String(format: "restart %d: %.3f s to listening; ", cycle, server.startupSeconds) + note)
                for p in problems { Issue.record("\(p)\n--- log ---\n\(server.logTail())") }
                if !problems.isEmpty { server.killNow(); return }
            }
            let startSeq = try Self.lastSeq(server)
            let killed = Lock(false)
            let inFlight = Lock(0)
            let delay = Double.random(in: 0.3...1.5)
            let before = ledger.withLock { $0.acknowledged }
            let killedWith = try await withThrowingTaskGroup(of: Int?.self) { group in
                for index in 0..<Self.clients {
                    group.addTask { [server] in
                        try await onThread {
                            Self.runClient(
                                index: index, cycle: cycle, server: server, ledger: ledger,
                                killed: killed, inFlight: inFlight, startSeq: startSeq)
                            return nil
                        }
                    }
                }
                group.addTask { [server] in
                    try await onThread {
                        usleep(useconds_t(delay * 1e6))
                        // A cycle must have acknowledged something for the kill to test: on a
                        // loaded machine the random delay can pass before the first answer, so it
                        // also waits (up to 30 s, a limit to give up at) for one.
                        _ = waitUntil(timeout: 30, every: 0.005) { ledger.withLock { $0.acknowledged } > before }
                        // Kills with requests in flight: waits (briefly) until at least two are.
                        for _ in 0..<200 where inFlight.withLock({ $0 }) < 2 { usleep(1_000) }
                        // Under the same lock the clients count requests with, so the count is
                        // exactly the requests sent and not yet answered at the kill.
                        let n = inFlight.withLock { n in
                            killed.withLock { $0 = true }
                            server.signal(SIGKILL)
                            return n
                        }
                        server.waitForExit(timeout: 10)
                        return n
                    }
                }
                var n = 0
                for try await r in group { if let r { n = r } }
                return n
            }
            #expect(server.exit == .signaled(SIGKILL), "the server should have died of SIGKILL: \(server.exit.map(\.description) ?? "running")")
            let after = ledger.withLock { $0.acknowledged }
            let problems = ledger.withLock { l in
                defer { l.problems = [] }; return l.problems
            }
            for p in problems { Issue.record("cycle \(cycle): \(p)\n--- log ---\n\(server.logTail())") }
            if !problems.isEmpty { return }
            let acked = after - before
            #expect(acked > 0, "cycle \(cycle): no change was acknowledged in \(delay) s")
            summary.append(
                String(
                    format: "cycle %d: SIGKILL after %.2f s with %d requests in flight; %d changes acknowledged",
                    cycle, delay, killedWith, acked))
        }

        server = try ServerProcess(binary: binary, data: data, logPath: logs + "/opqd-final.log", extraArguments: store.arguments)
        try await onThread { [server] in try StoreChoice.awaitOwner(server) }
        let (problems, note) = try await onThread { [server] in try Self.verify(server, ledger, after: "the last kill") }
        for p in problems { Issue.record("\(p)\n--- log ---\n\(server.logTail())") }
        summary.append(String(format: "final restart: %.3f s to listening; ", server.startupSeconds) + note)
        server.signal(SIGTERM)
        let exit = server.waitForExit(timeout: 10)
        #expect(exit == .exited(0), "after SIGTERM: \(exit.map(\.description) ?? "still running after 10 s")")
        let totals = ledger.withLock { ($0.ops.count, $0.queues.count, $0.counts) }
        summary.append(
            "facts checked: \(totals.0) operations in \(totals.1) queues; acknowledged: \(totals.2.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))"
        )
        print("CrashRecovery (\(choice)): " + summary.joined(separator: "\nCrashRecovery (\(choice)): "))
    }

    // MARK: - the model of what was acknowledged

    enum Phase: String, Sendable { case open, paused, cancelled }

    struct OpFact: Sendable {
        let id: String
        let queue: String
        let name: String?
        let dependencies: Set<String>
        /// The client that acts on it; -1 for operations adopted after a restart.
        let owner: Int
        var phase: Phase
        var priority: String
        /// An action sent but never answered (the server died): either outcome is allowed.
        var inDoubtPhase: Phase?
        var inDoubtPriority: String?
    }

    struct SeqFact: Sendable { let seq: Int; let operation: String?; let key: String? }

    struct Ledger: Sendable {
        /// Acknowledged queues and their maxConcurrentOperationCount (all suspended).
        var queues: [String: Int] = [:]
        var queuesInDoubt: [String: Int] = [:]
        var ops: [String: OpFact] = [:]
        /// Acknowledged operation ids in acknowledgement order (to pick dependencies from).
        var order: [String] = []
        /// Creates sent whose answer never came.
        var createsInDoubt = 0
        /// The newest event seq seen in the feed before some change that was then acknowledged:
        /// durable, since the acknowledgement waits for everything changed before it.
        var ackedSeq: SeqFact?
        /// The newest seq any client saw in the feed (durable or not).
        var highestSeenSeq = 0
        var problems: [String] = []
        var counts: [String: Int] = [:]

        var acknowledged: Int { counts.values.reduce(0, +) }

        mutating func acknowledge(seq: SeqFact?) {
            guard let seq else { return }
            if seq.seq > (ackedSeq?.seq ?? 0) { ackedSeq = seq }
        }
    }

    // MARK: - a client

    static let priorities = ["veryLow", "low", "normal", "high", "veryHigh"]

    /// Sends changes one after another until the server is killed. Every 2xx becomes a fact;
    /// an action whose answer never came is marked in doubt.
    static func runClient(index: Int, cycle: Int, server: ServerProcess, ledger: Lock<Ledger>, killed: Lock<Bool>, inFlight: Lock<Int>, startSeq: Int) {
        var lastSeen = startSeq
        var probe: SeqFact? = nil
        var created = 0

        func fail(_ what: String) { ledger.withLock { $0.problems.append("client \(index): \(what)") } }

        /// Sends one request; nil means the server went away (then `killed` is set, else it is a problem).
        func send(_ method: String, _ path: String, _ json: String?) -> TestResponse? {
            inFlight.withLock { $0 += 1 }
            let outcome = server.exchange(method, path, json: json, timeout: 15)
            inFlight.withLock { $0 -= 1 }
            if let r = outcome.response { return r }
            if !killed.withLock({ $0 }) { fail("\(method) \(path) before the kill: \(outcome)") }
            return nil
        }

        /// A change to one of this client's operations: in doubt while in flight, a fact once 2xx.
        func change(_ id: String, phase: Phase?, priority: String?, _ method: String, _ path: String, _ json: String?, kind: String) -> Bool {
            ledger.withLock { l in
                l.ops[id]?.inDoubtPhase = phase
                l.ops[id]?.inDoubtPriority = priority
            }
            let seen = probe
            guard let r = send(method, path, json) else { return false }
            let object = r.object
            ledger.withLock { l in
                l.ops[id]?.inDoubtPhase = nil
                l.ops[id]?.inDoubtPriority = nil
                guard r.status == 200 else {
                    l.problems.append("client \(index): \(method) \(path) \(json ?? "") refused though the model allows it:\n\(r)")
                    return
                }
                if let phase { l.ops[id]?.phase = phase }
                if let priority { l.ops[id]?.priority = priority }
                l.counts[kind, default: 0] += 1
                l.acknowledge(seq: seen)
                if let phase, phase != Self.phase(of: object) {
                    l.problems.append("client \(index): \(method) \(path) answered 200 with state \(object["state"] ?? "none"), expected \(phase):\n\(r)")
                }
                if let priority, object["queuePriority"] as? String != priority {
                    l.problems.append(
                        "client \(index): \(method) \(path) answered 200 with priority \(object["queuePriority"] ?? "none"), expected \(priority)")
                }
            }
            return true
        }

        while !killed.withLock({ $0 }) {
            let roll = Int.random(in: 0..<100)
            let mine = ledger.withLock { l in l.ops.values.filter { $0.owner == index && $0.phase != .cancelled }.map { ($0.id, $0.phase) } }
            let open = mine.filter { $0.1 == .open }.map(\.0)
            let paused = mine.filter { $0.1 == .paused }.map(\.0)
            if roll < 10 {
                // Reads the feed: its newest event becomes acknowledged with the next change.
                guard let r = send("GET", "/v1/events?after=\(lastSeen)&limit=10000", nil) else { return }
                guard r.status == 200, let events = r.object["events"] as? [[String: Any]] else {
                    fail("GET /v1/events?after=\(lastSeen) answered:\n\(r)")
                    return
                }
                if let last = events.last, let seq = (last["seq"] as? NSNumber)?.intValue {
                    probe = SeqFact(seq: seq, operation: last["operation"] as? String, key: last["key"] as? String)
                    lastSeen = seq
                    ledger.withLock { $0.highestSeenSeq = max($0.highestSeenSeq, seq) }
                }
            } else if roll < 50 || mine.isEmpty {
                // A create, on any queue, sometimes depending on earlier acknowledged operations
                // (of any client, in any queue).
                let (queue, dependencies) = ledger.withLock { l -> (String, [String]) in
                    let queue = l.queues.keys.randomElement()!
                    var deps: Set<String> = []
                    if !l.order.isEmpty {
                        for _ in 0..<Int.random(in: 0...2) { deps.insert(l.order[Int.random(in: max(0, l.order.count - 200)..<l.order.count)]) }
                    }
                    l.createsInDoubt += 1
                    return (queue, Array(deps))
                }
                let priority = priorities.randomElement()!
                let name = "c\(cycle)-\(index)-\(created)"
                created += 1
                let deps = dependencies.map { "\"\($0)\"" }.joined(separator: ",")
                let body = #"{"kind":"delay","name":"\#(name)","spec":{"seconds":3600},"queuePriority":"\#(priority)","dependencies":[\#(deps)]}"#
                let seen = probe
                guard let r = send("POST", "/v1/queues/\(queue)/operations", body) else { return }
                let object = r.object
                ledger.withLock { l in
                    l.createsInDoubt -= 1
                    guard r.status == 201, let id = object["id"] as? String else {
                        l.problems.append("client \(index): POST /v1/queues/\(queue)/operations \(body) answered:\n\(r)")
                        return
                    }
                    if object["queue"] as? String != queue || Set(object["dependencies"] as? [String] ?? []) != Set(dependencies)
                        || object["queuePriority"] as? String != priority
                    {
                        l.problems.append("client \(index): the 201 for \(body) describes another operation:\n\(r)")
                    }
                    l.ops[id] = OpFact(
                        id: id, queue: queue, name: name, dependencies: Set(dependencies), owner: index,
                        phase: .open, priority: priority)
                    l.order.append(id)
                    l.counts["create", default: 0] += 1
                    l.acknowledge(seq: seen)
                }
            } else if roll < 62 {
                let id = mine.randomElement()!.0
                guard change(id, phase: .cancelled, priority: nil, "POST", "/v1/operations/\(id)/cancel", nil, kind: "cancel") else { return }
            } else if roll < 75, let id = open.randomElement() {
                guard change(id, phase: .paused, priority: nil, "POST", "/v1/operations/\(id)/pause", nil, kind: "pause") else { return }
            } else if roll < 85, let id = paused.randomElement() {
                guard change(id, phase: .open, priority: nil, "POST", "/v1/operations/\(id)/resume", nil, kind: "resume") else { return }
            } else if roll < 97 {
                let id = mine.randomElement()!.0
                let priority = priorities.randomElement()!
                guard change(id, phase: nil, priority: priority, "PATCH", "/v1/operations/\(id)", #"{"queuePriority":"\#(priority)"}"#, kind: "priority") else {
                    return
                }
            } else {
                // A new queue: its name is known before the answer, so an unanswered one is in doubt by name.
                let name = "k\(cycle)-\(index)-\(created)"
                created += 1
                let max = Int.random(in: 1...8)
                ledger.withLock { $0.queuesInDoubt[name] = max }
                let seen = probe
                guard let r = send("POST", "/v1/queues", #"{"name":"\#(name)","maxConcurrentOperationCount":\#(max),"isSuspended":true}"#) else { return }
                ledger.withLock { l in
                    l.queuesInDoubt[name] = nil
                    guard r.status == 201 else {
                        l.problems.append("client \(index): creating queue \(name) answered:\n\(r)")
                        return
                    }
                    l.queues[name] = max
                    l.counts["queue", default: 0] += 1
                    l.acknowledge(seq: seen)
                }
            }
        }
    }

    static func phase(of op: [String: Any]) -> Phase? {
        switch op["state"] as? String {
        case "pending", "ready": return op["isCancelled"] as? Bool == false && op["isPaused"] as? Bool == false ? .open : nil
        case "paused": return op["isPaused"] as? Bool == true ? .paused : nil
        case "finished": return op["outcome"] as? String == "cancelled" && op["isCancelled"] as? Bool == true ? .cancelled : nil
        default: return nil
        }
    }

    // MARK: - checks after a restart

    /// The newest event seq, from `/metrics`.
    static func lastSeq(_ server: ServerProcess) throws -> Int {
        let r = try server.request("GET", "/metrics")
        guard r.status == 200, let line = r.text.split(separator: "\n").first(where: { $0.hasPrefix("opqd_event_sequence ") }),
            let seq = Int(line.split(separator: " ").last ?? "")
        else { throw Unexpected("no opqd_event_sequence in /metrics", r) }
        return seq
    }

    /// Checks every acknowledged fact against the restarted server, then settles what was in
    /// doubt to what the server now says (that is durable: it was read back from the store).
    /// Returns the problems found.
    static func verify(_ server: ServerProcess, _ ledger: Lock<Ledger>, after what: String) throws -> (problems: [String], note: String) {
        var problems: [String] = []
        var actionsInDoubt = 0, actionsApplied = 0
        var model = ledger.withLock { $0 }

        // Queues.
        let list = try server.request("GET", "/v1/queues")
        guard list.status == 200 else { throw Unexpected("GET /v1/queues", list) }
        var serverQueues: [String: [String: Any]] = [:]
        for q in list.objects("queues") { if let name = q["name"] as? String { serverQueues[name] = q } }
        for (name, max) in model.queues {
            guard let q = serverQueues[name] else {
                problems.append("after \(what): acknowledged queue \(name) is gone")
                continue
            }
            if q["isSuspended"] as? Bool != true || (q["maxConcurrentOperationCount"] as? NSNumber)?.intValue != max {
                problems.append("after \(what): queue \(name) should be suspended with maxConcurrentOperationCount \(max): \(q)")
            }
        }
        for name in serverQueues.keys where model.queues[name] == nil {
            if let max = model.queuesInDoubt[name] {
                model.queues[name] = max  // created by a request in flight at the kill
            } else {
                problems.append("after \(what): queue \(name) exists though no request created it")
            }
        }
        model.queuesInDoubt = [:]

        // Operations, every page of every queue.
        var serverOps: [String: [String: Any]] = [:]
        for name in serverQueues.keys.sorted() {
            var after: String? = nil
            repeat {
                let path = "/v1/queues/\(name)/operations?limit=1000" + (after.map { "&after=\($0)" } ?? "")
                let page = try server.request("GET", path)
                guard page.status == 200 else { throw Unexpected("GET \(path)", page) }
                for op in page.objects("operations") { if let id = op["id"] as? String { serverOps[id] = op } }
                after = page.object["next"] as? String
            } while after != nil
        }
        var lost = 0
        for (id, fact) in model.ops {
            guard let op = serverOps[id] else {
                lost += 1
                if lost <= 10 { problems.append("after \(what): acknowledged operation \(id) (\(fact.name ?? "-") in \(fact.queue)) is gone") }
                continue
            }
            let phase = Self.phase(of: op)
            let priority = op["queuePriority"] as? String
            var allowedPhases = [fact.phase]
            if let p = fact.inDoubtPhase { allowedPhases.append(p) }
            var allowedPriorities = [fact.priority]
            if let p = fact.inDoubtPriority { allowedPriorities.append(p) }
            if op["queue"] as? String != fact.queue || Set(op["dependencies"] as? [String] ?? []) != fact.dependencies
                || (fact.name != nil && op["name"] as? String != fact.name)
            {
                problems.append(
                    "after \(what): operation \(id) should be \(fact.name ?? "-") in \(fact.queue) depending on \(fact.dependencies.sorted()): \(op)")
            }
            if phase == nil || !allowedPhases.contains(phase!) {
                problems.append(
                    "after \(what): operation \(id) should be \(allowedPhases.map(\.rawValue).joined(separator: " or ")), is \(op["state"] ?? "-")/\(op["outcome"] ?? "-") paused=\(op["isPaused"] ?? "-"): \(op)"
                )
            }
            if priority == nil || !allowedPriorities.contains(priority!) {
                problems.append("after \(what): operation \(id) should have priority \(allowedPriorities.joined(separator: " or ")), has \(priority ?? "none")")
            }
            if fact.inDoubtPhase != nil || fact.inDoubtPriority != nil {
                actionsInDoubt += 1
                if (fact.inDoubtPhase != nil && phase == fact.inDoubtPhase) || (fact.inDoubtPriority != nil && priority == fact.inDoubtPriority) {
                    actionsApplied += 1
                }
            }
            if let phase { model.ops[id]?.phase = phase }
            if let priority { model.ops[id]?.priority = priority }
            model.ops[id]?.inDoubtPhase = nil
            model.ops[id]?.inDoubtPriority = nil
        }
        if lost > 0 { problems.append("after \(what): \(lost) of \(model.ops.count) acknowledged operations are gone") }
        // Operations no acknowledged create made: at most one per create in flight at a kill.
        let unknown = serverOps.keys.filter { model.ops[$0] == nil }
        if unknown.count > model.createsInDoubt {
            problems.append(
                "after \(what): \(unknown.count) operations exist that no acknowledged create made, but only \(model.createsInDoubt) creates were unanswered")
        }
        for id in unknown {
            let op = serverOps[id]!
            model.ops[id] = OpFact(
                id: id, queue: op["queue"] as? String ?? "", name: op["name"] as? String,
                dependencies: Set(op["dependencies"] as? [String] ?? []), owner: -1,
                phase: Self.phase(of: op) ?? .open, priority: op["queuePriority"] as? String ?? "normal")
            model.order.append(id)
        }
        let note = "\(actionsInDoubt) actions in doubt (\(actionsApplied) took effect), \(model.createsInDoubt) creates in doubt (\(unknown.count) took effect)"
        model.createsInDoubt = 0

        // The change feed continues where the acknowledged part left off.
        let last = try lastSeq(server)
        if let acked = model.ackedSeq {
            let r = try server.request("GET", "/v1/events?after=\(acked.seq - 1)&limit=1")
            let first = r.objects("events").first
            if r.status != 200 || (first?["seq"] as? NSNumber)?.intValue != acked.seq
                || first?["operation"] as? String != acked.operation || first?["key"] as? String != acked.key
            {
                problems.append(
                    "after \(what): event \(acked.seq) (\(acked.operation ?? "-") \(acked.key ?? "-")) was acknowledged; GET /v1/events?after=\(acked.seq - 1) answered:\n\(r)"
                )
            }
            if last < acked.seq { problems.append("after \(what): the newest seq is \(last), below the acknowledged \(acked.seq)") }
        }
        // A new change gets a larger seq than anything kept.
        let queue = model.queues.keys.sorted().first!
        let created = try server.request("POST", "/v1/queues/\(queue)/operations", json: #"{"kind":"delay","spec":{"seconds":3600}}"#)
        if created.status == 201, let id = created.string("id") {
            model.ops[id] = OpFact(id: id, queue: queue, name: nil, dependencies: [], owner: -1, phase: .open, priority: "normal")
            model.order.append(id)
            let events = try server.request("GET", "/v1/operations/\(id)/events").objects("events").compactMap { ($0["seq"] as? NSNumber)?.intValue }
            if events.isEmpty || events.min()! <= max(last, model.ackedSeq?.seq ?? 0) {
                problems.append(
                    "after \(what): a new operation's events have seqs \(events), not above the newest kept \(last) and acknowledged \(model.ackedSeq?.seq ?? 0)"
                )
            }
            if let newest = events.min(), newest <= model.highestSeenSeq {
                print(
                    "CrashRecovery: note: after \(what) a new change got seq \(newest), which the feed had already shown for a change lost in the kill (highest seen \(model.highestSeenSeq), acknowledged \(model.ackedSeq?.seq ?? 0))"
                )
            }
        } else {
            problems.append("after \(what): a create on \(queue) answered:\n\(created)")
        }

        ledger.withLock { $0 = model }
        return (problems, note)
    }
}
