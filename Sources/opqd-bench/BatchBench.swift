// `opqd-bench batch`: durable creates through `POST /v1/operations:batch` (1,000 operations per
// call, a graph across queues) against single creates, on one opqd with --sync full.
import Dispatch
import Foundation

enum BatchBench {
    static let usage = "usage: opqd-bench batch [--batches N] [--size 1000] [--singles N] [--connections C] [--sync full|normal] [--quick]\n"

    static func main(_ args: [String]) -> Int32 {
        var batches = 100, size = 1000, singles = 20_000, connections = 4, sync = "full"
        var i = 0
        while i < args.count {
            switch args[i] {
            case "--quick": batches = 10; singles = 2_000
            case "--batches" where i + 1 < args.count: i += 1; batches = max(1, Int(args[i]) ?? 100)
            case "--size" where i + 1 < args.count: i += 1; size = max(1, min(Int(args[i]) ?? 1000, 100_000))
            case "--singles" where i + 1 < args.count: i += 1; singles = max(1, Int(args[i]) ?? 20_000)
            case "--connections" where i + 1 < args.count: i += 1; connections = max(1, min(Int(args[i]) ?? 4, 256))
            case "--sync" where i + 1 < args.count: i += 1; sync = args[i]
            default:
                eprint("opqd-bench batch: unknown option '\(args[i])'\n" + usage)
                return 2
            }
            i += 1
        }
        print("opqd-bench batch: --sync \(sync), \(connections) keep-alive connection(s) per mode")
        print(BenchSupport.machineLine())
        print("opqd: \(BenchSupport.opqdBinary())")
        let extra = [
            "--sync", sync, "--max-batch", String(max(size, 1000)), "--max-unfinished", "100000000", "--max-unfinished-per-queue", "100000000",
            "--max-body", String(64 << 20),
        ]
        let server: OpqdServer
        do { server = try OpqdServer(label: "batch-\(sync)", extra: extra) } catch {
            eprint("opqd-bench batch: \(error)\n")
            return 1
        }
        defer { server.stop() }
        let queues = ["a", "b", "c", "d"]
        do { for q in queues { try server.createQueue(q, suspended: true) } } catch {
            eprint("opqd-bench batch: \(error)\n")
            return 1
        }
        // One body, sent again and again: every tenth element waits for the one before it
        // (a `ref:`), elements spread over four queues.
        var body = "{\"operations\":["
        for e in 0..<size {
            if e > 0 { body += "," }
            body += "{\"queue\":\"\(queues[e % queues.count])\",\"ref\":\"r\(e)\",\"kind\":\"delay\",\"spec\":{\"seconds\":60}"
            if e % 10 == 9 { body += ",\"dependencies\":[\"ref:r\(e - 1)\"]" }
            body += "}"
        }
        body += "]}"
        let batchBytes = Array(body.utf8)
        let single = Array("{\"kind\":\"delay\",\"spec\":{\"seconds\":60}}".utf8)

        let (batchWall, batchBad, batchLat) = drive(server: server, connections: connections, count: batches) { c, n in
            let r = try c.request("POST", "/v1/operations:batch", body: batchBytes)
            return r.status == 201
        }
        let (singleWall, singleBad, singleLat) = drive(server: server, connections: max(connections, 32), count: singles) { c, n in
            let r = try c.request("POST", "/v1/queues/\(queues[n % queues.count])/operations", body: single)
            return r.status == 201
        }
        let batchesPerSecond = Double(batches) / batchWall
        let batchOps = batchesPerSecond * Double(size)
        let singleOps = Double(singles) / singleWall
        print("")
        print("mode     connections  requests  operations  wall s   requests/s   operations/s   p50 ms   p99 ms  non-201")
        func row(_ name: String, _ conns: Int, _ reqs: Int, _ ops: Int, _ wall: Double, _ lat: [Double], _ bad: Int) {
            let s = lat.sorted()
            func pct(_ p: Double) -> Double { s.isEmpty ? 0 : s[min(s.count - 1, Int(Double(s.count) * p))] * 1000 }
            print(
                [
                    BenchSupport.pad(name, 8), BenchSupport.pad(String(conns), 11, right: true), BenchSupport.pad(String(reqs), 9, right: true),
                    BenchSupport.pad(String(ops), 11, right: true), BenchSupport.pad(BenchSupport.fmt(wall, 2), 7, right: true),
                    BenchSupport.pad(BenchSupport.fmt(Double(reqs) / wall, 1), 12, right: true),
                    BenchSupport.pad(BenchSupport.grouped(Double(ops) / wall), 14, right: true),
                    BenchSupport.pad(BenchSupport.fmt(pct(0.5), 2), 8, right: true), BenchSupport.pad(BenchSupport.fmt(pct(0.99), 2), 8, right: true),
                    BenchSupport.pad(String(bad), 8, right: true),
                ].joined(separator: " "))
        }
        row("batch", connections, batches, batches * size, batchWall, batchLat, batchBad)
        row("single", max(connections, 32), singles, singles, singleWall, singleLat, singleBad)
        print(
            "(each 201 answered after its commit; a batch of \(size): one commit; ops/s via batches / via single creates = \(BenchSupport.fmt(batchOps / singleOps, 1))x)"
        )
        let held = queues.reduce(0) { acc, q in acc + (BenchSupport.int((try? server.queue(q))?["operationCount"]) ?? 0) }
        let expected = batches * size + singles
        if held != expected { print("!! operationCount over the queues is \(held), expected \(expected)") }
        print(
            BenchSupport.jsonLine([
                ("sync", sync), ("batch_size", size), ("batches_per_s", BenchSupport.round3(batchesPerSecond)),
                ("ops_per_s_batch", Int(batchOps.rounded())), ("ops_per_s_single", Int(singleOps.rounded())),
                ("connections_batch", connections), ("connections_single", max(connections, 32)), ("non_201", batchBad + singleBad),
                ("ok", held == expected && batchBad + singleBad == 0),
            ]))
        return held == expected && batchBad + singleBad == 0 ? 0 : 1
    }

    /// `count` requests over `connections` keep-alive connections; wall time, failures, latencies.
    static func drive(server: OpqdServer, connections: Int, count: Int, _ send: @escaping @Sendable (KeepAliveClient, Int) throws -> Bool)
        -> (Double, Int, [Double])
    {
        let box = AtomicBox()
        let bad = Locked<Int>(0)
        let latencies = Locked<[Double]>([])
        let group = DispatchGroup()
        let port = server.port
        let t0 = BenchSupport.now()
        for _ in 0..<min(connections, count) {
            group.enter()
            let t = Thread {
                defer { group.leave() }
                let c = KeepAliveClient(port: Int(port), retries: 0)
                defer { c.close() }
                var mine: [Double] = []
                while true {
                    let n = box.take()
                    if n >= count { break }
                    let s = BenchSupport.now()
                    let ok = (try? send(c, n)) ?? false
                    mine.append(BenchSupport.now() - s)
                    if !ok { bad.withLock { $0 += 1 } }
                }
                latencies.withLock { $0.append(contentsOf: mine) }
            }
            t.stackSize = 1 << 20
            t.start()
        }
        group.wait()
        return (BenchSupport.now() - t0, bad.withLock { $0 }, latencies.withLock { $0 })
    }
}
