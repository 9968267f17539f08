// `opqd-bench flow`'s run order and report: the table, then one JSON object as the last line.
import Foundation

extension FlowBench {
    static func report(quick: Bool, baseline: String?, rounds: Int, instructions: Bool, sizes: Sizes) -> Int32 {
        let me = selfPath
        let failures = Failures()
        typealias F = BenchSupport
        let machine = F.machineLine()

        // 1. The flat benchmark, no limits, in both binaries; A/B alternated round by round.
        let flatArgs = ["engine-run", "engine", "flat", String(sizes.flatN)]
        var afterFlat: [Double] = []
        var beforeFlat: [Double] = []
        for r in 0..<rounds {
            let order = r % 2 == 0 ? [baseline, me] : [me, baseline]
            for exe in order.compactMap({ $0 }) {
                let j = child(exe, flatArgs, failures)
                if exe == me { afterFlat.append(num(j["ops_per_s"])) } else { beforeFlat.append(num(j["ops_per_s"])) }
            }
        }
        let (method, methodNote) = instructions ? InstructionCount.detect() : (.unavailable, "not counted (--no-instructions)")
        var afterIPO = 0.0
        var beforeIPO = 0.0
        if case .unavailable = method {
        } else {
            let flat: (Int) -> [String] = { n in ["engine-run", "engine", "flat", String(n)] }
            afterIPO = perUnit(method, me, flat, sizes.countN, failures)
            if let baseline { beforeIPO = perUnit(method, baseline, flat, sizes.countN, failures) }
        }
        // Memory per queued operation (EngineBench's engine-mem child, in both binaries): time
        // can lose more than instructions do when each operation takes more cache lines.
        let memArgs = ["engine-mem", "engine"] + (quick ? ["--quick"] : [])
        let afterBytes = num(child(me, memArgs, failures)["bytes_per_op"])
        let beforeBytes = baseline.map { num(child($0, memArgs, failures)["bytes_per_op"]) } ?? 0

        // 2, 3. Starts/s, each beside the same queue without flow options.
        let n = sizes.flowN
        func starts(_ workload: String, _ keys: Int) -> (starts: Double, adds: Double, json: [String: Any]) {
            var s: [Double] = []
            var a: [Double] = []
            var last: [String: Any] = [:]
            for _ in 0..<rounds {
                last = child(me, ["flow-run", workload, String(n), String(keys)], failures)
                s.append(num(last["starts_per_s"]))
                a.append(num(last["adds_per_s"]))
            }
            return (median(s), median(a), last)
        }
        let limited = starts("limiter", 10_000)
        let limitedRef = starts("limiter", 0)
        let fair = starts("fair", 1_000)
        let fairRef = starts("fair", 0)

        // 4, 5. One start decision: no limits; then a limiter key with room beside 0 and B
        // operations blocked on another key.
        let decideCases = [-1, 0] + sizes.blocked
        // Round by round, the cases in turn, and the median of each figure: a burst of load
        // from elsewhere on the machine then moves one sample of a case, not the case.
        var decideRuns: [Int: [[String: Any]]] = [:]
        for _ in 0..<rounds {
            for b in decideCases { decideRuns[b, default: []].append(child(me, ["flow-run", "decide", String(sizes.samples), String(b)], failures)) }
        }
        var decide: [Int: [String: Any]] = [:]
        for (b, runs) in decideRuns {
            var m: [String: Any] = [:]
            for key in ["p50_us", "p99_us", "p999_us", "mean_us", "park_seconds"] { m[key] = median(runs.map { num($0[key]) }) }
            decide[b] = m
        }
        var decideIPD: [Int: Double] = [:]
        if case .unavailable = method {
        } else {
            for b in sizes.blocked {
                decideIPD[b] = perUnit(method, me, { s in ["flow-run", "decide", String(s), String(b)] }, sizes.decideCount, failures)
            }
        }

        // MARK: the table
        func g(_ v: Double) -> String { v > 0 ? F.grouped(v) : "-" }
        func r3(_ v: Double) -> String { v > 0 ? F.fmt(v, 3) : "-" }
        func row(_ cells: [String], _ widths: [Int]) -> String {
            zip(cells, widths).enumerated().map { i, cw in F.pad(cw.0, cw.1, right: i > 0) }.joined(separator: "  ")
        }
        print("opqd-bench flow\(quick ? " --quick" : ""): what flow control costs the engine")
        print("engine as in `opqd-bench engine`: ids, numbered events, one observeAll observer, InMemoryStore; every run in a fresh child process")
        print(machine)
        print("")
        print("1. engine flat benchmark, no limits configured (ImmediateKind, queue concurrency 2): before vs after flow control")
        print("   before: \(baseline ?? "(no --baseline-bin: scripts/bench-flow.sh builds one)")")
        print("   after:  \(me)")
        let w1 = [44, 12, 12, 12]
        print("   " + row(["", "before", "after", "after/before"], w1))
        let flatBefore = median(beforeFlat)
        let flatAfter = median(afterFlat)
        print(
            "   "
                + row(
                    ["ops/s (\(F.grouped(Double(sizes.flatN))) ops, median of \(rounds))", g(flatBefore), g(flatAfter), r3(ratio(flatAfter, flatBefore))], w1))
        let countLabel = "instructions/op (\(F.grouped(Double(sizes.countN.0))) − \(F.grouped(Double(sizes.countN.1))) ops)"
        print("   " + row([countLabel, g(beforeIPO), g(afterIPO), r3(ratio(afterIPO, beforeIPO))], w1))
        let memLabel = "bytes per queued op (RSS, \(quick ? "100,000" : "1,000,000") suspended)"
        print("   " + row([memLabel, g(beforeBytes), g(afterBytes), r3(ratio(afterBytes, beforeBytes))], w1))
        print("   instructions counted with: \(methodNote)")
        let slower = ratio(afterIPO, beforeIPO)
        if slower > 0 {
            print(
                "   target: after at most 5% more instructions per op than before -> \(slower <= 1.05 ? "met" : "NOT MET") (\(F.fmt((slower - 1) * 100, 1))%)")
        }
        print("")
        print("2, 3. starts/s: \(F.grouped(Double(n))) ImmediateKind ops added to a suspended queue, then resume -> all finished (median of \(rounds))")
        let w2 = [58, 11, 11, 14]
        print("   " + row(["workload", "adds/s", "starts/s", "vs no flow"], w2))
        print(
            "   "
                + row(
                    [
                        "1 limiter, 10,000 keys, concurrency 1 per key, round-robin", g(limited.adds), g(limited.starts),
                        r3(ratio(limited.starts, limitedRef.starts)),
                    ],
                    w2))
        print("   " + row(["  same queue (concurrency 1,000,000), no limits", g(limitedRef.adds), g(limitedRef.starts), ""], w2))
        print(
            "   " + row(["1,000 fairness keys, added key by key (concurrency 2)", g(fair.adds), g(fair.starts), r3(ratio(fair.starts, fairRef.starts))], w2))
        print("   " + row(["  same queue, no fairness keys", g(fairRef.adds), g(fairRef.starts), ""], w2))
        print("   fairness order: the first 1,000 starts came from \(Int(num(fair.json["first_starts_distinct_keys"]))) distinct fairness keys")
        print("")
        print("4, 5. one start decision: time of one finish call that finishes the running op and starts the next")
        print("      (queue concurrency 1, a manual kind, \(F.grouped(Double(sizes.samples))) samples; lock, decision, events, observer, kind start;")
        print("      median over \(rounds) runs of each case)")
        let w3 = [58, 9, 9, 9, 9, 16]
        print("   " + row(["case", "p50 µs", "p99 µs", "p99.9 µs", "mean µs", "instructions"], w3))
        for b in decideCases {
            let j = decide[b] ?? [:]
            let name: String
            switch b {
            case -1: name = "no limits"
            case 0: name = "limiter key with room, nothing blocked"
            default: name = "same, \(F.grouped(Double(b))) blocked (parked) on another key"
            }
            print(
                "   "
                    + row(
                        [
                            name, F.fmt(num(j["p50_us"]), 2), F.fmt(num(j["p99_us"]), 2), F.fmt(num(j["p999_us"]), 2), F.fmt(num(j["mean_us"]), 2),
                            decideIPD[b].map { g($0) } ?? "",
                        ], w3))
        }
        let lo = sizes.blocked.first ?? 0
        let hi = sizes.blocked.last ?? 0
        let dLo = decide[lo] ?? [:]
        let dHi = decide[hi] ?? [:]
        let p50Ratio = ratio(num(dHi["p50_us"]), num(dLo["p50_us"]))
        let p99Ratio = ratio(num(dHi["p99_us"]), num(dLo["p99_us"]))
        let ipdRatio = ratio(decideIPD[hi] ?? 0, decideIPD[lo] ?? 0)
        print(
            "   \(F.grouped(Double(hi))) blocked vs \(F.grouped(Double(lo))): p50 x\(F.fmt(p50Ratio, 3)), p99 x\(F.fmt(p99Ratio, 3))"
                + (ipdRatio > 0 ? ", instructions x\(F.fmt(ipdRatio, 3))" : "") + " (~1: the cost does not grow with blocked operations)")
        print(
            "   parking them at the resume: \(F.fmt(num(dLo["park_seconds"]) * 1000, 1)) ms for \(F.grouped(Double(lo))), \(F.fmt(num(dHi["park_seconds"]) * 1000, 1)) ms for \(F.grouped(Double(hi)))"
        )
        if !decideIPD.isEmpty {
            print("   instructions: per decision, \(F.grouped(Double(sizes.decideCount.0))) − \(F.grouped(Double(sizes.decideCount.1))) samples, \(methodNote)")
        }
        for f in failures.list { print("FAIL: \(f)") }

        var decideJSON: [(String, Any)] = []
        for b in decideCases {
            let j = decide[b] ?? [:]
            let key = b < 0 ? "nolimits" : "blocked_\(b)"
            decideJSON.append(("decide_\(key)_p50_us", F.round3(num(j["p50_us"]))))
            decideJSON.append(("decide_\(key)_p99_us", F.round3(num(j["p99_us"]))))
            if let i = decideIPD[b] { decideJSON.append(("decide_\(key)_instructions", i.rounded())) }
        }
        let pairs: [(String, Any)] =
            [
                ("quick", quick), ("rounds", rounds), ("baseline", baseline ?? NSNull()),
                ("flat_ops", sizes.flatN), ("flat_before_ops_per_s", flatBefore.rounded()), ("flat_after_ops_per_s", flatAfter.rounded()),
                ("flat_ops_per_s_ratio", F.round3(ratio(flatAfter, flatBefore))),
                ("flat_before_bytes_per_op", beforeBytes.rounded()), ("flat_after_bytes_per_op", afterBytes.rounded()),
                ("instructions_method", methodNote), ("flat_before_instructions_per_op", beforeIPO.rounded()),
                ("flat_after_instructions_per_op", afterIPO.rounded()), ("flat_instructions_ratio", F.round3(slower)),
                ("starts_ops", n), ("limiter_keys", 10_000), ("limiter_starts_per_s", limited.starts.rounded()),
                ("limiter_ref_starts_per_s", limitedRef.starts.rounded()), ("limiter_adds_per_s", limited.adds.rounded()),
                ("fairness_keys", 1_000), ("fair_starts_per_s", fair.starts.rounded()), ("fair_ref_starts_per_s", fairRef.starts.rounded()),
                ("fair_first_starts_distinct_keys", Int(num(fair.json["first_starts_distinct_keys"]))),
                ("decide_samples", sizes.samples),
            ] + decideJSON + [
                ("blocked_ratio_p50", F.round3(p50Ratio)), ("blocked_ratio_p99", F.round3(p99Ratio)), ("blocked_ratio_instructions", F.round3(ipdRatio)),
                // A string: BenchSupport.jsonLine writes an empty array as {}.
                ("failures", failures.list.joined(separator: "; ")), ("ok", failures.list.isEmpty),
            ]
        print(F.jsonLine(pairs))
        return failures.list.isEmpty ? 0 : 1
    }
}
