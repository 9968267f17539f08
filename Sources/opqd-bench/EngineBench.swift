import Dispatch
import Foundation
import QueueEngine
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// `opqd-bench engine`: the engine, run as the service runs it (ids, numbered events, one
/// global observer counting every change, the in-memory store, `ImmediateKind` work) against
/// `Foundation.OperationQueue` with trivial `BlockOperation`s, both at concurrency 2.
///
/// Every measurement runs in a fresh child process (this executable re-executed with a
/// hidden subcommand), so no run's heap, threads or caches pollute another.
enum EngineBench {
    static let queueName = "bench"
    static let kindName = "immediate"

    // MARK: - the parent

    struct Run {
        var opsPerSecond: Double
        var ops: Int
        var seconds: Double
        var events: Int
        var json: [String: Any]
    }

    static func main(_ args: [String]) -> Int32 {
        var quick = false
        for a in args {
            switch a {
            case "--quick": quick = true
            default:
                eprint("opqd-bench engine: unknown option '\(a)'\nusage: opqd-bench engine [--quick]\n")
                return 2
            }
        }
        let div = quick ? 10 : 1
        let flatN = 1_000_000 / div, flatSmallN = 250_000 / div
        let chainN = 100_000 / div, chainSmallN = 25_000 / div
        let faninN = 100_000 / div, memN = 1_000_000 / div
        var failures: [String] = []

        func child(_ a: [String]) -> [String: Any]? {
            let r = runSelf(a)
            if r == nil { failures.append("child \(a.joined(separator: " ")) failed") }
            return r
        }
        func run(_ impl: String, _ workload: String, _ n: Int) -> Run {
            eprint("running \(impl) \(workload) n=\(n)...\n")
            guard let j = child(["engine-run", impl, workload, String(n)]) else {
                return Run(opsPerSecond: 0, ops: 0, seconds: 0, events: 0, json: [:])
            }
            let r = Run(
                opsPerSecond: num(j["ops_per_s"]), ops: Int(num(j["ops"])), seconds: num(j["seconds"]),
                events: Int(num(j["events"])), json: j)
            if let ok = j["ok"] as? Bool, !ok { failures.append("\(impl) \(workload): \(j["problem"] ?? "check failed")") }
            return r
        }

        print("opqd-bench engine\(quick ? " --quick (sizes / 10)" : ""): engine vs Foundation.OperationQueue, maxConcurrent 2")
        print("every measurement runs in its own fresh child process (engine and Foundation alike)")
        print("engine: ids, numbered events, one observeAll observer counting changes, InMemoryStore, ImmediateKind")
        print("foundation: BlockOperation { } on OperationQueue, addDependency, waitUntilAllOperationsAreFinished()")
        print("")

        let eFlat = run("engine", "flat", flatN)
        let fFlat = run("foundation", "flat", flatN)
        let eChain = run("engine", "chain", chainN)
        let fChain = run("foundation", "chain", chainN)
        let eFanin = run("engine", "fanin", faninN)
        let fFanin = run("foundation", "fanin", faninN)
        // Linearity: the same workloads at a quarter of the size.
        let eFlatSmall = run("engine", "flat", flatSmallN)
        let eChainSmall = run("engine", "chain", chainSmallN)
        // With ImmediateKind each operation finishes while it is being added, so its
        // dependencies are already finished; these variants build the whole graph on a
        // suspended queue first (resumed inside the timed region), so every edge is tracked
        // and released; this is where Foundation on Linux goes quadratic.
        let eChainSusp = run("engine", "chain-suspended", chainN)
        let fChainSusp = run("foundation", "chain-suspended", chainN)
        let eFaninSusp = run("engine", "fanin-suspended", faninN)
        let fFaninSusp = run("foundation", "fanin-suspended", faninN)

        eprint("measuring memory...\n")
        let eMem = child(["engine-mem", "engine"] + (quick ? ["--quick"] : [])) ?? [:]
        let fMem = child(["engine-mem", "foundation"] + (quick ? ["--quick"] : [])) ?? [:]
        let eBytes = num(eMem["bytes_per_op"]), fBytes = num(fMem["bytes_per_op"])

        func ratio(_ a: Double, _ b: Double) -> Double { b > 0 ? a / b : 0 }
        func fmt(_ v: Double) -> String { v >= 100 ? String(Int(v.rounded())) : String(format: "%.2f", v) }
        func pad(_ s: String, _ w: Int, left: Bool = false) -> String {
            s.count >= w ? s : (left ? s + String(repeating: " ", count: w - s.count) : String(repeating: " ", count: w - s.count) + s)
        }
        func row(_ c: [String]) {
            print(pad(c[0], 34, left: true) + pad(c[1], 10) + pad(c[2], 14) + pad(c[3], 18) + pad(c[4], 10))
        }
        row(["workload", "ops", "engine ops/s", "Foundation ops/s", "ratio"])
        row([String(repeating: "-", count: 33), "---", "------------", "----------------", "-----"])
        for (name, e, f) in [
            ("flat (trivial ops)", eFlat, fFlat), ("chain (each depends on previous)", eChain, fChain),
            ("fan-in (1 depends on \(faninN))", eFanin, fFanin), ("chain, built suspended", eChainSusp, fChainSusp),
            ("fan-in, built suspended", eFaninSusp, fFaninSusp),
        ] {
            row([name, String(e.ops), fmt(e.opsPerSecond), fmt(f.opsPerSecond), String(format: "%.1fx", ratio(e.opsPerSecond, f.opsPerSecond))])
        }
        print("")
        print("memory per queued op (\(memN) ops on a suspended queue, RSS growth):")
        print("  engine     \(fmt(eBytes)) B/op  (rss +\(Int(num(eMem["rss_growth"])) / 1024) KiB, hwm +\(Int(num(eMem["hwm_growth"])) / 1024) KiB)")
        print("  Foundation \(fmt(fBytes)) B/op  (rss +\(Int(num(fMem["rss_growth"])) / 1024) KiB, hwm +\(Int(num(fMem["hwm_growth"])) / 1024) KiB)")
        print("")
        // Per-op cost ratio large/small: near 1 means linear.
        let flatLin = ratio(eFlatSmall.opsPerSecond, eFlat.opsPerSecond)
        let chainLin = ratio(eChainSmall.opsPerSecond, eChain.opsPerSecond)
        print("linearity (engine; per-op cost large/small, ~1 = linear):")
        print(
            "  flat  \(eFlatSmall.ops): \(fmt(eFlatSmall.opsPerSecond)) ops/s, \(eFlat.ops): \(fmt(eFlat.opsPerSecond)) ops/s -> \(String(format: "%.2f", flatLin))"
        )
        print(
            "  chain \(eChainSmall.ops): \(fmt(eChainSmall.opsPerSecond)) ops/s, \(eChain.ops): \(fmt(eChain.opsPerSecond)) ops/s -> \(String(format: "%.2f", chainLin))"
        )
        print("")
        let perOp = eFlat.ops > 0 ? Double(eFlat.events) / Double(eFlat.ops) : 0
        print("events counted by the observer: flat \(eFlat.events) (\(String(format: "%.2f", perOp))/op), chain \(eChain.events), fan-in \(eFanin.events)")
        if eFlat.events < 5 * flatN { failures.append("flat run counted \(eFlat.events) changes, expected >= \(5 * flatN)") }
        for f in failures { print("FAIL: \(f)") }

        let out: [String: Any] = [
            "quick": quick,
            "isolation": "child-process-per-measurement",
            "flat_ratio": round3(ratio(eFlat.opsPerSecond, fFlat.opsPerSecond)),
            "chain_ratio": round3(ratio(eChain.opsPerSecond, fChain.opsPerSecond)),
            "fanin_ratio": round3(ratio(eFanin.opsPerSecond, fFanin.opsPerSecond)),
            "engine_flat_ops_per_s": eFlat.opsPerSecond.rounded(),
            "foundation_flat_ops_per_s": fFlat.opsPerSecond.rounded(),
            "engine_chain_ops_per_s": eChain.opsPerSecond.rounded(),
            "foundation_chain_ops_per_s": fChain.opsPerSecond.rounded(),
            "engine_fanin_ops_per_s": eFanin.opsPerSecond.rounded(),
            "foundation_fanin_ops_per_s": fFanin.opsPerSecond.rounded(),
            "engine_chain_suspended_ops_per_s": eChainSusp.opsPerSecond.rounded(),
            "engine_fanin_suspended_ops_per_s": eFaninSusp.opsPerSecond.rounded(),
            "foundation_chain_suspended_ops_per_s": fChainSusp.opsPerSecond.rounded(),
            "foundation_fanin_suspended_ops_per_s": fFaninSusp.opsPerSecond.rounded(),
            "chain_suspended_ratio": round3(ratio(eChainSusp.opsPerSecond, fChainSusp.opsPerSecond)),
            "fanin_suspended_ratio": round3(ratio(eFaninSusp.opsPerSecond, fFaninSusp.opsPerSecond)),
            "bytes_per_queued_op": round3(eBytes),
            "foundation_bytes_per_queued_op": round3(fBytes),
            "events_counted_flat": eFlat.events,
            "events_counted_chain": eChain.events,
            "events_counted_fanin": eFanin.events,
            "engine_flat_small_ops_per_s": eFlatSmall.opsPerSecond.rounded(),
            "engine_chain_small_ops_per_s": eChainSmall.opsPerSecond.rounded(),
            "flat_linearity": round3(flatLin),
            "chain_linearity": round3(chainLin),
            "ok": failures.isEmpty,
        ]
        print(jsonLine(out))
        return failures.isEmpty ? 0 : 1
    }

