import Foundation
import TestKit
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension ClusterTests {
    /// API.md "Schedules" with several instances: a handover never fires a nominal time twice
    /// and never loses one. Schedules every second in 6 queues (`catchup: skip`, which would drop
    /// the times of a stop) fire while each instance in turn is stopped with SIGTERM and started
    /// again on its own `--data`: every queue moves, cleanly, and each schedule's runs must be one
    /// per second, without a repeat or a hole, from the first to the last. Half of the queues
    /// also run a long `command`: a partition with one is given up only after its child had its
    /// time to stop (up to 3 s), so those moves certainly span nominal times; the others' moves
    /// take a fraction of a second.
    @Test("schedules every second through a rolling restart: every nominal time runs once, none twice, none lost")
    func scheduleThroughRollingRestart() async throws {
        try await TestCluster(name: "sched-roll", arguments: ["--allow-command", Self.sleep]).run(Self.scheduleThroughRollingRestart)
    }

    static let sleep = "/bin/sleep"

    static func scheduleThroughRollingRestart(_ cluster: TestCluster) throws {
        guard waitUntil(timeout: 30, every: 0.05, { cluster.nodes.allSatisfy { $0.isReady(timeout: 2) } }) else {
            cluster.record(["the instances did not answer /readyz 200 within 30 s"], "readyz")
            return
        }
        let queues = (0..<6).map { "ticks-\($0)" }
        for (n, queue) in queues.enumerated() {
            try cluster.createQueue(queue, maxConcurrent: 100, via: cluster.nodes[n % 3])
            let made = try cluster.nodes[(n + 1) % 3].request(
                "POST", "/v1/queues/\(queue)/schedules",
                json: #"{"name":"tick","every":1,"operation":{"kind":"delay","spec":{"seconds":0}},"overlap":"allow","catchup":{"policy":"skip"}}"#)
            guard made.status == 201 else { throw Unexpected("creating the schedule of \(queue)", made) }
            if n % 2 == 0 {
                let command = try cluster.nodes[n % 3].request(
                    "POST", "/v1/queues/\(queue)/operations", json: #"{"kind":"command","spec":{"argv":["\#(sleep)","60"]}}"#)
                guard command.status == 201 else { throw Unexpected("creating a command in \(queue)", command) }
            }
        }

        var up = cluster.nodes
        var started: [ClusterNode] = []
        defer { for node in started { node.stop() } }
        var problems: [String] = []
        let t0 = monotonicSeconds()
        usleep(2_000_000)
        for i in 0..<3 {
            guard let k = up.firstIndex(where: { $0.index == i }) else { continue }
            up.remove(at: k).stop(grace: 20)
            let node = try ClusterNode(
                index: i, binary: try OpqdBinary.locate(),
                arguments: ["--store", cluster.database, "--lease", String(Int(TestCluster.lease)), "--allow-command", sleep],
                data: cluster.logs + "/data-\(i)", logPath: cluster.logs + "/opqd-\(i).log")
            started.append(node)
            guard waitUntil(timeout: 20, every: 0.02, { node.isReady() }) else {
                problems.append("opqd #\(i), started again, did not answer /readyz 200 within 20 s")
                break
            }
            up.append(node)
            usleep(1_500_000)
        }
        usleep(2_000_000)
        let took = monotonicSeconds() - t0

        var total = 0
        for (n, queue) in queues.enumerated() {
            // Its runs, listed through an instance (forwarded to the queue's holder).
            let node = up[n % up.count]
            var runs: [Int64] = []
            var cursor: String? = nil
            for _ in 0..<20 {
                let target = "/v1/queues/\(queue)/operations?limit=1000" + (cursor.map { "&after=\($0)" } ?? "")
                let r = try node.request("GET", target)
                guard r.status == 200 else { throw Unexpected("listing \(target) through opqd #\(node.index)", r) }
                for o in r.objects("operations") where o["kind"] as? String != "command" {
                    guard let tag = o["schedule"] as? [String: Any], let text = tag["nominalTime"] as? String, let at = rfc3339Seconds(text) else {
                        problems.append("\(queue): operation \(o["id"] ?? "?") carries no schedule.nominalTime: \(o["schedule"] ?? "nil")")
                        continue
                    }
                    runs.append(at)
                }
                cursor = r.string("next")
                if cursor == nil { break }
            }
            runs.sort()
            total += runs.count
            let schedule = try node.request("GET", "/v1/queues/\(queue)/schedules/tick")
            let counts = "runs \(schedule.int("runs") ?? -1), skipped \(schedule.int("skipped") ?? -1), missed \(schedule.int("missed") ?? -1)"
            var seen = Set<Int64>()
            let twice = runs.filter { !seen.insert($0).inserted }
            if !twice.isEmpty { problems.append("\(queue): nominal times run twice: \(Array(Set(twice)).sorted().map(iso)) (\(counts))") }
            guard let first = runs.first, let last = runs.last else {
                problems.append("\(queue): the schedule made no run")
                continue
            }
            let holes = (first...last).filter { !seen.contains($0) }
            if !holes.isEmpty {
                problems.append(
                    "\(queue): \(holes.count) nominal time(s) between \(iso(first)) and \(iso(last)) got no run: \(holes.prefix(10).map(iso)) (\(counts))")
            }
            // It fired all along: about one run per second of the test.
            if Double(seen.count) < took - 4 { problems.append(String(format: "%@: only %d distinct runs in %.1f s", queue, seen.count, took)) }
            // Every instance was stopped once: each queue moved at least once (epoch 1 was its
            // first holder's).
            if let epoch = cluster.epoch(of: queue), epoch < 2 { problems.append("\(queue): its partition never moved (epoch \(epoch))") }
            if holes.isEmpty && schedule.int("missed") != 0 { problems.append("\(queue): the schedule counts nominal times missed (\(counts))") }
        }
        print(
            String(
                format: "ClusterTests.scheduleThroughRollingRestart: %d runs of %d schedules over %.1f s of rolling restart, %d problem(s)", total,
                queues.count, took, problems.count))
        cluster.record(problems, "schedules every second through a rolling restart")
    }
}

/// Whole seconds since 1970 of an RFC 3339 time (`2026-11-22T10:00:00.000Z`).
private func rfc3339Seconds(_ text: String) -> Int64? {
    let f = ISO8601DateFormatter()
    f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    return f.date(from: text).map { Int64($0.timeIntervalSince1970.rounded(.down)) }
}

private func iso(_ seconds: Int64) -> String {
    let f = ISO8601DateFormatter()
    f.formatOptions = [.withInternetDateTime]
    return f.string(from: Date(timeIntervalSince1970: Double(seconds)))
}
