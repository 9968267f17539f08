// The measurements of `opqd-bench flow`, each run in a fresh child process
// (`opqd-bench flow-run ...`), as EngineBench runs its own.
import Dispatch
import Foundation
import QueueEngine
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A kind whose runs end only when the benchmark says so: `start` hands the run over.
final class ManualKind: OperationKind {
    let running = Mutex<[ExecutionContext]>([])
    func start(_ context: ExecutionContext) { running.withLock { $0.append(context) } }
    func cancel(_ context: ExecutionContext) {}
    func pause(_ context: ExecutionContext) {}
    /// The newest run not yet taken.
    func take() -> ExecutionContext? { running.withLock { $0.popLast() } }
    var count: Int { running.withLock { $0.count } }
}

extension FlowBench {
    static let queueName = "bench"

    /// `flow-run limiter|fair N KEYS` and `flow-run decide SAMPLES BLOCKED`: one JSON line.
    static func runChild(_ args: [String]) -> Int32 {
        guard args.count == 3, let a = Int(args[1]), let b = Int(args[2]), a > 0 else {
            eprint("usage: opqd-bench flow-run limiter|fair N KEYS | decide SAMPLES BLOCKED\n")
            return 2
        }
        let result: [String: Any]
        do {
            switch args[0] {
            case "limiter", "fair": result = try startsRun(args[0], n: a, keys: b)
            case "decide": result = try decideRun(samples: a, blocked: b)
            default:
                eprint("opqd-bench flow-run: unknown workload '\(args[0])'\n")
                return 2
            }
        } catch {
            eprint("opqd-bench flow-run \(args.joined(separator: " ")): engine error: \(error)\n")
            return 1
        }
        outLine(EngineBench.jsonLine(result))
        _exit(0)  // skip tearing down 100,000 operations
    }

    // MARK: - starts/s

    /// Starts/s of N `ImmediateKind` operations added to a suspended queue, from its resume
    /// until all have finished; adding them is timed apart.
    ///
    /// `limiter`: one limiter of concurrency 1 per key, the operations round-robin over KEYS
    /// keys, queue concurrency 1,000,000 (the keys are the only limit: all but one operation
    /// per key is parked at the resume, and each finish lets the next of its key go).
    /// `fair`: KEYS fairness keys, added tenant by tenant (N / KEYS each, so the fair order is
    /// not the order of ids), queue concurrency 2 as in the flat benchmark. KEYS 0: the same
    /// queue without limits or fairness keys (the reference).
    static func startsRun(_ workload: String, n: Int, keys: Int) throws(EngineError) -> [String: Any] {
        let counter = EngineBench.Counter()
        let engine = QueueEngine(kinds: [EngineBench.kindName: ImmediateKind()], store: InMemoryStore())
        // The fairness run notes the first starts (ids of operations that became executing)
        // to check the order: the same work in the reference, so both pay for it.
        let firstStarts = Mutex<[UInt64]>([])
        let watchStarts = workload == "fair"
        let firstWanted = max(keys, 1)
        _ = engine.observeAll { events in
            counter.value.add(events.count, ordering: .relaxed)
            guard watchStarts else { return }
            firstStarts.withLock { seen in
                guard seen.count < firstWanted else { return }
                for e in events where e.key == .isExecuting && e.new == .bool(true) && seen.count < firstWanted {
                    seen.append(e.operation.raw)
                }
            }
        }
        let limiter = "keys"
        var requests = [OperationRequest(kind: EngineBench.kindName)]
        if keys > 0 && workload == "limiter" {
            try engine.createLimiter(name: limiter, settings: LimiterSettings(concurrency: 1))
            requests = (0..<keys).map { k in
                OperationRequest(kind: EngineBench.kindName, options: OperationOptions(limits: [LimitRef(limiter: limiter, key: "k\(k)")]))
            }
        } else if keys > 0 {
            requests = (0..<keys).map { k in OperationRequest(kind: EngineBench.kindName, options: OperationOptions(fairnessKey: "t\(k)")) }
        }
        let concurrency = workload == "limiter" ? 1_000_000 : 2
        try engine.createQueue(name: queueName, maxConcurrentOperationCount: concurrency, isSuspended: true)
        var ids: [UInt64] = []
        ids.reserveCapacity(n)
        let r = requests.count
        let addStart = EngineBench.now()
        for i in 0..<n {
            // limiter: round-robin over the keys; fair: tenant by tenant.
            let request = workload == "limiter" ? requests[i % r] : requests[min(r - 1, i * r / n)]
            ids.append(try engine.addOperationID(to: queueName, request).raw)
        }
        let addSeconds = EngineBench.now() - addStart
        var problems: [String] = []
        if keys > 0 && workload == "limiter" {
            let l = try engine.limiter(named: limiter)
            if l.keys != keys || l.waiting != n { problems.append("before the resume: \(l.keys) keys, \(l.waiting) waiting; expected \(keys), \(n)") }
        }

        let done = DispatchSemaphore(value: 0)
        let start = EngineBench.now()
        try engine.resumeQueue(queueName)
        _ = try engine.onIdle(queueName) { _ in done.signal() }
        done.wait()
        let seconds = EngineBench.now() - start

        let expectedEvents = Int(engine.nextSequence) - 1
        let deadline = EngineBench.now() + 10
        while counter.value.load(ordering: .relaxed) < expectedEvents && EngineBench.now() < deadline { usleep(1000) }
        let finished = try engine.queue(named: queueName).counts[.finished] ?? 0
        if finished != n { problems.append("\(finished) of \(n) finished") }
        var out: [String: Any] = [
            "workload": workload, "ops": n, "keys": keys, "queue_concurrency": concurrency,
            "seconds": seconds, "starts_per_s": Double(n) / seconds, "add_seconds": addSeconds, "adds_per_s": Double(n) / addSeconds,
        ]
        if keys > 0 && workload == "limiter" {
            let l = try engine.limiter(named: limiter)
            if l.running != 0 || l.waiting != 0 { problems.append("after: limiter running \(l.running), waiting \(l.waiting)") }
            out["keys_left"] = l.keys
        }
        if watchStarts && keys > 0 {
            // Operation i belongs to tenant i * KEYS / N: the first KEYS starts should be KEYS tenants.
            var tenantOf: [UInt64: Int] = [:]
            for (i, id) in ids.enumerated() { tenantOf[id] = min(keys - 1, i * keys / n) }
            let first = firstStarts.withLock { $0 }
            let distinct = Set(first.compactMap { tenantOf[$0] }).count
            out["first_starts_distinct_keys"] = distinct
            if distinct < keys * 9 / 10 { problems.append("the first \(first.count) starts came from \(distinct) fairness keys of \(keys)") }
        }
        out["ok"] = problems.isEmpty
        if !problems.isEmpty { out["problem"] = problems.joined(separator: "; ") }
        return out
    }