    // MARK: - children

    /// `engine-run IMPL WORKLOAD N`: one throughput measurement; prints one JSON line.
    static func runChild(_ args: [String]) -> Int32 {
        guard args.count == 3, let n = Int(args[2]), n > 0 else {
            eprint("usage: opqd-bench engine-run engine|foundation flat|chain|fanin|chain-suspended|fanin-suspended N\n")
            return 2
        }
        // Everything a run made stays alive until `_exit`: tearing down a million records
        // (or Foundation's 100,000-deep chain of dependencies, released recursively) is
        // neither measured nor wanted.
        let keep = KeepAlive()
        let result: [String: Any]?
        switch args[0] {
        case "engine": result = engineRun(args[1], n, keep)
        case "foundation": result = foundationRun(args[1], n, keep)
        default: result = nil
        }
        guard let result else {
            eprint("opqd-bench engine-run: unknown implementation or workload '\(args[0]) \(args[1])'\n")
            return 2
        }
        outLine(jsonLine(result))
        withExtendedLifetime(keep) {}
        _exit(0)
    }

    final class KeepAlive {
        var items: [AnyObject] = []
    }

    /// `engine-mem engine|foundation [--quick]`: RSS growth per operation queued on a
    /// suspended queue; prints one JSON line.
    static func memChild(_ args: [String]) -> Int32 {
        guard let impl = args.first, impl == "engine" || impl == "foundation" else {
            eprint("usage: opqd-bench engine-mem engine|foundation [--quick]\n")
            return 2
        }
        let n = args.contains("--quick") ? 100_000 : 1_000_000
        var keep: [AnyObject] = []
        var engineRef: QueueEngine?
        // Warm up what both sides need anyway (Foundation, Dispatch, the allocator) so the
        // delta is the operations'.
        _ = DispatchQueue.global()
        let before = memoryStatus()
        if impl == "engine" {
            let counter = Counter()
            let engine = QueueEngine(kinds: [kindName: ImmediateKind()], store: InMemoryStore())
            _ = engine.observeAll { events in counter.value.add(events.count, ordering: .relaxed) }
            try! engine.createQueue(name: queueName, maxConcurrentOperationCount: 2, isSuspended: true)
            let request = OperationRequest(kind: kindName)
            for _ in 0..<n { _ = try! engine.addOperationID(to: queueName, request) }
            engineRef = engine
        } else {
            let q = OperationQueue()
            q.maxConcurrentOperationCount = 2
            q.isSuspended = true
            for _ in 0..<n { q.addOperation(BlockOperation {}) }
            keep.append(q)
        }
        let after = memoryStatus()
        let growth = after.rss - before.rss
        outLine(
            jsonLine([
                "impl": impl, "ops": n,
                "rss_before": before.rss, "rss_after": after.rss, "rss_growth": growth,
                "hwm_growth": after.hwm - before.hwm,
                "bytes_per_op": Double(growth) / Double(n),
            ]))
        withExtendedLifetime((keep, engineRef)) {}
        _exit(0)  // skip tearing down a million operations
    }

