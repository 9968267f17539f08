import Foundation

/// `opqd-bench flow`: what flow control (API.md "Flow control") costs the engine, run as
/// EngineBench runs it (ids, numbered events, one observeAll observer, the in-memory store),
/// every measurement in a fresh child process:
///
/// 1. the engine flat benchmark with no limits configured, in this binary and in a baseline
///    built without flow control (`--baseline-bin`; scripts/bench-flow.sh builds one): ops/s,
///    instructions per operation and bytes per queued operation;
/// 2. starts/s with one limiter of 10,000 keys (concurrency 1 per key) and 100,000 operations;
/// 3. starts/s with 1,000 fairness keys in one queue;
/// 4. one start decision at p50 and p99;
/// 5. the same with 10,000 and with 100,000 operations blocked on a key with no room.
enum FlowBench {
    static let usage = "usage: opqd-bench flow [--baseline-bin PATH] [--rounds N] [--no-instructions] [--quick]"

    struct Sizes {
        var flatN: Int
        /// The two sizes whose instruction counts are subtracted (start-up cancels out).
        var countN: (Int, Int)
        var flowN: Int
        var samples: Int
        var decideCount: (Int, Int)
        var blocked: [Int]
    }

    static func main(_ args: [String]) -> Int32 {
        var quick = false
        var baseline: String?
        var rounds: Int?
        var instructions = true
        var i = 0
        while i < args.count {
            switch args[i] {
            case "--quick": quick = true
            case "--no-instructions": instructions = false
            case "--baseline-bin" where i + 1 < args.count:
                baseline = args[i + 1]
                i += 1
            case "--rounds" where i + 1 < args.count:
                rounds = Int(args[i + 1])
                i += 1
            default:
                eprint("opqd-bench flow: unknown option '\(args[i])'\n\(usage)\n")
                return 2
            }
            i += 1
        }
        if let b = baseline, access(b, X_OK) != 0 {
            eprint("opqd-bench flow: --baseline-bin \(b) is not an executable\n")
            return 2
        }
        let rounds_ = max(1, rounds ?? (quick ? 1 : 3))
        let sizes =
            quick
            // Under 30 s: callgrind runs ~50x slower, so --quick counts fewer operations, and its
            // blocked cases are 1,000 and 10,000 (still 10x apart) so that their set-up is cheap.
            ? Sizes(flatN: 100_000, countN: (10_000, 2_000), flowN: 100_000, samples: 20_000, decideCount: (5_000, 1_000), blocked: [1_000, 10_000])
            : Sizes(
                flatN: 1_000_000, countN: (50_000, 10_000), flowN: 100_000, samples: 100_000, decideCount: (40_000, 10_000),
                blocked: [10_000, 100_000])
        return report(quick: quick, baseline: baseline, rounds: rounds_, instructions: instructions, sizes: sizes)
    }

    // MARK: - children

    final class Failures {
        var list: [String] = []
    }

    /// Runs `exe args` and parses its last line; a failed child or a check it reports failed
    /// is noted in `failures`.
    static func child(_ exe: String, _ args: [String], _ failures: Failures) -> [String: Any] {
        eprint("running \(exe == selfPath ? "" : "baseline ")\(args.joined(separator: " "))...\n")
        let run: (exitCode: Int32?, output: [UInt8])
        do { run = try ChildProcess.capture(exe, args, stderr: .inherit) } catch {
            failures.list.append("cannot run \(exe): \(error)")
            return [:]
        }
        guard run.exitCode == 0, let j = InstructionCount.lastJSON(run.output) else {
            failures.list.append("\(exe) \(args.joined(separator: " ")) failed (status \(run.exitCode.map(String.init) ?? "signal"))")
            return [:]
        }
        if let ok = j["ok"] as? Bool, !ok { failures.list.append("\(args.joined(separator: " ")): \(j["problem"] ?? "check failed")") }
        return j
    }

    static var selfPath: String { URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path }

    static func median(_ v: [Double]) -> Double {
        let s = v.sorted()
        guard !s.isEmpty else { return 0 }
        return s.count % 2 == 1 ? s[s.count / 2] : (s[s.count / 2 - 1] + s[s.count / 2]) / 2
    }

    static func num(_ v: Any?) -> Double { EngineBench.num(v) }
    static func ratio(_ a: Double, _ b: Double) -> Double { b > 0 ? a / b : 0 }

    /// Instructions per unit of work: the count at `sizes.0` less the count at `sizes.1`,
    /// divided by the difference, so the process's start-up and end cancel out.
    static func perUnit(_ method: InstructionCount.Method, _ exe: String, _ args: (Int) -> [String], _ sizes: (Int, Int), _ failures: Failures) -> Double {
        var counts: [Double] = []
        for n in [sizes.0, sizes.1] {
            eprint("counting instructions: \(exe == selfPath ? "" : "baseline ")\(args(n).joined(separator: " "))...\n")
            guard let c = InstructionCount.count(method, exe, args(n)) else {
                failures.list.append("instruction count of \(exe) \(args(n).joined(separator: " ")) failed")
                return 0
            }
            if let ok = c.json["ok"] as? Bool, !ok { failures.list.append("\(args(n).joined(separator: " ")): \(c.json["problem"] ?? "check failed")") }
            counts.append(c.count)
        }
        return (counts[0] - counts[1]) / Double(sizes.0 - sizes.1)
    }
}