    // MARK: - one start decision

    /// The cost of one start decision: a queue of concurrency 1 holding SAMPLES + 1 ready
    /// operations of a manual kind; the benchmark finishes the running one SAMPLES times and
    /// times each `finish` call, which (in one locked section and its effects) finishes it,
    /// picks and starts the next, and hands the changes to the observer.
    ///
    /// BLOCKED -1: no limits at all. BLOCKED >= 0: every operation names limiter `flow`
    /// (concurrency 1 per key) with key `free`, and BLOCKED older operations of the same queue
    /// wait parked on key `hot`, whose one slot an operation of another queue holds forever.
    /// Each decision should cost the same whatever BLOCKED is (API.md: blocked operations are
    /// never scanned).
    static func decideRun(samples: Int, blocked: Int) throws(EngineError) -> [String: Any] {
        let manual = ManualKind()
        let holder = ManualKind()
        let counter = EngineBench.Counter()
        let engine = QueueEngine(kinds: ["manual": manual, "hold": holder], store: InMemoryStore())
        _ = engine.observeAll { events in counter.value.add(events.count, ordering: .relaxed) }
        let limiter = "flow"
        var stream = OperationRequest(kind: "manual")
        if blocked >= 0 {
            try engine.createLimiter(name: limiter, settings: LimiterSettings(concurrency: 1))
            stream.options.limits = [LimitRef(limiter: limiter, key: "free")]
        }
        let hot = OperationRequest(kind: "manual", options: OperationOptions(limits: [LimitRef(limiter: limiter, key: "hot")]))
        if blocked > 0 {
            try engine.createQueue(name: "hold", maxConcurrentOperationCount: 1)
            try engine.addOperationID(to: "hold", OperationRequest(kind: "hold", options: hot.options))
        }
        try engine.createQueue(name: queueName, maxConcurrentOperationCount: 1, isSuspended: true)
        for _ in 0..<max(0, blocked) { try engine.addOperationID(to: queueName, hot) }
        for _ in 0...samples { try engine.addOperationID(to: queueName, stream) }

        // The resume parks the blocked operations (each once) and starts the first of the stream.
        let parkStart = EngineBench.now()
        try engine.resumeQueue(queueName)
        let parkSeconds = EngineBench.now() - parkStart

        var problems: [String] = []
        var times = [Double](repeating: 0, count: samples)
        for i in 0..<samples {
            guard let run = manual.take() else {
                problems.append("no running operation to finish at sample \(i)")
                break
            }
            let t0 = EngineBench.now()
            run.finish(.succeeded(.null))
            times[i] = EngineBench.now() - t0
        }
        let q = try engine.queue(named: queueName)
        if (q.counts[.finished] ?? 0) != samples || q.counts[.executing] != 1 {
            problems.append("finished \(q.counts[.finished] ?? 0) (expected \(samples)), executing \(q.counts[.executing] ?? 0) (expected 1)")
        }
        if (q.counts[.ready] ?? 0) != max(0, blocked) { problems.append("\(q.counts[.ready] ?? 0) ready, expected the \(max(0, blocked)) blocked") }
        if blocked > 0 && holder.count != 1 { problems.append("the operation holding key hot is not running") }
        times.sort()
        let mean = times.isEmpty ? 0 : times.reduce(0, +) / Double(times.count)
        var out: [String: Any] = [
            "samples": samples, "blocked": blocked, "park_seconds": parkSeconds,
            "p50_us": BenchSupport.percentile(times, 0.5) * 1e6, "p99_us": BenchSupport.percentile(times, 0.99) * 1e6,
            "p999_us": BenchSupport.percentile(times, 0.999) * 1e6, "mean_us": mean * 1e6, "max_us": (times.last ?? 0) * 1e6,
            "ok": problems.isEmpty,
        ]
        if !problems.isEmpty { out["problem"] = problems.joined(separator: "; ") }
        return out
    }
}