    final class Counter: Sendable {
        let value = Atomic<Int>(0)
    }

    static func engineRun(_ workload: String, _ n: Int, _ keep: KeepAlive) -> [String: Any]? {
        guard ["flat", "chain", "fanin", "chain-suspended", "fanin-suspended"].contains(workload) else { return nil }
        let counter = Counter()
        let engine = QueueEngine(kinds: [kindName: ImmediateKind()], store: InMemoryStore())
        _ = engine.observeAll { events in counter.value.add(events.count, ordering: .relaxed) }
        keep.items.append(engine)
        let suspended = workload.hasSuffix("-suspended")
        try! engine.createQueue(name: queueName, maxConcurrentOperationCount: 2, isSuspended: suspended)
        let done = DispatchSemaphore(value: 0)
        var ops = 0

        let start = now()
        do {
            switch workload {
            case "flat":
                let request = OperationRequest(kind: kindName)
                for _ in 0..<n { _ = try engine.addOperationID(to: queueName, request) }
                ops = n
            case "chain", "chain-suspended":
                var prev = try engine.addOperationID(to: queueName, OperationRequest(kind: kindName))
                for _ in 1..<n {
                    prev = try engine.addOperationID(to: queueName, OperationRequest(kind: kindName, dependencies: [prev]))
                }
                ops = n
            default:  // fan-in
                var ids: [OperationID] = []
                ids.reserveCapacity(n)
                let request = OperationRequest(kind: kindName)
                for _ in 0..<n { ids.append(try engine.addOperationID(to: queueName, request)) }
                _ = try engine.addOperationID(to: queueName, OperationRequest(kind: kindName, dependencies: ids))
                ops = n + 1
            }
            if suspended { try engine.resumeQueue(queueName) }
            _ = try engine.onIdle(queueName) { _ in done.signal() }
        } catch {
            eprint("engine error: \(error)\n")
            exit(1)
        }
        done.wait()
        let seconds = now() - start

        // The observer is fed by whichever thread drains; let it catch up, then check.
        let expectedEvents = Int(engine.nextSequence) - 1
        let deadline = now() + 10
        while counter.value.load(ordering: .relaxed) < expectedEvents && now() < deadline { usleep(1000) }
        let events = counter.value.load(ordering: .relaxed)
        let snap = try! engine.queue(named: queueName)
        let finished = snap.counts[.finished] ?? 0
        var problems: [String] = []
        if finished != ops { problems.append("\(finished) of \(ops) finished") }
        if events != expectedEvents { problems.append("observer saw \(events) of \(expectedEvents) changes") }
        var out: [String: Any] = [
            "impl": "engine", "workload": workload, "ops": ops, "seconds": seconds,
            "ops_per_s": Double(ops) / seconds, "events": events, "events_numbered": expectedEvents,
            "ok": problems.isEmpty,
        ]
        if !problems.isEmpty { out["problem"] = problems.joined(separator: "; ") }
        return out
    }

