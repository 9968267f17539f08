import Dispatch
import Foundation
import Locking
import QueueEngine
import Schedules

// opqd-bench schedules: 10,000 schedules in one engine (API.md "Schedules", issue 27).
//
//   1. Memory per schedule: RSS growth of 10,000 schedules that are not due (a fresh child).
//   2. CPU while nothing is due: the process's CPU over a window with them all waiting.
//   3. Lag: every schedule fires every 10 s for 60 s (all at the same instants, the worst case);
//      lag = the run's creation time minus its nominal time, at p50, p99 and max.
#if canImport(Glibc)
import Glibc
#endif

enum SchedulesBench {
    static func main(_ args: [String]) -> Int32 {
        let quick = args.contains("--quick")
        var n = 10_000
        if let i = args.firstIndex(of: "--schedules"), i + 1 < args.count, let v = Int(args[i + 1]), v > 0 { n = v }
        let seconds = quick ? 20.0 : 60.0
        let idle = quick ? 3.0 : 10.0
        print(BenchSupport.machineLine())
        print("opqd-bench schedules: \(n) schedules, each every 10 s for \(Int(seconds)) s; idle CPU over \(Int(idle)) s; memory per schedule")
        var failures: [String] = []
        let mem = EngineBench.runSelf(["schedules-mem", String(n)])
        let bytes = EngineBench.num(mem?["bytes_per_schedule"])

        // 2. Nothing due for an hour: CPU over the window.
        let waiting = QueueEngine(kinds: ["immediate": ImmediateKind()], store: InMemoryStore())
        do {
            try waiting.createQueue(name: "q", maxConcurrentOperationCount: 100)
            for i in 0..<n {
                try waiting.createSchedule(in: "q", ScheduleSpec(name: "w\(i)", rule: .every(3600), template: OperationRequest(kind: "immediate")))
            }
        } catch {
            eprint("schedules: \(error)\n")
            return 1
        }
        let cpu0 = HostsBench.processCPU()
        Thread.sleep(forTimeInterval: idle)
        let cpuIdle = HostsBench.processCPU() - cpu0

        // 3. Every 10 s, all at once.
        var c = EngineConfiguration()
        c.maxSchedules = n
        let engine = QueueEngine(kinds: ["immediate": ImmediateKind()], store: InMemoryStore(), configuration: c)
        let start = SystemClock().now().adding(seconds: 2)
        let aligned = Timestamp(nanoseconds: (start.nanoseconds / 1_000_000_000 + 1) * 1_000_000_000)
        do {
            try engine.createQueue(name: "q", maxConcurrentOperationCount: 1000)
            for i in 0..<n {
                try engine.createSchedule(
                    in: "q", ScheduleSpec(name: "s\(i)", rule: .every(10), template: OperationRequest(kind: "immediate"), overlap: .allow, startAt: aligned))
            }
        } catch {
            eprint("schedules: \(error)\n")
            return 1
        }
        // A run is there once its creation is reported (after the locked section that made it):
        // lag = the wall time of that report minus the nominal time (a multiple of 10 s from
        // the aligned start).
        let seen = Lock<[Double]>([])
        let token = engine.observeAll { events in
            let now = SystemClock().now().nanoseconds
            var out: [Double] = []
            for e in events where e.key == .isReady && e.old == .none {
                let k = (e.time.nanoseconds - aligned.nanoseconds) / 10_000_000_000
                out.append(Double(now - (aligned.nanoseconds + k * 10_000_000_000)) / 1e9)
            }
            seen.withLock { $0.append(contentsOf: out) }
        }
        let end = aligned.adding(seconds: seconds + 0.5)
        while SystemClock().now() < end { Thread.sleep(forTimeInterval: 0.2) }
        withExtendedLifetime(token) {}
        var lags = seen.value
        lags.sort()
        let expected = n * Int(seconds / 10)
        if lags.count < expected { failures.append("\(lags.count) runs of \(expected) expected") }
        func p(_ q: Double) -> Double { lags.isEmpty ? .nan : lags[min(lags.count - 1, Int(Double(lags.count) * q))] }
        let p99 = p(0.99)
        if p99 > 0.1 { failures.append("p99 lag \(p99) s is over the 100 ms target") }
        print("")
        print("memory: \(HostsBench.fmt(bytes, 0)) B per schedule (RSS growth of \(n), a fresh process)")
        print(
            "idle: \(HostsBench.fmt(cpuIdle, 3)) s of CPU over \(HostsBench.fmt(idle, 0)) s with \(n) schedules waiting (\(HostsBench.fmt(100 * cpuIdle / idle, 2)) % of one core)"
        )
        print(
            "lag from nominal time to created, \(lags.count) runs: p50 \(HostsBench.fmt(p(0.5) * 1000, 1)) ms, p99 \(HostsBench.fmt(p99 * 1000, 1)) ms, max \(HostsBench.fmt((lags.last ?? .nan) * 1000, 1)) ms (target p99 < 100 ms)"
        )
        outLine(
            BenchSupport.jsonLine([
                ("schedules", n), ("bytes_per_schedule", BenchSupport.round3(bytes)), ("idle_cpu_seconds", BenchSupport.round3(cpuIdle)),
                ("idle_seconds", idle), ("runs", lags.count), ("lag_p50_ms", BenchSupport.round3(p(0.5) * 1000)),
                ("lag_p99_ms", BenchSupport.round3(p99 * 1000)), ("lag_max_ms", BenchSupport.round3((lags.last ?? 0) * 1000)),
                ("failures", failures.joined(separator: "; ")), ("ok", failures.isEmpty),
            ]))
        withExtendedLifetime((waiting, engine)) {}
        return failures.isEmpty ? 0 : 1
    }

    /// `schedules-mem N`: RSS growth per schedule; one JSON line.
    static func memChild(_ args: [String]) -> Int32 {
        guard let n = args.first.flatMap(Int.init), n > 0 else { return 2 }
        _ = DispatchQueue.global()
        var c = EngineConfiguration()
        c.maxSchedules = n + 1
        let engine = QueueEngine(kinds: ["immediate": ImmediateKind()], store: InMemoryStore(), configuration: c)
        do {
            try engine.createQueue(name: "q", maxConcurrentOperationCount: 1)
            try engine.createSchedule(in: "q", ScheduleSpec(name: "first", rule: .every(3600), template: OperationRequest(kind: "immediate")))
            let before = EngineBench.memoryStatus()
            for i in 0..<n {
                try engine.createSchedule(in: "q", ScheduleSpec(name: "s\(i)", rule: .every(3600), template: OperationRequest(kind: "immediate")))
            }
            let after = EngineBench.memoryStatus()
            outLine(BenchSupport.jsonLine([("schedules", n), ("bytes_per_schedule", Double(after.rss - before.rss) / Double(n))]))
        } catch {
            eprint("schedules-mem: \(error)\n")
            return 1
        }
        withExtendedLifetime(engine) {}
        _exit(0)
    }
}
