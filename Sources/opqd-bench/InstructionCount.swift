// Instructions a child process retires, for comparisons that wall-clock time on a shared
// 2-core machine cannot settle: `perf stat` when the kernel exposes hardware counters, else
// valgrind's callgrind (every instruction is counted in software, about 50x slower).
import Foundation

#if canImport(Glibc)
import Glibc
#endif

enum InstructionCount {
    enum Method {
        case perf(String)
        case callgrind(String)
        case unavailable
    }

    /// The method this machine allows, and why it is that one (for the report).
    static func detect() -> (method: Method, note: String) {
        var why = "perf not installed"
        if let perf = which("perf") {
            if let n = perfCount(perf, ["/bin/true"]).count, n > 0 {
                return (.perf(perf), "perf stat -e instructions:u, SWIFT_DETERMINISTIC_HASHING=1")
            }
            why = "perf cannot read hardware counters here (instructions: <not supported>)"
        }
        if let valgrind = which("valgrind") {
            return (.callgrind(valgrind), "valgrind --tool=callgrind, SWIFT_DETERMINISTIC_HASHING=1 (\(why))")
        }
        return (.unavailable, "no instruction counts: \(why), and no valgrind")
    }

    /// Runs `exe args` under `method` and returns the instructions it retired (user space)
    /// and the JSON object its last line of output holds.
    /// The child hashes with a fixed seed (SWIFT_DETERMINISTIC_HASHING): with a random seed per
    /// process, the collisions of small String-keyed dictionaries differ from run to run, and
    /// moved the count of one start decision by 3% between two runs of the same work.
    static func count(_ method: Method, _ exe: String, _ args: [String]) -> (count: Double, json: [String: Any])? {
        setenv("SWIFT_DETERMINISTIC_HASHING", "1", 1)
        defer { unsetenv("SWIFT_DETERMINISTIC_HASHING") }
        switch method {
        case let .perf(perf):
            let r = perfCount(perf, [exe] + args)
            guard let n = r.count, let json = r.json else { return nil }
            return (n, json)
        case let .callgrind(valgrind):
            let dir = BenchSupport.makeTempDir("opqd-bench-callgrind")
            defer { BenchSupport.removeTree(dir) }
            let out = dir + "/callgrind.out"
            let log = dir + "/stderr"
            let argv = ["-q", "--tool=callgrind", "--callgrind-out-file=" + out, exe] + args
            // Valgrind's notes (DWARF forms it does not know) go to a file, shown only on failure.
            guard let run = try? ChildProcess.capture(valgrind, argv, stderr: .file(log, append: false)), run.exitCode == 0,
                let json = lastJSON(run.output),
                let text = try? String(contentsOfFile: out, encoding: .utf8)
            else {
                eprint((try? String(contentsOfFile: log, encoding: .utf8)) ?? "")
                return nil
            }
            // "summary: N" (or "totals: N") holds the whole run's Ir, every thread included.
            for line in text.split(separator: "\n") where line.hasPrefix("summary:") || line.hasPrefix("totals:") {
                if let n = Double(line.split(separator: " ").dropFirst().first ?? "") { return (n, json) }
            }
            return nil
        case .unavailable:
            return nil
        }
    }

    private static func perfCount(_ perf: String, _ argv: [String]) -> (count: Double?, json: [String: Any]?) {
        let dir = BenchSupport.makeTempDir("opqd-bench-perf")
        defer { BenchSupport.removeTree(dir) }
        let out = dir + "/perf.csv"
        guard let run = try? ChildProcess.capture(perf, ["stat", "-x", ",", "-o", out, "-e", "instructions:u", "--"] + argv, stderr: .inherit),
            run.exitCode == 0, let text = try? String(contentsOfFile: out, encoding: .utf8)
        else { return (nil, nil) }
        // CSV: value,unit,event,...; the value is "<not supported>" without a PMU.
        for line in text.split(separator: "\n") where line.contains("instructions") {
            if let n = Double(line.split(separator: ",", omittingEmptySubsequences: false).first ?? "") {
                return (n, lastJSON(run.output))
            }
        }
        return (nil, nil)
    }

    /// The last line of `output`, parsed as a JSON object.
    static func lastJSON(_ output: [UInt8]) -> [String: Any]? {
        let text = String(decoding: output, as: UTF8.self)
        guard let line = text.split(separator: "\n").last else { return nil }
        return BenchSupport.parseJSON(Array(line.utf8))
    }

    /// `name` looked up in PATH.
    static func which(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for dir in path.split(separator: ":") {
            let p = "\(dir)/\(name)"
            if access(p, X_OK) == 0 { return p }
        }
        return nil
    }
}