    static func foundationRun(_ workload: String, _ n: Int, _ keep: KeepAlive) -> [String: Any]? {
        guard ["flat", "chain", "fanin", "chain-suspended", "fanin-suspended"].contains(workload) else { return nil }
        let q = OperationQueue()
        q.maxConcurrentOperationCount = 2
        let suspended = workload.hasSuffix("-suspended")
        q.isSuspended = suspended
        let ran = Counter()
        var all: [Operation] = []
        all.reserveCapacity(n + 1)
        keep.items.append(q)
        var ops = 0
        let start = now()
        switch workload {
        case "flat":
            for _ in 0..<n {
                let op = BlockOperation { ran.value.add(1, ordering: .relaxed) }
                all.append(op)
                q.addOperation(op)
            }
            ops = n
        case "chain", "chain-suspended":
            var prev = BlockOperation { ran.value.add(1, ordering: .relaxed) }
            all.append(prev)
            q.addOperation(prev)
            for _ in 1..<n {
                let op = BlockOperation { ran.value.add(1, ordering: .relaxed) }
                op.addDependency(prev)
                all.append(op)
                q.addOperation(op)
                prev = op
            }
            ops = n
        default:  // fan-in
            let last = BlockOperation { ran.value.add(1, ordering: .relaxed) }
            for _ in 0..<n {
                let op = BlockOperation { ran.value.add(1, ordering: .relaxed) }
                last.addDependency(op)
                all.append(op)
                q.addOperation(op)
            }
            all.append(last)
            q.addOperation(last)
            ops = n + 1
        }
        if suspended { q.isSuspended = false }
        q.waitUntilAllOperationsAreFinished()
        let seconds = now() - start
        keep.items.append(all as AnyObject)
        let count = ran.value.load(ordering: .relaxed)
        var out: [String: Any] = [
            "impl": "foundation", "workload": workload, "ops": ops, "seconds": seconds,
            "ops_per_s": Double(ops) / seconds, "events": 0, "ok": count == ops,
        ]
        if count != ops { out["problem"] = "\(count) of \(ops) blocks ran" }
        return out
    }

    // MARK: - helpers

    static func now() -> Double { monotonicSeconds() }

    /// VmRSS and VmHWM of this process, in bytes.
    static func memoryStatus() -> (rss: Int, hwm: Int) {
        guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return (0, 0) }
        var rss = 0, hwm = 0
        for line in text.split(separator: "\n") {
            let parts = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard parts.count >= 2, let kb = Int(parts[1]) else { continue }
            if parts[0] == "VmRSS:" { rss = kb * 1024 }
            if parts[0] == "VmHWM:" { hwm = kb * 1024 }
        }
        return (rss, hwm)
    }

    /// Re-executes this binary with `args` and parses the last line of its output as JSON.
    static func runSelf(_ args: [String]) -> [String: Any]? {
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        let run: (exitCode: Int32?, output: [UInt8])
        do { run = try ChildProcess.capture(exe, args, stderr: .inherit) } catch {
            eprint("cannot run child \(args): \(error)\n")
            return nil
        }
        guard run.exitCode == 0 else {
            eprint("child \(args) ended with \(run.exitCode.map { "status \($0)" } ?? "a signal")\n")
            return nil
        }
        let text = String(decoding: run.output, as: UTF8.self)
        guard let line = text.split(separator: "\n").last,
            let obj = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        else {
            eprint("child \(args) printed no JSON: \(text)\n")
            return nil
        }
        return obj
    }

    static func num(_ v: Any?) -> Double {
        if let d = v as? Double { return d }
        if let i = v as? Int { return Double(i) }
        if let n = v as? NSNumber { return n.doubleValue }
        return 0
    }

    static func round3(_ v: Double) -> Double { (v * 1000).rounded() / 1000 }

    /// One JSON object on one line, keys sorted.
    static func jsonLine(_ obj: [String: Any]) -> String {
        guard let data = try? JSONSerialization.data(withJSONObject: obj, options: [.sortedKeys]) else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }
}

/// Writes to standard error, unbuffered.
func eprint(_ s: String) { FileHandle.standardError.write(Data(s.utf8)) }

/// Writes one line to standard output, unbuffered (children end with `_exit`).
func outLine(_ s: String) { FileHandle.standardOutput.write(Data((s + "\n").utf8)) }
